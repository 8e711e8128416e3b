// Hugging Face tokenizer.json backend for BPE: byte-level (GPT-2, GPT-NeoX,
// OPT, Galactica, LLaMA-3, Qwen, ...) and SentencePiece-style with byte
// fallback (Llama-2, Mistral, Gemma conversions), id for id what the
// `tokenizers` library gives. The pipeline is the library's: added tokens are
// cut out of the raw text; the pieces between are normalized and cut again on
// added tokens that match normalized text; pre-tokenizers split those into
// words; BPE merges each word. With a ByteLevel pre-tokenizer words are kept
// as raw bytes throughout: the byte-level alphabet (bytes_to_unicode) only
// matters for reading the vocabulary and merges. Without one, words are text
// and each character is a symbol (HF's BPE::merge_word).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/logging.h"
#include "added_tokens.h"
#include "backends.h"
#include "bpe.h"
#include "hf_pipeline.h"
#include "unicode.h"

namespace anvil::tokenizer {
namespace {

namespace stdfs = std::filesystem;
using detail::AddedToken;
using detail::apply_merges;
using detail::byte_alphabet;
using detail::DecoderChain;
using detail::is_valid_utf8;
using detail::is_white_space;
using detail::is_word_char;
using detail::kCacheCapacity;
using detail::kMaxCachedWordBytes;
using detail::last_code_point;
using detail::MergeMap;
using detail::next_code_point;
using detail::PreTokenizerStep;
using detail::string_field;
using detail::StringMap;
using detail::TextNormalizer;
using detail::to_valid_utf8;
using detail::TokenTrie;
using detail::word_cache;
using detail::WordCache;
using nlohmann::json;

// ---------------------------------------------------------------- the tokenizer

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const stdfs::path& file, const detail::SpecialTokenConfig& cfg);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;

  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  int64_t bos_id() const override { return bos_; }
  int64_t eos_id() const override { return eos_; }
  int64_t pad_id() const override { return pad_; }
  bool add_bos() const override { return add_bos_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::string kind() const override { return "hf"; }
  void save(const stdfs::path& dir) const override;

 private:
  struct EncodeState {
    WordCache& cache;
    std::vector<int64_t>& out;
  };

  [[noreturn]] void fail(const std::string& key, const std::string& what) const { src_.fail(key, what); }
  void parse_model(const json& model);
  void parse_merges(const json& merges);
  void parse_added_tokens(const json& j);
  std::optional<std::string> post_processor_bos(const json& j, const std::string& key, int64_t* id) const;
  void build_decode_table();
  void resolve_special_tokens(const json& post_processor, const detail::SpecialTokenConfig& cfg);
  bool fairseq_specials() const;

  template <class F>
  void split_added(std::string_view s, const TokenTrie& trie, F&& f) const;
  void encode_between_added(std::string_view piece, bool at_start, EncodeState& st) const;
  template <class Sink>
  void pre_tokenize(size_t step, std::string_view piece, bool byte_chars, bool at_start, Sink& sink) const;
  void encode_word(std::string_view word, EncodeState& st) const;
  void byte_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void char_symbols(std::string_view word, std::vector<int32_t>& ids) const;

  stdfs::path file_;
  detail::JsonSource src_;
  stdfs::path config_dir_;
  std::string config_json_;
  uint64_t instance_;

  // model
  StringMap<int32_t> vocab_;                 // as written (byte-level characters)
  StringMap<int32_t> bytes_vocab_;           // raw bytes -> id (ignore_merges)
  std::array<int32_t, 256> byte_ids_{};      // byte-level character of each byte -> id
  std::array<int32_t, 256> fallback_ids_{};  // <0xNN> -> id (byte_fallback)
  MergeMap merges_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;

  TextNormalizer normalizer_;
  std::vector<PreTokenizerStep> steps_;
  bool byte_level_ = false;  // a ByteLevel pre-tokenizer: words are bytes
  DecoderChain decoder_;
  bool byte_table_ = false;  // ids decode through id_bytes_ alone (ByteLevel decoder)

  std::vector<AddedToken> added_;
  StringMap<int32_t> added_ids_;
  TokenTrie raw_trie_, normalized_trie_;  // values: index into added_

  std::vector<std::string> id_bytes_;  // bytes of each id (byte_table_), else its token string
  std::vector<uint8_t> id_flags_;      // kKnown | kSpecial
  static constexpr uint8_t kKnown = 1, kSpecial = 2;

  int64_t bos_ = -1, eos_ = -1, pad_ = -1;
  bool add_bos_ = false;
};

// ------------------------------------------------ loading

HfTokenizer::HfTokenizer(const stdfs::path& file, const detail::SpecialTokenConfig& cfg)
    : file_(file), src_{file}, config_dir_(file.parent_path()), config_json_(cfg.config_json) {
  static std::atomic<uint64_t> next_instance{1};
  instance_ = next_instance++;
  if (!stdfs::is_regular_file(file)) throw Error(concat(file.string(), ": tokenizer file not found"));
  json j;
  try {
    j = json::parse(fs::read_file(file));
  } catch (const json::exception& e) {
    throw Error(concat(file.string(), ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(concat(file.string(), ": expected a JSON object (a Hugging Face tokenizer.json)"));
  parse_model(src_.need(j, "model", ""));
  const auto normalizer = j.find("normalizer");
  if (normalizer != j.end()) normalizer_.parse(*normalizer, "normalizer", src_);
  const auto pre = j.find("pre_tokenizer");
  if (pre != j.end()) detail::parse_pre_tokenizer(*pre, "pre_tokenizer", src_, steps_);
  byte_level_ = std::any_of(steps_.begin(), steps_.end(),
                            [](const auto& s) { return s.kind == PreTokenizerStep::Kind::kByteLevel; });
  const auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) parse_added_tokens(*added);
  const auto decoder = j.find("decoder");
  if (decoder != j.end()) decoder_.parse(*decoder, "decoder", src_);
  // HF without a decoder joins the token strings with spaces; for byte-level
  // BPE, byte-level decoding is what is meant.
  byte_table_ = decoder_.byte_level_only() || (decoder_.none() && byte_level_);
  build_decode_table();
  const auto post = j.find("post_processor");
  resolve_special_tokens(post != j.end() ? *post : json(), cfg);
}

void HfTokenizer::parse_model(const json& model) {
  if (!model.is_object()) fail("model", "expected an object");
  const auto type = model.find("type");
  if (type != model.end()) {
    if (!type->is_string()) fail("model.type", "expected a string");
    if (*type != "BPE")
      fail("model.type", concat("unsupported model \"", type->get<std::string>(), "\"; expected BPE"));
  }
  const auto& vocab = src_.need(model, "vocab", "model");
  if (!vocab.is_object()) fail("model.vocab", "expected an object of token -> id");
  const auto& alphabet = byte_alphabet();
  std::string bytes;
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail("model.vocab", concat("entry \"", token, "\": expected a non-negative integer id"));
    vocab_.emplace(token, id.get<int32_t>());
    if (alphabet.to_bytes(token, bytes)) bytes_vocab_.emplace(bytes, id.get<int32_t>());
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(alphabet.char_of(static_cast<unsigned char>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    const auto fallback = vocab_.find(concat("<0x", "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15], ">"));
    fallback_ids_[b] = fallback == vocab_.end() ? -1 : fallback->second;
  }

  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0))
    fail("model.dropout", "BPE dropout is not supported; expected null or 0");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail(concat("model.", key), "not supported; expected null or \"\"");
  }
  byte_fallback_ = src_.bool_or(model, "byte_fallback", false, "model");
  fuse_unk_ = src_.bool_or(model, "fuse_unk", false, "model");
  ignore_merges_ = src_.bool_or(model, "ignore_merges", false, "model");
  const auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) fail("model.unk_token", "expected a string or null");
    const auto it = vocab_.find(unk->get<std::string>());
    unk_id_ = it == vocab_.end() ? -1 : it->second;  // HF only complains once it needs it
  }
  parse_merges(src_.need(model, "merges", "model"));
}

void HfTokenizer::parse_merges(const json& merges) {
  if (!merges.is_array()) fail("model.merges", "expected a list of merges (\"a b\" strings or [\"a\", \"b\"] pairs)");
  merges_.reserve(merges.size());
  uint32_t rank = 0;
  std::string left, right;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& m = merges[i];
    const auto key = concat("model.merges[", i, "]");
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;  // merges.txt header, skipped by HF too
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail(key, concat("expected \"left right\" with one space, got \"", s, "\""));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail(key, "expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    if (l == vocab_.end()) fail(key, concat("\"", left, "\" is not in model.vocab"));
    if (r == vocab_.end()) fail(key, concat("\"", right, "\" is not in model.vocab"));
    if (merged == vocab_.end()) fail(key, concat("the merged token \"", left + right, "\" is not in model.vocab"));
    merges_.insert(l->second, r->second, rank++, merged->second);
  }
}

