// jinja2's lexer (jinja2/lexer.py) as transformers configures it:
// trim_blocks (a block or comment tag eats the newline after it),
// lstrip_blocks (spaces and tabs before a block or comment tag at the start
// of a line are dropped), `-` and `+` whitespace control, newlines
// normalized to "\n" and one trailing newline of the source dropped.

#include <utf8proc.h>

#include <algorithm>
#include <cstdio>

#include "jinja/jinja.h"

namespace anvil::jinja {

std::string located(Pos p, const std::string& what) {
  return concat("chat_template line ", p.line, ", column ", p.col, ": ", what);
}

namespace {

// "\r\n" and "\r" become "\n"; one trailing newline goes (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& src) {
  std::string s;
  s.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      s += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      s += src[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : s_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t i = 0;
    while (i < s_.size()) {
      const size_t p = find_tag(i);
      if (p == std::string::npos) {
        emit_text(s_.substr(i), i);
        break;
      }
      const char kind = s_[p + 1];
      size_t q = p + 2;
      const char mod = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q] : 0;
      if (mod) ++q;
      emit_text(strip_before(s_.substr(i, p - i), kind, mod), i);
      i = kind == '#' ? comment(p, q) : tag(kind, p, q);
    }
    Token eof{Token::Type::eof, "", 0, 0, pos(s_.size())};
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  // Tokens come in order, so the column is counted on from the last one's
  // (counting from the line's start each time is quadratic on a long line).
  Pos pos(size_t i) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), i) - 1;
    const size_t start = *it;
    const int line = static_cast<int>(it - line_starts_.begin()) + 1;
    const bool on = line == last_pos_.line && i >= last_byte_;
    const size_t from = on ? last_byte_ : start;
    const int64_t col = (on ? last_pos_.col : 1) + code_points(std::string_view(s_).substr(from, i - from));
    last_byte_ = i;
    last_pos_ = {line, static_cast<int>(col)};
    return last_pos_;
  }
  [[noreturn]] void fail(size_t i, const std::string& what) const { throw SyntaxError(located(pos(i), what)); }

  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1))
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  size_t skip_space(size_t i) const {
    while (i < s_.size()) {
      const auto b = static_cast<unsigned char>(s_[i]);
      const size_t n = utf8_len(i);
      if (!is_py_space(b < 0x80 ? b : decode_utf8(std::string_view(s_).substr(i, n))[0])) break;
      i += n;
    }
    return i;
  }

  // The text before a tag, with `-` (strip all whitespace) or lstrip_blocks applied.
  std::string strip_before(std::string text, char kind, char mod) const {
    if (mod == '-') return py_strip(text, nullptr, false, true);
    if (mod == '+' || kind == '{') return text;
    const auto nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (!(l_pos > 0 || line_starting_) || l_pos >= text.size()) return text;
    for (char32_t c : decode_utf8(std::string_view(text).substr(l_pos)))
      if (!is_py_space(c)) return text;
    text.resize(l_pos);
    return text;
  }

  void emit_text(std::string text, size_t at) {
    if (text.empty()) return;
    Token t{Token::Type::text, std::move(text), 0, 0, pos(at)};
    out_.push_back(std::move(t));
  }

  // After an end tag: `-` strips all whitespace, a plain block or comment end
  // one newline (trim_blocks). Returns where the text goes on.
  size_t after_end(size_t end, char mod, bool block) {
    size_t i = end;
    if (mod == '-') {
      i = skip_space(end);
    } else if (mod != '+' && block && i < s_.size() && s_[i] == '\n') {
      ++i;
    }
    line_starting_ = i > end && s_[i - 1] == '\n';
    return i;
  }

  size_t comment(size_t p, size_t q) {
    const auto e = s_.find("#}", q);
    if (e == std::string::npos) fail(p, "missing end of comment tag '#}'");
    const char mod = e > q && (s_[e - 1] == '-' || s_[e - 1] == '+') ? s_[e - 1] : 0;
    return after_end(e + 2, mod, true);
  }

  size_t tag(char kind, size_t p, size_t q) {
    const bool block = kind == '%';
    out_.push_back({block ? Token::Type::block_begin : Token::Type::var_begin, "", 0, 0, pos(p)});
    std::string brackets;
    size_t i = q;
    while (true) {
      if (i >= s_.size())
        fail(p, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (brackets.empty()) {
        if (const auto end = end_tag(i, block)) {
          out_.push_back({block ? Token::Type::block_end : Token::Type::var_end, "", 0, 0, pos(i)});
          return after_end(end, s_[i] == '-' || s_[i] == '+' ? s_[i] : 0, block);
        }
      }
      const size_t k = skip_space(i);
      if (k != i) {
        i = k;
        continue;
      }
      i = token(i, brackets);
    }
  }

  // The end of `%}` / `}}` (with its `-` or `+`) at i, or 0.
  size_t end_tag(size_t i, bool block) const {
    const std::string_view rest = std::string_view(s_).substr(i);
    const std::string close = block ? "%}" : "}}";
    if (rest.substr(0, 2) == close) return i + 2;
    if (rest.size() >= 3 && rest.substr(1, 2) == close && (rest[0] == '-' || (block && rest[0] == '+'))) return i + 3;
    return 0;
  }

  size_t utf8_len(size_t i) const {
    const auto b = static_cast<unsigned char>(s_[i]);
    return std::min(s_.size() - i, static_cast<size_t>(b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4));
  }

  // Python identifiers (str.isidentifier): letters and _ first, then digits and marks too.
  bool identifier_char(size_t i, bool first) const {
    const auto b = static_cast<unsigned char>(s_[i]);
    if (b < 0x80) return std::isalpha(b) || b == '_' || (!first && std::isdigit(b));
    const char32_t c = decode_utf8(s_.substr(i, utf8_len(i)))[0];
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool letter = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || cat == UTF8PROC_CATEGORY_NL;
    return letter || (!first && (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
                                 cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_PC));
  }

  size_t token(size_t i, std::string& brackets) {
    const char c = s_[i];
    if (std::isdigit(static_cast<unsigned char>(c))) return number(i);
    if (identifier_char(i, true)) {
      size_t e = i;
      while (e < s_.size() && identifier_char(e, false)) e += utf8_len(e);
      out_.push_back({Token::Type::name, s_.substr(i, e - i), 0, 0, pos(i)});
      return e;
    }
    if (c == '\'' || c == '"') return string(i);
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo)
      if (s_.compare(i, 2, op) == 0) {
        out_.push_back({Token::Type::op, op, 0, 0, pos(i)});
        return i + 2;
      }
    if (std::string("+-/*%~[](){}><=.:|,;").find(c) == std::string::npos)
      fail(i, concat("unexpected character '", encode_utf8(decode_utf8(s_.substr(i, 4)).substr(0, 1)), "'"));
    if (c == '(' || c == '[' || c == '{') brackets += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(i, concat("unexpected '", c, "'"));
      if (brackets.back() != c) fail(i, concat("unexpected '", c, "', expected '", brackets.back(), "'"));
      brackets.pop_back();
    }
    out_.push_back({Token::Type::op, std::string(1, c), 0, 0, pos(i)});
    return i + 1;
  }

  // Digits with single underscores between them, from i; returns the end.
  size_t digits(size_t i, int base = 10) const {
    const auto is_digit = [&](char c) { return hex_value(c) >= 0 && hex_value(c) < base; };
    size_t e = i;
    while (e < s_.size() && (is_digit(s_[e]) || (s_[e] == '_' && e + 1 < s_.size() && is_digit(s_[e + 1]) && e > i)))
      ++e;
    return e;
  }

  // jinja2's float rule, then its integer rule: 0b/0o/0x with digits,
  // [1-9] then digits, or zeros only (so "02" is 0 then 2, as in Python).
  size_t number(size_t i) {
    const auto strip = [&](size_t b, size_t e) {
      std::string t = s_.substr(b, e - b);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      return t;
    };
    if (const size_t e = float_end(i)) {
      // strtod, not stod: beyond a double's range is inf or 0, as Python's float() gives it, not an exception.
      out_.push_back({Token::Type::floating, "", 0, std::strtod(strip(i, e).c_str(), nullptr), pos(i)});
      return e;
    }
    const char x = i + 1 < s_.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(s_[i + 1]))) : 0;
    size_t b = i, e = i;
    int base = 10;
    if (s_[i] == '0' && (x == 'b' || x == 'o' || x == 'x')) {
      base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
      b = i + 2 + (i + 2 < s_.size() && s_[i + 2] == '_');
      e = digits(b, base);
    }
    if (e == b) {  // no prefix (or no digit after it)
      base = 10;
      b = i;
      e = s_[i] != '0' ? digits(i) : i + 1;
      while (s_[i] == '0' && e < s_.size() && (s_[e] == '0' || (s_[e] == '_' && e + 1 < s_.size() && s_[e + 1] == '0')))
        ++e;
    }
    Token t{Token::Type::integer, "", 0, 0, pos(i)};
    try {
      t.ival = std::stoll(strip(b, e), nullptr, base);
    } catch (const std::out_of_range&) {
      fail(i, "integer literal beyond 64 bits");
    }
    out_.push_back(t);
    return e;
  }

  // Where a float literal starting at i ends, or 0 when there is none.
  size_t float_end(size_t i) const {
    if (i > 0 && s_[i - 1] == '.') return 0;
    size_t e = digits(i);
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      const size_t k = e + 1 + (e + 1 < s_.size() && (s_[e + 1] == '+' || s_[e + 1] == '-'));
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        e = digits(k);
        is_float = true;
      }
    }
    return is_float ? e : 0;
  }

  size_t string(size_t i) {
    const char q = s_[i];
    size_t e = i + 1;
    while (e < s_.size() && s_[e] != q) e += s_[e] == '\\' ? 2 : 1;
    if (e >= s_.size()) fail(i, concat("unexpected character '", q, "' (unterminated string)"));
    out_.push_back({Token::Type::string, unescape(s_.substr(i + 1, e - i - 1), i), 0, 0, pos(i)});
    return e + 1;
  }

  // Python's .encode("ascii", "backslashreplace").decode("unicode-escape"), as jinja2 reads string literals.
  std::string unescape(const std::string& raw, size_t at) const {
    std::string a;
    char buf[16];
    for (char32_t c : decode_utf8(raw)) {
      if (c < 0x80) {
        a += static_cast<char>(c);
        continue;
      }
      std::snprintf(buf, sizeof buf,
                    c <= 0xFF     ? "\\x%02x"
                    : c <= 0xFFFF ? "\\u%04x"
                                  : "\\U%08x",
                    static_cast<unsigned>(c));
      a += buf;
    }
    std::u32string out;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k] != '\\' || k + 1 >= a.size()) {
        out += static_cast<char32_t>(static_cast<unsigned char>(a[k]));
        continue;
      }
      const char e = a[++k];
      static const std::string kSimple = "\\'\"abfnrtv\n";
      static const char32_t kValues[] = {'\\', '\'', '"', 7, 8, 12, 10, 13, 9, 11, 0};
      if (const auto s = kSimple.find(e); s != std::string::npos) {
        if (e != '\n') out += kValues[s];  // backslash-newline continues the line
      } else if (e >= '0' && e <= '7') {
        char32_t v = 0;
        size_t n = 0;
        for (; n < 3 && k < a.size() && a[k] >= '0' && a[k] <= '7'; ++n, ++k)
          v = v * 8 + static_cast<char32_t>(a[k] - '0');
        --k;
        out += v;
      } else if (e == 'x' || e == 'u' || e == 'U') {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t v = 0;
        for (size_t d = 1; d <= n; ++d) {
          if (k + d >= a.size() || hex_value(a[k + d]) < 0) fail(at, concat("truncated \\", e, " escape in a string"));
          v = v * 16 + static_cast<char32_t>(hex_value(a[k + d]));
        }
        if (v > 0x10FFFF) fail(at, "illegal Unicode character in a string escape");
        out += v;
        k += n;
      } else if (e == 'N') {
        fail(at, "\\N{...} escapes in strings are not supported by Anvil");
      } else {
        out += U'\\';
        out += static_cast<char32_t>(static_cast<unsigned char>(e));
      }
    }
    return encode_utf8(out);
  }

  std::string s_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  bool line_starting_ = true;
  mutable size_t last_byte_ = 0;  // where pos() was last asked, and its answer
  mutable Pos last_pos_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace anvil::jinja
