// SentencePiece backend (Debian's libsentencepiece).
#include <sentencepiece_processor.h>

#include <filesystem>

#include "anvil/core/error.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::tokenizer {
namespace {

constexpr const char* kModelFile = "tokenizer.model";

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& path) : path_(path) {
    if (!std::filesystem::is_regular_file(path))
      throw Error(concat(path.string(), ": tokenizer file not found (expected a SentencePiece .model file)"));
    const auto status = sp_.Load(path.string());
    if (!status.ok())
      throw Error(concat(path.string(), ": not a valid SentencePiece model: ", status.ToString()));
  }

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw Error(concat("SentencePiece encode failed: ", status.ToString()));
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> keep;
    keep.reserve(ids.size());
    for (auto id : ids) {
      if (id == bos_id() || id == eos_id() || id == pad_id()) continue;
      if (id < 0 || id >= vocab_size()) continue;  // out-of-vocab ids from an untrained head
      keep.push_back(static_cast<int>(id));
    }
    std::string out;
    const auto status = sp_.Decode(keep, &out);
    if (!status.ok()) throw Error(concat("SentencePiece decode failed: ", status.ToString()));
    return out;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t bos_id() const override { return sp_.bos_id(); }
  int64_t eos_id() const override { return sp_.eos_id(); }
  int64_t pad_id() const override { return sp_.pad_id(); }

  void save(const std::filesystem::path& dir) const override {
    const auto dst = dir / kModelFile;
    if (std::filesystem::exists(dst) && std::filesystem::equivalent(dst, path_)) return;
    std::filesystem::copy_file(path_, dst, std::filesystem::copy_options::overwrite_existing);
  }

 private:
  std::filesystem::path path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const std::filesystem::path& path) {
  if (type == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(path);
  throw ConfigError(concat("tokenizer.type: unknown tokenizer type \"", type, "\"; expected sentencepiece"));
}

bool has_tokenizer(const std::filesystem::path& dir) { return std::filesystem::exists(dir / kModelFile); }

std::unique_ptr<Tokenizer> load_tokenizer_from_model_dir(const std::filesystem::path& dir) {
  const auto sp = dir / kModelFile;
  if (std::filesystem::exists(sp)) return std::make_unique<SentencePieceTokenizer>(sp);
  throw Error(concat(dir.string(), ": no tokenizer found (expected ", kModelFile, ")"));
}

}  // namespace anvil::tokenizer