void HfTokenizer::parse_added_tokens(const json& list) {
  if (!list.is_array()) fail("added_tokens", "expected a list");
  const auto model_size = static_cast<int32_t>(vocab_.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    const auto key = concat("added_tokens[", i, "]");
    if (!t.is_object()) fail(key, "expected an object");
    const auto& content = src_.need(t, "content", key);
    const auto& id = src_.need(t, "id", key);
    if (!content.is_string()) fail(key + ".content", "expected a string");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail(key + ".id", "expected a non-negative integer");
    AddedToken a;
    a.content = content.get<std::string>();
    a.special = src_.bool_or(t, "special", false, key);
    a.lstrip = src_.bool_or(t, "lstrip", false, key);
    a.rstrip = src_.bool_or(t, "rstrip", false, key);
    a.single_word = src_.bool_or(t, "single_word", false, key);
    a.normalized = src_.bool_or(t, "normalized", !a.special, key);
    if (a.content.empty()) continue;                                               // HF ignores these
    if (const auto seen = added_ids_.find(a.content); seen != added_ids_.end()) {  // the later flags win
      const auto prev = std::find_if(added_.begin(), added_.end(), [&](const auto& x) { return x.id == seen->second; });
      a.id = prev->id;
      *prev = std::move(a);
      continue;
    }
    // HF does not read the ids: it adds the tokens one by one, giving a
    // vocabulary entry's content that entry's id and anything else the next
    // id after the model's vocabulary (counted as entries) and earlier added
    // tokens. For a consistent file this is the id written there.
    if (const auto in_vocab = vocab_.find(a.content); in_vocab != vocab_.end()) {
      a.id = in_vocab->second;
    } else if (added_.empty()) {
      a.id = model_size;
    } else {
      const int32_t max_added =
          std::max_element(added_.begin(), added_.end(), [](const auto& x, const auto& y) { return x.id < y.id; })->id;
      a.id = max_added >= model_size || model_size == 0 ? max_added + 1 : model_size;
    }
    added_ids_.emplace(a.content, a.id);
    added_.push_back(std::move(a));
  }
  // HF's tries list special tokens first, then the others; contents are
  // unique, so leftmost-longest does not depend on that order.
  for (size_t i = 0; i < added_.size(); ++i) {
    const auto& a = added_[i];
    if (!a.normalized) {
      raw_trie_.add(a.content, static_cast<int32_t>(i));
    } else {
      std::string normalized;
      normalized_trie_.add(normalizer_.apply(a.content, normalized) ? normalized : a.content, static_cast<int32_t>(i));
    }
  }
}

