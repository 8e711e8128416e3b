#pragma once
// The tokenizer interface every backend implements: SentencePiece `.model`
// files and Hugging Face `tokenizer.json` (byte-level BPE).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Text -> ids, exactly as Hugging Face's `encode(text, add_special_tokens=False)`
  /// (or sentencepiece's `encode`): added and special tokens written in the
  /// text are recognised, no BOS/EOS is added.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// Ids -> text. With `skip_special_tokens`, special tokens (BOS, EOS, PAD
  /// and added tokens marked special) are dropped.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;
  std::string decode(const std::vector<int64_t>& ids) const { return decode(ids, true); }

  virtual int64_t vocab_size() const = 0;
  virtual int64_t bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int64_t eos_id() const = 0;
  virtual int64_t pad_id() const = 0;
  /// Whether the model expects BOS in front of every sequence (LLaMA does,
  /// GPT-2 does not): tokenizer_config.json's add_bos_token or the
  /// tokenizer.json post-processor.
  virtual bool add_bos() const = 0;
  /// The id batches are padded with, everywhere (training, eval, generation,
  /// scoring): PAD, else EOS, else 0. Padding is never trained on or attended to.
  int64_t padding_id() const { return pad_id() >= 0 ? pad_id() : eos_id() >= 0 ? eos_id() : 0; }

  /// The id of a token written as its vocabulary string (e.g. "<|im_start|>"),
  /// or nothing when the vocabulary has no such single token.
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  /// Which backend this is: "sentencepiece" or "hf".
  virtual std::string kind() const = 0;

  /// Writes the tokenizer into a model folder, so the folder is self-contained
  /// and loads in transformers' AutoTokenizer: tokenizer.model or
  /// tokenizer.json, and a complete tokenizer_config.json (the source's keys,
  /// plus tokenizer_class, the special tokens, add_bos_token and
  /// chat_template).
  virtual void save(const std::filesystem::path& dir) const = 0;

  /// The Jinja chat template recorded with the tokenizer (tokenizer_config.json's
  /// `chat_template`), empty when there is none. save() writes it.
  const std::string& chat_template() const { return chat_template_; }
  void set_chat_template(std::string jinja) { chat_template_ = std::move(jinja); }

 private:
  std::string chat_template_;
};

/// A hash of what a tokenizer maps ids to: the vocabulary size, BOS, EOS
/// and PAD, and every id's decoded text (special tokens kept), as 16 hex
/// digits (FNV-1a, 64 bits). Two tokenizers with the same fingerprint give
/// token ids the same meaning; data prepared with one trains with the other.
std::string fingerprint(const Tokenizer& tok);

/// Loads a tokenizer from a file or a folder. `type` is "auto" (a folder is
/// searched as by load_tokenizer_from_model_dir, a `.json` file is a Hugging
/// Face tokenizer.json, anything else a SentencePiece model), "hf" or
/// "sentencepiece". Errors name the file and what was expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const std::filesystem::path& path);

/// Finds the tokenizer of a model folder: tokenizer.json first, then
/// tokenizer.model; tokenizer_config.json / special_tokens_map.json beside
/// them set BOS/EOS/PAD and add_bos_token. Throws if there is none.
std::unique_ptr<Tokenizer> load_tokenizer_from_model_dir(const std::filesystem::path& dir);

/// `base` with `tokens` added as special tokens, as transformers'
/// add_special_tokens does (tokenizer.add_special_tokens): a token the
/// vocabulary already has as one piece keeps its id, the others get ids
/// vocab_size(), vocab_size() + 1, ... in order. They are matched in text
/// before the base tokenizer sees it, decode as written (dropped with
/// skip_special_tokens), and save() records them (tokenizer.json's
/// added_tokens, or added_tokens.json beside tokenizer.model, and
/// tokenizer_config.json), so the saved folder loads with them.
std::unique_ptr<Tokenizer> with_special_tokens(std::unique_ptr<Tokenizer> base, const std::vector<std::string>& tokens);

/// Whether `dir` holds tokenizer files load_tokenizer_from_model_dir can read.
bool has_tokenizer(const std::filesystem::path& dir);

}  // namespace anvil::tokenizer
