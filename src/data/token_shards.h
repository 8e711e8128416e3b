#pragma once
// Pretraining data as memory-mapped token shards, written once by
// `anvil prepare` and streamed by the trainer without loading into RAM.
//
// A shard folder holds meta.json and, per shard, NAME.bin (token ids,
// little-endian uint16 or uint32) and NAME.idx (int64 document start
// offsets, one per document plus the end). Documents end with EOS.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/datasets.h"

namespace anvil::tokenizer {
class Tokenizer;
}  // namespace anvil::tokenizer

namespace anvil::data {

struct ShardWriterOptions {
  int64_t shard_tokens = int64_t{1} << 28;  // a new shard after this many tokens
  bool append_eos = true;
};

/// Writes into a temporary folder beside `dir` and renames it into place on
/// finish(), so a dying prepare never leaves a half-written dataset.
class ShardWriter {
 public:
  ShardWriter(std::filesystem::path dir, int64_t vocab_size, int64_t eos_id, ShardWriterOptions opt = {});
  ~ShardWriter();
  void add(const std::vector<int64_t>& doc);
  /// Closes the last shard, writes meta.json (tokenizer kind, its
  /// tokenizer::fingerprint when given, and the source files recorded) and
  /// renames the folder into place.
  void finish(const std::string& tokenizer_kind, const std::vector<std::string>& sources,
              const std::string& tokenizer_fingerprint = "");
  int64_t num_docs() const { return total_docs_; }
  int64_t num_tokens() const { return total_tokens_; }

 private:
  void close_shard();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t total_docs_ = 0, total_tokens_ = 0;
};

/// GPT-NeoX / Megatron indexed datasets, as their preprocess_data.py and
/// megatron-core's IndexedDatasetBuilder write them (the MMIDIDX format):
/// PREFIX.bin holds every sequence's tokens back to back in one of eight
/// dtypes (uint8, int8, int16, int32, int64, float64, float32, uint16) and
/// PREFIX.idx a header, the sequences' lengths and byte offsets and the
/// sequence index at which each document ends. Whether `path` names one: a
/// PREFIX beside PREFIX.bin and PREFIX.idx, or either file.
bool is_megatron_dataset(const std::filesystem::path& path);

/// Writes documents as a Megatron indexed dataset (`anvil prepare --format
/// megatron`): one sequence per document, uint16 tokens when the vocabulary
/// fits (below 65500, as megatron's best_fitting_dtype) else int32. The two
/// files appear together on finish() (written beside, then renamed).
class MegatronWriter {
 public:
  MegatronWriter(std::filesystem::path prefix, int64_t vocab_size, int64_t eos_id, bool append_eos);
  ~MegatronWriter();
  void add(const std::vector<int64_t>& doc);
  void finish();
  int64_t num_docs() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return tokens_; }

 private:
  std::filesystem::path prefix_, tmp_bin_, tmp_idx_;
  int64_t vocab_size_, eos_id_;
  bool append_eos_, finished_ = false;
  int token_bytes_;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
  std::FILE* bin_ = nullptr;
};

/// MosaicML streaming (MDS) folders, as mosaicml-streaming's MDSWriter writes
/// them (llm-foundry's convert_dataset_hf --concat_tokens among others):
/// index.json lists the shards, each a file of samples whose columns follow
/// a per-sample header; shards may be zstd-compressed. Whether `path` is a
/// folder whose index.json lists MDS shards.
bool is_mds_dataset(const std::filesystem::path& path);

struct MdsOptions {
  /// The column holding each sample's token ids (llm-foundry's name).
  std::string column = "tokens";
  /// Token dtype of a `bytes` column, which stores none (llm-foundry's
  /// token_encoding_type default); ndarray columns carry their own.
  std::string bytes_dtype = "int64";
};

