// Normalizers, pre-tokenizers and decoders of a tokenizer.json: the byte-level
// ones of GPT-2 and LLaMA-3 and the SentencePiece-style ones of Llama-2,
// Mistral and Gemma conversions (Replace, Prepend, Metaspace, ByteFallback,
// Fuse, Strip), each as the `tokenizers` library runs it.
#include "hf_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "anvil/core/error.h"

namespace anvil::tokenizer::detail {

using nlohmann::json;

// ---------------------------------------------------------------- JSON helpers

std::string JsonSource::where(const std::string& key) const { return concat(file.string(), ": ", key); }

void JsonSource::fail(const std::string& key, const std::string& what) const {
  throw Error(concat(where(key), ": ", what));
}

const json& JsonSource::need(const json& obj, const char* key, const std::string& at) const {
  const auto it = obj.find(key);
  if (it == obj.end()) throw Error(concat(file.string(), ": ", at.empty() ? "" : at + ".", key, ": missing"));
  return *it;
}

bool JsonSource::bool_or(const json& obj, const char* key, bool fallback, const std::string& at) const {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(concat(at, ".", key), "expected true or false");
  return it->get<bool>();
}

std::string JsonSource::type_of(const json& j, const std::string& at) const {
  if (!j.is_object()) fail(at, "expected an object or null");
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string()) fail(at + ".type", "expected a string");
  return it->get<std::string>();
}

std::string string_field(const json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string replace_all(const Regex& pattern, std::string_view s, std::string_view content) {
  std::string out;
  size_t prev = 0;
  pattern.for_each_match(s, [&](size_t b, size_t e) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  });
  out.append(s.substr(prev));
  return out;
}

