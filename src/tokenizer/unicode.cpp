// UTF-8 decoding and repair, Unicode character classes (with the Unicode 16
// members that PCRE2 and utf8proc lack), the byte-level alphabet, Oniguruma
// to PCRE2 pattern rewriting, and normalization.
#include "unicode.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <new>

#include "anvil/core/error.h"

namespace anvil::tokenizer::detail {

// ---------------------------------------------------------------- UTF-8

namespace {

// Length of the well-formed UTF-8 sequence at s[i]; 0 when ill-formed, with
// *bad the length of its maximal invalid subpart: what one U+FFFD replaces in
// Rust's from_utf8_lossy (HF's decode) and Python's errors="replace".
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) break;
    lo = 0x80, hi = 0xBF;
  }
  if (k == n) return n;
  *bad = k;
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence(s, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence(s, i, &bad);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

char32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return next_code_point(s, i);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// ---------------------------------------------------------------- Unicode classes

namespace {

struct CodeRange {
  char32_t first, last;
};

// HF's regex engine (Oniguruma) and Rust know Unicode 16; Debian's PCRE2 10.42
// knows Unicode 14 and utf8proc 2.8 Unicode 15. These are the letters (L) and
// numbers (N) of Unicode 16 that PCRE2 10.42 lacks, measured by matching every
// code point with tokenizers 0.23.3 and with PCRE2.
constexpr CodeRange kNewerLetters[] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x105C0, 0x105F3}, {0x10D4A, 0x10D65},
    {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240}, {0x11380, 0x11389}, {0x1138B, 0x1138B},
    {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3},
    {0x11BC0, 0x11BE0}, {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F},
    {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF},
    {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB},
    {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF}};
constexpr CodeRange kNewerNumbers[] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59},
                                       {0x16130, 0x16139}, {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3},
                                       {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}};
// Unicode White_Space: \s in Oniguruma and in Rust's regex (PCRE2 10.42 also
// counts U+180E).
constexpr CodeRange kWhiteSpace[] = {{0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                                     {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                     {0x205F, 0x205F}, {0x3000, 0x3000}};
// Other_Alphabetic symbols (circled and squared Latin letters) that Rust's \w
// counts and a general-category test does not.
constexpr CodeRange kAlphabeticSymbols[] = {
    {0x24B6, 0x24E9}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189}};

template <size_t N>
bool in_ranges(char32_t c, const CodeRange (&ranges)[N]) {
  for (const auto& r : ranges)
    if (c >= r.first && c <= r.last) return true;
  return false;
}

}  // namespace

bool is_white_space(char32_t c) { return in_ranges(c, kWhiteSpace); }

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO ||
         in_ranges(c, kNewerNumbers);
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    case UTF8PROC_CATEGORY_CN:  // unassigned before Unicode 16, whose new numbers are all decimal digits
      return in_ranges(c, kNewerLetters) || in_ranges(c, kNewerNumbers);
    default:
      return c == 0x200C || c == 0x200D || in_ranges(c, kAlphabeticSymbols);
  }
}

// ---------------------------------------------------------------- byte-level alphabet

ByteAlphabet::ByteAlphabet() {
  byte_of_.fill(-1);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t c = printable ? static_cast<char32_t>(b) : next++;
    byte_of_[c] = static_cast<int16_t>(b);
    append_utf8(utf8_[b], c);
  }
}

bool ByteAlphabet::to_bytes(std::string_view s, std::string& out) const {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_code_point(s, i);
    if (c >= byte_of_.size() || byte_of_[c] < 0) return false;
    out += static_cast<char>(byte_of_[c]);
  }
  return true;
}

std::string ByteAlphabet::to_chars(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) out += utf8_[static_cast<unsigned char>(b)];
  return out;
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// ---------------------------------------------------------------- regular expressions