void HfTokenizer::build_decode_table() {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  for (const auto& a : added_) max_id = std::max(max_id, a.id);
  // Ids index a table: they must be (nearly) dense. Real vocabularies leave at
  // most a few holes; an id far past the token count is a damaged file, and
  // would otherwise size a table of billions of entries.
  const auto tokens = static_cast<int64_t>(vocab_.size() + added_.size());
  if (max_id >= 2 * tokens + 1024)
    fail("model.vocab", concat("token id ", max_id, " is far past the ", tokens,
                               " tokens the file defines; ids are expected to run from 0 without large gaps"));
  id_bytes_.assign(static_cast<size_t>(max_id + 1), {});
  id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  // HF's ByteLevel decoder maps a token's characters back to bytes, or keeps
  // the token's own UTF-8 when a character is outside the alphabet. Other
  // decoders work on the token strings.
  const auto& alphabet = byte_alphabet();
  const auto set = [&](int32_t id, const std::string& token) {
    if (!byte_table_ || !alphabet.to_bytes(token, id_bytes_[id])) id_bytes_[id] = token;
    id_flags_[id] = kKnown;
  };
  for (const auto& [token, id] : vocab_) set(id, token);
  std::string normalized;
  for (const auto& a : added_) {
    // An added token's content wins over the vocabulary entry; HF decodes one
    // that matches normalized text in its normalized form.
    set(a.id, a.normalized && normalizer_.apply(a.content, normalized) ? normalized : a.content);
    if (a.special) id_flags_[a.id] |= kSpecial;
  }
}