namespace {

// A Split / Replace pattern: {"Regex": "..."} or {"String": "..."}.
std::unique_ptr<Regex> parse_pattern(const json& j, const std::string& key, const JsonSource& src) {
  const auto& pattern = src.need(j, "pattern", key);
  const auto regex = pattern.is_object() ? pattern.find("Regex") : pattern.end();
  const auto literal = pattern.is_object() ? pattern.find("String") : pattern.end();
  if (regex != pattern.end() && regex->is_string())
    return std::make_unique<Regex>(regex->get<std::string>(), src.where(key + ".pattern.Regex"));
  if (literal != pattern.end() && literal->is_string())
    return std::make_unique<Regex>(regex_escape(literal->get<std::string>()), src.where(key + ".pattern.String"));
  src.fail(key + ".pattern", "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
}

std::string string_of(const json& j, const char* name, const std::string& key, const JsonSource& src) {
  const auto& v = src.need(j, name, key);
  if (!v.is_string()) src.fail(concat(key, ".", name), "expected a string");
  return v.get<std::string>();
}

// A field HF reads as one Rust char.
std::string char_of(const json& j, const char* name, const std::string& key, const JsonSource& src) {
  auto s = string_of(j, name, key, src);
  size_t i = 0;
  if (s.empty() || !is_valid_utf8(s) || (next_code_point(s, i), i != s.size()))
    src.fail(concat(key, ".", name), concat("expected a single character, got \"", s, "\""));
  return s;
}

// Metaspace's prepend_scheme, or the older add_prefix_space (true: always, false: never).
PrependScheme prepend_scheme(const json& j, const std::string& key, const JsonSource& src) {
  const auto scheme = j.find("prepend_scheme");
  const auto add_prefix_space = j.find("add_prefix_space");
  const bool has_add = add_prefix_space != j.end() && !add_prefix_space->is_null();
  const bool add = src.bool_or(j, "add_prefix_space", true, key);
  if (scheme == j.end() || scheme->is_null()) return add ? PrependScheme::kAlways : PrependScheme::kNever;
  static const std::pair<const char*, PrependScheme> kSchemes[] = {
      {"first", PrependScheme::kFirst}, {"always", PrependScheme::kAlways}, {"never", PrependScheme::kNever}};
  const auto found = std::find_if(std::begin(kSchemes), std::end(kSchemes),
                                  [&](const auto& s) { return scheme->is_string() && *scheme == s.first; });
  if (found == std::end(kSchemes))
    src.fail(key + ".prepend_scheme",
             concat("unsupported scheme ", scheme->dump(), "; expected first, always or never"));
  if (has_add && add != (found->second != PrependScheme::kNever))
    src.fail(key + ".add_prefix_space", concat("does not match prepend_scheme \"", found->first, "\""));
  return found->second;
}

Behavior parse_behavior(const json& j, const std::string& key, const JsonSource& src) {
  const auto& behavior = src.need(j, "behavior", key);
  static const std::pair<const char*, Behavior> kBehaviors[] = {{"Removed", Behavior::kRemoved},
                                                                {"Isolated", Behavior::kIsolated},
                                                                {"MergedWithPrevious", Behavior::kMergedWithPrevious},
                                                                {"MergedWithNext", Behavior::kMergedWithNext},
                                                                {"Contiguous", Behavior::kContiguous}};
  const auto found = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                  [&](const auto& b) { return behavior.is_string() && behavior == b.first; });
  if (found == std::end(kBehaviors))
    src.fail(key + ".behavior",
             concat("unsupported behavior ", behavior.dump(),
                    "; expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous"));
  return found->second;
}

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---------------------------------------------------------------- normalizers

void TextNormalizer::parse(const json& j, const std::string& key, const JsonSource& src) {
  if (j.is_null()) return;
  const auto type = src.type_of(j, key);
  static const std::pair<const char*, int> kForms[] = {
      {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
      {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
      {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
      {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
  const auto form = std::find_if(std::begin(kForms), std::end(kForms), [&](const auto& f) { return type == f.first; });
  Step step;
  if (type == "Sequence") {
    const auto& list = src.need(j, "normalizers", key);
    if (!list.is_array()) src.fail(key + ".normalizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) parse(list[i], concat(key, ".normalizers[", i, "]"), src);
    return;
  } else if (form != std::end(kForms)) {
    step.unicode.add(static_cast<utf8proc_option_t>(form->second), type == "NFC");
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    step.pattern = parse_pattern(j, key, src);
    step.content = string_of(j, "content", key, src);
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    step.content = string_of(j, "prepend", key, src);
  } else {
    src.fail(key + ".type", concat("unsupported normalizer \"", type,
                                   "\"; expected NFC, NFKC, NFD, NFKD, Replace, Prepend or Sequence"));
  }
  steps_.push_back(std::move(step));
}

bool TextNormalizer::apply(std::string_view s, std::string& out) const {
  bool changed = false;
  std::string next;
  for (const auto& step : steps_) {
    const std::string_view in = changed ? std::string_view(out) : s;
    switch (step.kind) {
      case Step::Kind::kUnicode:
        if (!step.unicode.apply(in, next)) continue;
        break;
      case Step::Kind::kReplace:
        next = replace_all(*step.pattern, in, step.content);
        break;
      case Step::Kind::kPrepend:
        if (in.empty()) continue;  // HF prepends to non-empty text only
        next = concat(step.content, in);
        break;
    }
    out.swap(next);
    changed = true;
  }
  return changed;
}

// ---------------------------------------------------------------- pre-tokenizers

void parse_pre_tokenizer(const json& j, const std::string& key, const JsonSource& src,
                         std::vector<PreTokenizerStep>& steps) {
  if (j.is_null()) return;
  const auto type = src.type_of(j, key);
  PreTokenizerStep step;
  if (type == "Sequence") {
    const auto& list = src.need(j, "pretokenizers", key);
    if (!list.is_array()) src.fail(key + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(list[i], concat(key, ".pretokenizers[", i, "]"), src, steps);
    return;
  } else if (type == "ByteLevel") {
    if (std::any_of(steps.begin(), steps.end(),
                    [](const auto& s) { return s.kind == PreTokenizerStep::Kind::kByteLevel; }))
      src.fail(key, "a second ByteLevel pre-tokenizer is not supported");
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = src.bool_or(j, "add_prefix_space", true, key);
    if (src.bool_or(j, "use_regex", true, key)) step.regex = std::make_unique<Regex>(kGpt2Pattern, src.where(key));
  } else if (type == "Split") {
    step.regex = parse_pattern(j, key, src);
    step.behavior = parse_behavior(j, key, src);
    step.invert = src.bool_or(j, "invert", false, key);
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.behavior = src.bool_or(j, "individual_digits", false, key) ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    step.replacement = char_of(j, "replacement", key, src);
    step.prepend = prepend_scheme(j, key, src);
    step.behavior = Behavior::kMergedWithNext;
    if (src.bool_or(j, "split", true, key))
      step.regex = std::make_unique<Regex>(regex_escape(step.replacement), src.where(key + ".replacement"));
  } else {
    src.fail(key + ".type", concat("unsupported pre-tokenizer \"", type,
                                   "\"; expected ByteLevel, Split, Digits, Metaspace or Sequence"));
  }
  steps.push_back(std::move(step));
}

std::string metaspace(const PreTokenizerStep& step, std::string_view piece, bool at_start) {
  std::string out;
  out.reserve(piece.size() + step.replacement.size());
  for (const char c : piece) {
    if (c == ' ')
      out += step.replacement;
    else
      out += c;
  }
  const bool prepend = step.prepend == PrependScheme::kAlways || (step.prepend == PrependScheme::kFirst && at_start);
  if (prepend && out.compare(0, step.replacement.size(), step.replacement) != 0) out.insert(0, step.replacement);
  return out;
}

std::vector<Span> fold_spans(std::vector<Span> spans, Behavior behavior) {
  std::vector<Span> out;
  bool prev = false;
  switch (behavior) {
    case Behavior::kRemoved:
    case Behavior::kIsolated:
      return spans;
    case Behavior::kContiguous:
      for (const auto& sp : spans) {
        if (sp.flag == prev && !out.empty())
          out.back().end = sp.end;
        else
          out.push_back({sp.begin, sp.end, false});
        prev = sp.flag;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& sp : spans) {
        if (sp.flag && !prev && !out.empty())
          out.back().end = sp.end;
        else
          out.push_back({sp.begin, sp.end, false});
        prev = sp.flag;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !prev && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back({it->begin, it->end, false});
        prev = it->flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

// ---------------------------------------------------------------- decoders

void DecoderChain::parse(const json& j, const std::string& key, const JsonSource& src) {
  if (j.is_null()) return;
  present_ = true;
  parse_step(j, key, src);
}

void DecoderChain::parse_step(const json& j, const std::string& key, const JsonSource& src) {
  const auto type = src.type_of(j, key);
  Step step;
  if (type == "Sequence") {
    const auto& list = src.need(j, "decoders", key);
    if (!list.is_array()) src.fail(key + ".decoders", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) parse_step(list[i], concat(key, ".decoders[", i, "]"), src);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    step.pattern = parse_pattern(j, key, src);
    step.content = string_of(j, "content", key, src);
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    step.content = char_of(j, "content", key, src);
    for (auto [name, field] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
      const auto& v = src.need(j, name, key);
      if (!v.is_number_unsigned()) src.fail(concat(key, ".", name), "expected a non-negative integer");
      *field = v.get<size_t>();
    }
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.content = char_of(j, "replacement", key, src);
    step.prepend = prepend_scheme(j, key, src);
  } else {
    src.fail(key + ".type",
             concat("unsupported decoder \"", type,
                    "\"; expected ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace or Sequence"));
  }
  steps_.push_back(std::move(step));
}

namespace {

// "<0xNN>" -> NN, else -1.
int byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t pending = 0;
  const auto flush = [&] {
    if (pending == 0) return;
    if (is_valid_utf8(bytes))
      out.push_back(bytes);
    else
      out.insert(out.end(), pending, "\xEF\xBF\xBD");  // one U+FFFD per byte token
    bytes.clear();
    pending = 0;
  };
  for (auto& t : tokens) {
    const int b = byte_token(t);
    if (b >= 0) {
      bytes += static_cast<char>(b);
      ++pending;
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  tokens = std::move(out);
}

// Strip: up to `start` leading and `stop` trailing copies of one character.
std::string strip(const std::string& token, const std::string& c, size_t start, size_t stop) {
  std::vector<size_t> bounds;  // the offset of each character, then the end
  for (size_t i = 0; i < token.size(); i += utf8_length(static_cast<unsigned char>(token[i]))) bounds.push_back(i);
  const size_t n = bounds.size();
  bounds.push_back(token.size());
  const auto is_c = [&](size_t k) { return token.compare(bounds[k], bounds[k + 1] - bounds[k], c) == 0; };
  size_t first = 0, last = n;
  while (first < std::min(start, n) && is_c(first)) ++first;
  for (size_t k = 0; k < stop && k < n && is_c(n - 1 - k); ++k) last = n - 1 - k;
  if (last <= first) return {};
  return token.substr(bounds[first], bounds[last] - bounds[first]);
}

}  // namespace

void DecoderChain::apply(const Step& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case Step::Kind::kByteLevel: {  // every token's characters back to bytes, as one string
      std::string bytes, token_bytes;
      for (const auto& t : tokens) bytes += byte_alphabet().to_bytes(t, token_bytes) ? token_bytes : t;
      tokens.assign(1, is_valid_utf8(bytes) ? bytes : to_valid_utf8(bytes));
      return;
    }
    case Step::Kind::kReplace:
      for (auto& t : tokens) t = replace_all(*step.pattern, t, step.content);
      return;
    case Step::Kind::kByteFallback:
      byte_fallback(tokens);
      return;
    case Step::Kind::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case Step::Kind::kStrip:
      for (auto& t : tokens) t = strip(t, step.content, step.start, step.stop);
      return;
    case Step::Kind::kMetaspace:
      // The replacement is a space again; in the first token HF drops it
      // (every one, not only a leading one) unless the scheme is never.
      for (size_t i = 0; i < tokens.size(); ++i) {
        const bool drop = i == 0 && step.prepend != PrependScheme::kNever;
        std::string out;
        for (size_t at = 0, next; at < tokens[i].size(); at = next + step.content.size()) {
          next = tokens[i].find(step.content, at);
          out.append(tokens[i], at, next == std::string::npos ? std::string::npos : next - at);
          if (next == std::string::npos) break;
          if (!drop) out += ' ';
        }
        tokens[i] = std::move(out);
      }
      return;
  }
}

std::string DecoderChain::decode(std::vector<std::string> tokens) const {
  if (!present_) {  // HF joins the token strings with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& step : steps_) apply(step, tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return is_valid_utf8(out) ? out : to_valid_utf8(out);
}

}  // namespace anvil::tokenizer::detail
