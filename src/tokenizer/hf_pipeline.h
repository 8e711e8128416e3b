#pragma once
// The stages of a tokenizer.json around its BPE model: normalizers,
// pre-tokenizers and decoders, read from their JSON and applied as the
// `tokenizers` library applies them. Internal to the HF backend.

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "unicode.h"

namespace anvil::tokenizer::detail {

// The tokenizer.json being read, for messages that name the file and key.
struct JsonSource {
  std::filesystem::path file;

  std::string where(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const nlohmann::json& need(const nlohmann::json& obj, const char* key, const std::string& at) const;
  bool bool_or(const nlohmann::json& obj, const char* key, bool fallback, const std::string& at) const;
  // j["type"] of a stage object.
  std::string type_of(const nlohmann::json& j, const std::string& at) const;
};

// j[key] when it is a string, else "".
std::string string_field(const nlohmann::json& j, const char* key);

// Every match of `pattern` in s replaced by `content` (HF's NormalizedString::replace).
std::string replace_all(const Regex& pattern, std::string_view s, std::string_view content);

// ---------------------------------------------------------------- normalizers

// NFC / NFD / NFKC / NFKD, Replace and Prepend, in the order the file gives.
class TextNormalizer {
 public:
  void parse(const nlohmann::json& j, const std::string& key, const JsonSource& src);
  bool empty() const { return steps_.empty(); }
  // Writes the normalized form of s to out; false (out untouched) when no
  // step changes s.
  bool apply(std::string_view s, std::string& out) const;

 private:
  struct Step {
    enum class Kind { kUnicode, kReplace, kPrepend } kind = Kind::kUnicode;
    Normalizer unicode;
    std::unique_ptr<Regex> pattern;  // kReplace
    std::string content;             // kReplace: the replacement; kPrepend: the prefix
  };
  std::vector<Step> steps_;
};

// ---------------------------------------------------------------- pre-tokenizers

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kSplit, kDigits, kByteLevel, kMetaspace } kind = Kind::kSplit;
  // kSplit; kByteLevel with use_regex; kMetaspace with split (the replacement, MergedWithNext)
  std::unique_ptr<Regex> regex;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace: what spaces become ("▁")
  PrependScheme prepend = PrependScheme::kAlways;
};

// Appends the steps of pre-tokenizer `j` (flattening Sequences) to steps.
void parse_pre_tokenizer(const nlohmann::json& j, const std::string& key, const JsonSource& src,
                         std::vector<PreTokenizerStep>& steps);

// Metaspace: spaces become the replacement, which is put in front when the
// scheme asks for it (kFirst: only for the piece at the start of the text).
std::string metaspace(const PreTokenizerStep& step, std::string_view piece, bool at_start);

struct Span {
  size_t begin, end;
  bool flag;  // a match (before the fold), or to remove (after)
};

// The spans of HF's Pattern::find_matches: matches and the gaps between them.
template <class F>
void for_each_span(const PreTokenizerStep& step, std::string_view s, F&& f) {
  size_t prev = 0;
  if (step.kind == PreTokenizerStep::Kind::kDigits) {
    for (size_t i = 0; i < s.size();) {
      const size_t b = i;
      if (is_numeric(next_code_point(s, i))) {
        if (prev < b) f(prev, b, false);
        f(b, i, true);
        prev = i;
      }
    }
  } else {
    step.regex->for_each_match(s, [&](size_t b, size_t e) {
      if (prev != b) f(prev, b, false);
      f(b, e, true);
      prev = e;
    });
  }
  if (prev != s.size()) f(prev, s.size(), false);
}

// Folds matches into pieces by `behavior` (HF's SplitDelimiterBehavior).
std::vector<Span> fold_spans(std::vector<Span> spans, Behavior behavior);

// HF's NormalizedString::split: the pieces `step` cuts s into, as views of s.
template <class F>
void split_by(const PreTokenizerStep& step, std::string_view s, F&& emit) {
  if (step.behavior == Behavior::kIsolated) {  // every span is a piece: no need to collect them
    for_each_span(step, s, [&](size_t b, size_t e, bool) {
      if (e > b) emit(s.substr(b, e - b));
    });
    return;
  }
  std::vector<Span> spans;
  for_each_span(step, s, [&](size_t b, size_t e, bool m) { spans.push_back({b, e, m != step.invert}); });
  for (const auto& sp : fold_spans(std::move(spans), step.behavior))
    if (!sp.flag && sp.end > sp.begin) emit(s.substr(sp.begin, sp.end - sp.begin));
}

// ---------------------------------------------------------------- decoders

// The decoder chain: ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace, in the order the file gives (Sequences flattened).
class DecoderChain {
 public:
  void parse(const nlohmann::json& j, const std::string& key, const JsonSource& src);
  // The file has no decoder.
  bool none() const { return !present_; }
  // The chain is a lone ByteLevel decoder: ids decode through a byte table.
  bool byte_level_only() const { return steps_.size() == 1 && steps_.front().kind == Step::Kind::kByteLevel; }
  // HF's Decoder::decode: each step maps the token strings, then they are joined.
  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = Kind::kByteLevel;
    std::unique_ptr<Regex> pattern;  // kReplace
    std::string content;             // kReplace: the replacement; kStrip: the character; kMetaspace: the replacement
    size_t start = 0, stop = 0;      // kStrip
    PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
  };
  void parse_step(const nlohmann::json& j, const std::string& key, const JsonSource& src);
  static void apply(const Step& step, std::vector<std::string>& tokens);
  bool present_ = false;
  std::vector<Step> steps_;
};

}  // namespace anvil::tokenizer::detail
