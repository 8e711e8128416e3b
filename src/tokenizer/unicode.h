#pragma once
// Unicode and regex machinery of the tokenizer.json backend: UTF-8, character
// classes, GPT-2's byte-level alphabet, Oniguruma patterns on PCRE2, and
// Unicode normalization through utf8proc.

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::tokenizer::detail {

// ---------------------------------------------------------------- UTF-8

bool is_valid_utf8(std::string_view s);
std::string to_valid_utf8(std::string_view s);

inline size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// The code point at s[i] of valid UTF-8; advances i past it.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_length(b0);
  char32_t c = n == 1 ? b0 : n == 2 ? b0 & 0x1F : n == 3 ? b0 & 0x0F : b0 & 0x07;
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

char32_t last_code_point(std::string_view s);
void append_utf8(std::string& out, char32_t c);

// ---------------------------------------------------------------- Unicode classes

bool is_white_space(char32_t c);

// Rust's char::is_numeric (the Digits pre-tokenizer): general category N*.
bool is_numeric(char32_t c);

// Rust regex's Unicode \w (single_word added tokens): Alphabetic, marks,
// decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c);

// ---------------------------------------------------------------- byte-level alphabet

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// other 68 bytes for U+0100.. in byte order.
class ByteAlphabet {
 public:
  ByteAlphabet();
  // The raw bytes a byte-level string stands for; false when it has a
  // character outside the alphabet.
  bool to_bytes(std::string_view s, std::string& out) const;
  std::string to_chars(std::string_view bytes) const;
  const std::string& char_of(unsigned char b) const { return utf8_[b]; }

 private:
  std::array<std::string, 256> utf8_;
  std::array<int16_t, 324> byte_of_;  // U+0000..U+0143
};

const ByteAlphabet& byte_alphabet();

// ---------------------------------------------------------------- regular expressions

std::string regex_escape(std::string_view literal);

class Regex {
 public:
  Regex(std::string_view onig_pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match at or after `from` (s is valid UTF-8).
  bool find(std::string_view s, size_t from, size_t* begin, size_t* end) const;

  // Every match, as Oniguruma's find_iter gives them: an empty match right
  // where the previous match ended is skipped by one character.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    size_t from = 0, b = 0, e = 0;
    bool matched_before = false;
    size_t last_match_end = 0;
    while (from <= s.size() && find(s, from, &b, &e)) {
      if (b == e && matched_before && last_match_end == e) {
        if (from >= s.size()) break;
        from += utf8_length(static_cast<unsigned char>(s[from]));
        continue;
      }
      from = last_match_end = e;
      matched_before = true;
      f(b, e);
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------- normalizer

// NFC / NFD / NFKC / NFKD in sequence (utf8proc).
class Normalizer {
 public:
  void add(utf8proc_option_t form, bool nfc) { forms_.push_back({form, nfc}); }
  bool empty() const { return forms_.empty(); }

  // Writes the normalized form of s to out; false (out untouched) when s is
  // already normalized by every form.
  bool apply(std::string_view s, std::string& out) const;

 private:
  struct Form {
    utf8proc_option_t options;
    bool nfc;
  };
  std::vector<Form> forms_;
};

}  // namespace anvil::tokenizer::detail
