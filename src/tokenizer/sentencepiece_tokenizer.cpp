// SentencePiece backend (Debian's libsentencepiece).
#include <sentencepiece_processor.h>

#include <filesystem>

#include "anvil/core/error.h"
#include "backends.h"

namespace anvil::tokenizer {
namespace {

namespace stdfs = std::filesystem;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const stdfs::path& path, const detail::SpecialTokenConfig& cfg)
      : path_(path), config_json_(cfg.config_json) {
    if (!stdfs::is_regular_file(path))
      throw Error(concat(path.string(), ": tokenizer file not found (expected a SentencePiece .model file)"));
    sentencepiece::util::Status status;
    try {
      status = sp_.Load(path.string());
    } catch (const std::exception& e) {  // the library's own checks throw on some damaged models
      throw Error(concat(path.string(), ": not a valid SentencePiece model: ", e.what()));
    }
    if (!status.ok()) throw Error(concat(path.string(), ": not a valid SentencePiece model: ", status.ToString()));
    bos_ = cfg.bos ? resolve(*cfg.bos, "bos_token", cfg) : sp_.bos_id();
    eos_ = cfg.eos ? resolve(*cfg.eos, "eos_token", cfg) : sp_.eos_id();
    pad_ = cfg.pad ? resolve(*cfg.pad, "pad_token", cfg) : sp_.pad_id();
    add_bos_ = cfg.add_bos.value_or(false);
    if (add_bos_ && bos_ < 0)
      throw Error(concat(cfg.source.string(), ": add_bos_token: true, but ", path.string(), " has no BOS token"));
  }

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw Error(concat("SentencePiece encode failed: ", status.ToString()));
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    std::vector<int> keep;
    keep.reserve(ids.size());
    bool has_special = false;
    for (auto id : ids) {
      if (id < 0 || id >= vocab_size()) continue;  // out-of-vocab ids from an untrained head
      const bool special = id == bos_ || id == eos_ || id == pad_;
      if (special && skip_special_tokens) continue;
      has_special = has_special || special;
      keep.push_back(static_cast<int>(id));
    }
    std::string out;
    if (!has_special) {
      const auto status = sp_.Decode(keep, &out);
      if (!status.ok()) throw Error(concat("SentencePiece decode failed: ", status.ToString()));
      return out;
    }
    // SentencePiece decodes control pieces to nothing; write them as their
    // piece text, keeping every other piece's surface (dummy-prefix handling
    // and byte pieces as in a plain decode).
    const auto spt = sp_.DecodeIdsAsImmutableProto(keep);
    for (size_t i = 0; i < spt.pieces_size(); ++i) {
      const auto piece = spt.pieces(static_cast<int>(i));
      const int64_t id = piece.id();
      out += (id == bos_ || id == eos_ || id == pad_) && piece.surface().empty() ? piece.piece() : piece.surface();
    }
    return out;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t bos_id() const override { return bos_; }
  int64_t eos_id() const override { return eos_; }
  int64_t pad_id() const override { return pad_; }
  bool add_bos() const override { return add_bos_; }

  std::optional<int64_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    // PieceToId answers unk_id for every unknown string: only the unk piece
    // itself really maps there.
    if (id < 0 || (id == sp_.unk_id() && sp_.IdToPiece(id) != token)) return std::nullopt;
    return id;
  }

  std::string kind() const override { return "sentencepiece"; }

  void save(const stdfs::path& dir) const override {
    stdfs::create_directories(dir);
    copy_into(path_, dir / "tokenizer.model");  // the name load_tokenizer_from_model_dir looks for
    const auto map = path_.parent_path() / "special_tokens_map.json";
    if (stdfs::is_regular_file(map)) copy_into(map, dir / "special_tokens_map.json");
    // transformers' SentencePieceBackend encodes as sentencepiece itself does
    // (and needs no protobuf to convert the model).
    detail::write_tokenizer_config(dir, *this, config_json_, "SentencePieceBackend");
  }

 private:
  static void copy_into(const stdfs::path& src, const stdfs::path& dst) {
    if (stdfs::exists(dst) && stdfs::equivalent(dst, src)) return;
    stdfs::copy_file(src, dst, stdfs::copy_options::overwrite_existing);
  }

  int64_t resolve(const std::string& token, const char* key, const detail::SpecialTokenConfig& cfg) const {
    const auto id = token_to_id(token);
    if (!id)
      throw Error(concat(cfg.source.string(), ": ", key, ": token \"", token, "\" is not in the vocabulary of ",
                         path_.string()));
    return *id;
  }

  stdfs::path path_;
  std::string config_json_;
  sentencepiece::SentencePieceProcessor sp_;
  int64_t bos_ = -1, eos_ = -1, pad_ = -1;
  bool add_bos_ = false;
};

}  // namespace

namespace detail {

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::filesystem::path& model_file,
                                                        const SpecialTokenConfig& cfg) {
  return std::make_unique<SentencePieceTokenizer>(model_file, cfg);
}

}  // namespace detail
}  // namespace anvil::tokenizer