// The token a TemplateProcessing post-processor puts in front of a single
// sequence (LLaMA's BOS), with its id in *id.
std::optional<std::string> HfTokenizer::post_processor_bos(const json& j, const std::string& key, int64_t* id) const {
  if (!j.is_object()) return std::nullopt;
  const auto type = string_field(j, "type");
  if (type == "Sequence") {
    const auto list = j.find("processors");
    if (list == j.end() || !list->is_array()) return std::nullopt;
    for (size_t i = 0; i < list->size(); ++i)
      if (auto bos = post_processor_bos((*list)[i], concat(key, ".processors[", i, "]"), id)) return bos;
    return std::nullopt;
  }
  if (type != "TemplateProcessing") return std::nullopt;  // ByteLevel, BertProcessing, RobertaProcessing: no BOS
  const auto single = j.find("single");
  if (single == j.end() || !single->is_array() || single->empty()) return std::nullopt;
  const auto first = single->front().find("SpecialToken");
  if (first == single->front().end()) return std::nullopt;
  const auto name = string_field(*first, "id");
  if (name.empty()) fail(key + ".single[0].SpecialToken.id", "expected a token string");
  // The ids the template writes for it, else the token's own id.
  const auto specials = j.find("special_tokens");
  if (specials != j.end() && specials->is_object() && specials->contains(name)) {
    const auto& entry = specials->at(name);
    const auto ids = entry.find("ids");
    if (ids != entry.end() && ids->is_array() && !ids->empty() && ids->front().is_number_integer()) {
      *id = ids->front().get<int64_t>();
      return name;
    }
  }
  const auto resolved = token_to_id(name);
  if (!resolved) fail(key + ".single[0]", concat("special token \"", name, "\" is not in the vocabulary"));
  *id = *resolved;
  return name;
}

void HfTokenizer::resolve_special_tokens(const json& post_processor, const detail::SpecialTokenConfig& cfg) {
  const auto resolve = [&](const std::optional<std::string>& token, const char* key) -> int64_t {
    if (!token) return -1;
    const auto id = token_to_id(*token);
    if (!id)
      throw Error(concat(cfg.source.string(), ": ", key, ": token \"", *token, "\" is not in the vocabulary of ",
                         file_.string()));
    return *id;
  };
  int64_t template_bos = -1;
  const bool template_adds_bos = post_processor_bos(post_processor, "post_processor", &template_bos).has_value();
  bos_ = cfg.bos ? resolve(cfg.bos, "bos_token") : template_bos;
  eos_ = cfg.eos ? resolve(cfg.eos, "eos_token") : token_to_id("<|endoftext|>").value_or(-1);
  pad_ = resolve(cfg.pad, "pad_token");
  if (!cfg.bos && !cfg.eos && !cfg.pad && !template_adds_bos && fairseq_specials()) {
    // Galactica's folders ship an empty special_tokens_map.json and a
    // tokenizer_config.json without the tokens; its code (and OPT's config)
    // takes them from the fairseq dictionary's order.
    bos_ = 0, pad_ = 1, eos_ = 2;
    log::info((cfg.source.empty() ? file_ : cfg.source).string(),
              ": no bos_token, eos_token or pad_token set; using <s> (0), </s> (2) and <pad> (1) of ", file_.string(),
              " as Galactica does");
  }
  add_bos_ = cfg.add_bos.value_or(template_adds_bos);
  if (add_bos_ && bos_ < 0) throw Error(concat(cfg.source.string(), ": add_bos_token: true, but no bos_token is set"));
  for (const int64_t id : {bos_, eos_, pad_})
    if (id >= 0 && id < vocab_size()) id_flags_[id] |= kSpecial;
}