namespace {

std::string class_ranges(const CodeRange* begin, const CodeRange* end) {
  std::string out;
  char buf[40];
  for (auto r = begin; r != end; ++r) {
    std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(r->first), static_cast<unsigned>(r->last));
    out += buf;
  }
  return out;
}

// Rewrites an Oniguruma (Ruby syntax) pattern as HF compiles it into PCRE2
// with the same meaning: \p{L}, \p{N} and \s get Unicode 16's members, \h is
// Ruby's hex digit, \uHHHH becomes \x{HHHH}.
std::string onig_to_pcre2(std::string_view p) {
  static const std::string letters = class_ranges(std::begin(kNewerLetters), std::end(kNewerLetters));
  static const std::string numbers = class_ranges(std::begin(kNewerNumbers), std::end(kNewerNumbers));
  static const std::string space = class_ranges(std::begin(kWhiteSpace), std::end(kWhiteSpace));
  static const std::string hex = "0-9a-fA-F";
  std::string out;
  bool in_class = false;
  const auto set = [&](const std::string& members, bool negated) {
    out += in_class ? members : concat(negated ? "[^" : "[", members, "]");
  };
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if ((e == 'p' || e == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
        const auto close = p.find('}', i + 3);
        const auto name = close == std::string_view::npos ? std::string_view() : p.substr(i + 3, close - i - 3);
        const std::string* extra = name == "L" ? &letters : name == "N" ? &numbers : nullptr;
        if (extra && !(e == 'P' && in_class)) {  // a negated property inside a class cannot take ranges
          set(concat("\\p{", name, "}", *extra), e == 'P');
          i = close;
          continue;
        }
      } else if (e == 's' || (e == 'S' && !in_class)) {
        set(space, e == 'S');
        ++i;
        continue;
      } else if (e == 'h' || (e == 'H' && !in_class)) {
        set(hex, e == 'H');
        ++i;
        continue;
      } else if (e == 'u' && i + 5 < p.size() &&
                 std::all_of(p.begin() + i + 2, p.begin() + i + 6, [](char h) { return std::isxdigit(h); })) {
        out += concat("\\x{", p.substr(i + 2, 4), "}");
        i += 5;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
        const auto close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out += p.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
      } else if (c == ']') {
        in_class = false;
      }
    } else if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    out += c;
  }
  return out;
}

// Per-thread PCRE2 match state: patterns are shared, match data is not.
struct MatchState {
  MatchState()
      : data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        stack(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (!data || !context || !stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

}  // namespace

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view onig_pattern, const std::string& where) {
  const auto pattern = onig_to_pcre2(onig_pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // Ruby syntax, which HF's Oniguruma uses: ^ and $ match at line breaks.
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(concat(where, ": cannot compile regex \"", onig_pattern, "\": ", reinterpret_cast<char*>(msg)));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view s, size_t from, size_t* begin, size_t* end) const {
  thread_local MatchState state;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), from, 0, state.data, state.context)
                      : pcre2_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK, state.data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    throw Error(concat("tokenizer regex match failed: ", reinterpret_cast<char*>(msg)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

// ---------------------------------------------------------------- normalizer

bool Normalizer::apply(std::string_view s, std::string& out) const {
  if (forms_.empty()) return false;
  const bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) return false;  // ASCII is invariant under all four
  // Below U+0300 nothing composes or decomposes canonically: NFC leaves it.
  const bool below_combining =
      std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  bool changed = false;
  for (const auto& f : forms_) {
    if (f.nfc && below_combining && !changed) continue;
    const std::string_view in = changed ? std::string_view(out) : s;
    utf8proc_uint8_t* dst = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                                static_cast<utf8proc_ssize_t>(in.size()), &dst, f.options);
    if (n < 0) throw Error(concat("unicode normalization failed: ", utf8proc_errmsg(n)));
    std::string result(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    out = std::move(result);
    changed = true;
  }
  return changed;
}

}  // namespace anvil::tokenizer::detail
