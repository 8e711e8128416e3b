#pragma once
// The tokenizer interface every backend implements.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Text -> ids, without BOS/EOS. encode(a) + encode(b) decodes to a + b for
  /// the bundled tokenizers (no dummy prefix).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// Ids -> text; special tokens (BOS, EOS, PAD) are dropped.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;

  virtual int64_t vocab_size() const = 0;
  virtual int64_t bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int64_t eos_id() const = 0;
  virtual int64_t pad_id() const = 0;

  /// Copies the tokenizer's files into a model folder, so the folder is
  /// self-contained (HF layout: tokenizer.model for SentencePiece).
  virtual void save(const std::filesystem::path& dir) const = 0;
};

/// Loads a tokenizer of `type` ("sentencepiece") from `path`.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const std::filesystem::path& path);

/// Finds the tokenizer of a model folder (tokenizer.model); throws if none.
std::unique_ptr<Tokenizer> load_tokenizer_from_model_dir(const std::filesystem::path& dir);

/// Whether `dir` holds tokenizer files load_tokenizer_from_model_dir can read.
bool has_tokenizer(const std::filesystem::path& dir);

}  // namespace anvil::tokenizer