// <s>, <pad>, </s>, <unk> at ids 0..3, as in fairseq dictionaries (OPT, Galactica).
bool HfTokenizer::fairseq_specials() const {
  int64_t id = 0;
  for (const char* token : {"<s>", "<pad>", "</s>", "<unk>"})
    if (token_to_id(token) != id++) return false;
  return true;
}

// ------------------------------------------------ encoding

// HF's AddedVocabulary::find_matches: f(begin, end, added index or -1) over
// pieces covering s, with lstrip / rstrip / single_word applied.
template <class F>
void HfTokenizer::split_added(std::string_view s, const TokenTrie& trie, F&& f) const {
  size_t start_offset = 0;
  trie.for_each_match(s, [&](size_t start, size_t stop, int32_t index) {
    const auto& a = added_[index];
    if (a.single_word) {
      const bool space_before = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      size_t after = stop;
      const bool space_after = stop == s.size() || !is_word_char(next_code_point(s, after));
      if (!space_before || !space_after) return;
    }
    if (a.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t p = b - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_white_space(next_code_point(s, q))) break;
        b = p;
      }
      start = std::max(b, start_offset);
    }
    if (a.rstrip) {
      for (size_t q = stop; q < s.size() && is_white_space(next_code_point(s, q));) stop = q;
    }
    if (start_offset < start) f(start_offset, start, -1);
    f(start, stop, index);
    start_offset = stop;
  });
  if (start_offset != s.size()) f(start_offset, s.size(), -1);
}

std::vector<int64_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  out.reserve(text.size() / 3 + 4);
  std::string repaired;
  if (!is_valid_utf8(text)) text = repaired = to_valid_utf8(text);  // as Python would decode it, errors="replace"
  EncodeState st{word_cache(instance_), out};
  if (raw_trie_.empty()) {
    encode_between_added(text, true, st);
    return out;
  }
  split_added(text, raw_trie_, [&](size_t b, size_t e, int32_t index) {
    if (e <= b) return;
    if (index >= 0)
      out.push_back(added_[index].id);
    else
      encode_between_added(text.substr(b, e - b), b == 0, st);
  });
  return out;
}

// Normalizes text that holds no raw-matched added token, cuts out the added
// tokens that match normalized text, and pre-tokenizes and BPEs the rest.
// at_start: the piece begins the text (Metaspace's prepend_scheme "first").
void HfTokenizer::encode_between_added(std::string_view piece, bool at_start, EncodeState& st) const {
  std::string normalized;
  if (normalizer_.apply(piece, normalized)) piece = normalized;
  const auto words = [&](std::string_view word) { encode_word(word, st); };
  if (normalized_trie_.empty()) {
    pre_tokenize(0, piece, false, at_start, words);
    return;
  }
  split_added(piece, normalized_trie_, [&](size_t b, size_t e, int32_t index) {
    if (e <= b) return;
    if (index >= 0)
      st.out.push_back(added_[index].id);
    else
      pre_tokenize(0, piece.substr(b, e - b), false, at_start && b == 0, words);
  });
}

// Runs pre-tokenizer steps [step, end) on piece, depth first so that words
// come out in order. After the ByteLevel step, later steps see byte-level
// characters (byte_chars), as in HF; words reach the sink as raw bytes.
template <class Sink>
void HfTokenizer::pre_tokenize(size_t step, std::string_view piece, bool byte_chars, bool at_start, Sink& sink) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    if (!byte_chars) {
      sink(piece);
      return;
    }
    std::string bytes;
    byte_alphabet().to_bytes(piece, bytes);
    sink(std::string_view(bytes));
    return;
  }
  const auto& st = steps_[step];
  // A sub-piece begins the text when it begins a piece that does.
  const auto split = [&](std::string_view text) {
    split_by(st, text, [&](std::string_view sub) {
      pre_tokenize(step + 1, sub, byte_chars, at_start && sub.data() == text.data(), sink);
    });
  };
  if (st.kind == PreTokenizerStep::Kind::kMetaspace) {
    const auto text = detail::metaspace(st, piece, at_start);
    if (st.regex)
      split(text);
    else
      pre_tokenize(step + 1, text, byte_chars, at_start, sink);
    return;
  }
  if (st.kind != PreTokenizerStep::Kind::kByteLevel) {
    split(piece);
    return;
  }
  std::string prefixed;
  if (st.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  const auto next = [&](std::string_view word) {
    if (step + 1 == steps_.size()) {
      sink(word);
    } else {
      const auto chars = byte_alphabet().to_chars(word);
      pre_tokenize(step + 1, chars, true, at_start && word.data() == piece.data(), sink);
    }
  };
  if (st.regex)
    split_by(st, piece, next);
  else
    next(piece);
}