/// The shards of a folder, memory-mapped (read-only).
class TokenShards {
 public:
  /// Validates meta.json and every file's size; errors name the file.
  static std::shared_ptr<const TokenShards> open(const std::filesystem::path& dir);
  /// A Megatron indexed dataset (is_megatron_dataset), read in place as one
  /// shard with its document boundaries; every token id is checked to be a
  /// non-negative integer (vocab_size() is the largest + 1). Errors name the
  /// file and what was expected.
  static std::shared_ptr<const TokenShards> open_megatron(const std::filesystem::path& path);
  /// An MDS folder (is_mds_dataset), read in place: one shard per MDS shard,
  /// one document per sample (its tokens column, flattened row by row).
  /// Uncompressed shards are memory-mapped; zstd shards are decompressed into
  /// memory, unless the decompressed file lies beside them (streaming's cache
  /// keeps it). All samples must hold one token dtype; every id is checked to
  /// be a non-negative integer below 2^31 (vocab_size() is the largest + 1).
  /// Errors name the file and what was expected.
  static std::shared_ptr<const TokenShards> open_mds(const std::filesystem::path& dir, const MdsOptions& opt = {});
  ~TokenShards();

  struct Shard {
    std::filesystem::path bin;
    int64_t tokens = 0;
    int64_t docs = 0;
    const void* data = nullptr;       // tokens
    const int64_t* starts = nullptr;  // docs + 1 offsets
    /// Where each document's tokens begin in `data`, in bytes, when documents
    /// do not lie back to back (MDS samples keep headers and other columns
    /// between them); null when they do.
    const int64_t* doc_bytes = nullptr;
    size_t bin_bytes = 0, idx_bytes = 0;
  };
  const std::vector<Shard>& shards() const { return shards_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_docs() const { return num_docs_; }
  int64_t vocab_size() const { return vocab_size_; }
  /// The tokenizer meta.json records (anvil shards; empty elsewhere, and
  /// the fingerprint in shards older than it): its kind, its
  /// tokenizer::fingerprint, and the EOS id (-2 when unknown).
  const std::string& tokenizer_kind() const { return tokenizer_kind_; }
  const std::string& tokenizer_fingerprint() const { return tokenizer_fingerprint_; }
  int64_t eos_id() const { return eos_id_; }
  int token_bytes() const { return token_bytes_; }
  int64_t token(const Shard& s, int64_t i) const;
  /// Tokens [start, start + n) of `s` into out.
  void read(const Shard& s, int64_t start, int64_t n, int64_t* out) const;

 private:
  TokenShards() = default;
  std::filesystem::path dir_;
  std::vector<Shard> shards_;
  int64_t num_tokens_ = 0, num_docs_ = 0, vocab_size_ = 0, eos_id_ = -2;
  std::string tokenizer_kind_, tokenizer_fingerprint_;
  int token_bytes_ = 2;
  char kind_ = 'u';  // token ids stored as unsigned ('u') or signed ('i') integers, or floats ('f')
  std::vector<std::unique_ptr<std::vector<int64_t>>> owned_starts_;  // document offsets (and doc_bytes) built at open
};

/// Throws a DataError naming `where`, both tokenizers and `anvil prepare`
/// when anvil shards were written with another tokenizer than `tok`: another
/// fingerprint (tokenizer::fingerprint) where meta.json records one, else
/// another vocabulary size or, where documents end with EOS, another EOS id.
void check_shard_tokenizer(const TokenShards& shards, const tokenizer::Tokenizer& tok, const std::string& where);

/// Fixed windows of `seq_len` tokens over each shard (the tail that does not
/// fill a window is unused); every token is a target. doc_starts mark where
/// documents begin inside a window (used when packing is on).
class PretrainDataset final : public LmDataset {
 public:
  PretrainDataset(std::shared_ptr<const TokenShards> shards, int64_t seq_len, std::string name);
  int64_t size() const override { return total_; }
  int64_t length(int64_t) const override { return seq_len_; }
  void get(int64_t i, LmSample& out) const override;
  std::string name() const override { return name_; }

 private:
  std::shared_ptr<const TokenShards> shards_;
  int64_t seq_len_;
  std::vector<int64_t> first_window_;  // per shard, prefix sums of window counts
  int64_t total_ = 0;
  std::string name_;
};

}  // namespace anvil::data