void HfTokenizer::encode_word(std::string_view word, EncodeState& st) const {
  if (ignore_merges_) {  // LLaMA-3: a word that is a token is that token
    const auto& vocab = byte_level_ ? bytes_vocab_ : vocab_;
    const auto it = vocab.find(word);
    if (it != vocab.end()) {
      st.out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    const auto it = st.cache.words.find(word);
    if (it != st.cache.words.end()) {
      st.out.insert(st.out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  if (byte_level_)
    byte_symbols(word, ids);
  else
    char_symbols(word, ids);
  apply_merges(merges_, ids);
  st.out.insert(st.out.end(), ids.begin(), ids.end());
  if (cacheable) {
    if (st.cache.words.size() >= kCacheCapacity) st.cache.words.clear();
    st.cache.words.emplace(std::string(word), std::move(ids));
  }
}

// The symbols of a byte-level word (raw bytes): one per byte. HF's
// merge_word: unknown characters become unk_token (fused if fuse_unk).
void HfTokenizer::byte_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  bool pending_unk = false;
  for (const char c : word) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) ids.push_back(unk_id_);
      pending_unk = false;
      ids.push_back(id);
    } else if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) ids.push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) ids.push_back(unk_id_);
}

// The symbols of a text word: one per character; a character the vocabulary
// lacks becomes its UTF-8 bytes as <0xNN> tokens (byte_fallback, when all of
// them exist), else unk_token. As in HF, byte tokens do not flush a pending unk.
void HfTokenizer::char_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    next_code_point(word, i);
    const auto ch = word.substr(begin, i - begin);
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk) ids.push_back(unk_id_);
      pending_unk = false;
      ids.push_back(it->second);
      continue;
    }
    const auto fallback = [&](char c) { return fallback_ids_[static_cast<unsigned char>(c)]; };
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) { return fallback(c) >= 0; })) {
      for (const char c : ch) ids.push_back(fallback(c));
      continue;
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) ids.push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) ids.push_back(unk_id_);
}

// ------------------------------------------------ the rest of the interface

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const auto keep = [&](int64_t id) {  // HF drops ids it has no token for
    return id >= 0 && id < vocab_size() && (id_flags_[id] & kKnown) &&
           !(skip_special_tokens && (id_flags_[id] & kSpecial));
  };
  if (!byte_table_) {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const auto id : ids)
      if (keep(id)) tokens.push_back(id_bytes_[id]);
    return decoder_.decode(std::move(tokens));
  }
  std::string bytes;
  for (const auto id : ids)
    if (keep(id)) bytes += id_bytes_[id];
  return is_valid_utf8(bytes) ? bytes : to_valid_utf8(bytes);
}

std::optional<int64_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

void HfTokenizer::save(const stdfs::path& dir) const {
  stdfs::create_directories(dir);
  const auto copy = [&](const stdfs::path& src, const stdfs::path& dst) {
    if (stdfs::exists(dst) && stdfs::equivalent(src, dst)) return;
    stdfs::copy_file(src, dst, stdfs::copy_options::overwrite_existing);
  };
  copy(file_, dir / "tokenizer.json");
  if (stdfs::is_regular_file(config_dir_ / "special_tokens_map.json"))
    copy(config_dir_ / "special_tokens_map.json", dir / "special_tokens_map.json");
  detail::write_tokenizer_config(dir, *this, config_json_, "PreTrainedTokenizerFast");
}

}  // namespace

namespace detail {

std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::filesystem::path& tokenizer_json,
                                             const SpecialTokenConfig& cfg) {
  return std::make_unique<HfTokenizer>(tokenizer_json, cfg);
}

}  // namespace detail
}  // namespace anvil::tokenizer
