// GPT-NeoX / Megatron indexed datasets (token_shards.h), read in place and
// written by `anvil prepare --format megatron`. PREFIX.idx:
//   "MMIDIDX\0\0", uint64 version (1), uint8 dtype code, uint64 sequence
//   count S, uint64 document-index count D, int32 lengths[S] (tokens),
//   int64 pointers[S] (byte offsets into PREFIX.bin), int64 document_indices[D]
//   (0, then the sequence index at which each document ends), and, in
//   multimodal files, int8 modes[S].
// PREFIX.bin: the sequences' tokens back to back.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "data/token_shards.h"

namespace anvil::data {
namespace {

namespace stdfs = std::filesystem;
constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

stdfs::path prefix_of(const stdfs::path& path) {
  auto p = path;
  if (p.extension() == ".bin" || p.extension() == ".idx") p.replace_extension();
  return p;
}
stdfs::path with_suffix(const stdfs::path& prefix, const char* suffix) {
  auto p = prefix;
  p += suffix;
  return p;
}

/// The whole file, mapped read-only (nullptr for an empty file).
const char* map_all(const stdfs::path& p, size_t& bytes) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(concat(p.string(), ": cannot open"));
  struct stat st {};
  ::fstat(fd, &st);
  bytes = static_cast<size_t>(st.st_size);
  void* addr = bytes ? ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  ::close(fd);
  if (addr == MAP_FAILED) throw DataError(concat(p.string(), ": mmap failed"));
  return static_cast<const char*>(addr);
}

struct Unmap {
  const char* p;
  size_t n;
  ~Unmap() {
    if (p) ::munmap(const_cast<char*>(p), n);
  }
};

/// Megatron's DType codes -> (kind, bytes).
bool dtype_of(uint8_t code, char& kind, int& bytes) {
  switch (code) {
    case 1:
      kind = 'u', bytes = 1;
      return true;  // uint8
    case 2:
      kind = 'i', bytes = 1;
      return true;  // int8
    case 3:
      kind = 'i', bytes = 2;
      return true;  // int16
    case 4:
      kind = 'i', bytes = 4;
      return true;  // int32
    case 5:
      kind = 'i', bytes = 8;
      return true;  // int64
    case 6:
      kind = 'f', bytes = 8;
      return true;  // float64
    case 7:
      kind = 'f', bytes = 4;
      return true;  // float32
    case 8:
      kind = 'u', bytes = 2;
      return true;  // uint16
    default:
      return false;
  }
}

template <class T>
T read_at(const char* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

}  // namespace

bool is_megatron_dataset(const stdfs::path& path) {
  const auto prefix = prefix_of(path);
  return stdfs::is_regular_file(with_suffix(prefix, ".idx")) && stdfs::is_regular_file(with_suffix(prefix, ".bin"));
}

std::shared_ptr<const TokenShards> TokenShards::open_megatron(const stdfs::path& path) {
  const auto prefix = prefix_of(path);
  const auto idx_path = with_suffix(prefix, ".idx"), bin_path = with_suffix(prefix, ".bin");
  size_t n = 0;
  const char* idx = map_all(idx_path, n);
  Unmap keep{idx, n};
  auto bad = [&](const std::string& what) { return DataError(concat(idx_path.string(), ": ", what)); };
  constexpr size_t kHead = 9 + 8 + 1 + 8 + 8;
  if (n < kHead || std::memcmp(idx, kMagic, 9) != 0)
    throw bad("not a Megatron indexed dataset index (expected the MMIDIDX header)");
  if (read_at<uint64_t>(idx, 9) != 1) throw bad(concat("version ", read_at<uint64_t>(idx, 9), ", expected 1"));
  std::shared_ptr<TokenShards> ts(new TokenShards());
  ts->dir_ = prefix;
  const auto code = read_at<uint8_t>(idx, 17);
  if (!dtype_of(code, ts->kind_, ts->token_bytes_))
    throw bad(concat("dtype code ", static_cast<int>(code), ", expected 1..8 (megatron's DType)"));
  const auto S = read_at<uint64_t>(idx, 18), D = read_at<uint64_t>(idx, 26);
  if (S > (uint64_t{1} << 40) || D > S + 1 || D < 1) throw bad(concat(S, " sequences and ", D, " document indices"));
  const size_t body = kHead + S * 12 + D * 8;
  if (n != body && n != body + S)  // multimodal files add int8 modes
    throw bad(concat(n, " bytes, expected ", body, " for ", S, " sequences and ", D, " document indices"));
  const size_t lengths = kHead, pointers = kHead + S * 4, docs = pointers + S * 8;
  // Sequences back to back: offsets in tokens, from the pointers.
  std::vector<int64_t> seq_start(S + 1, 0);
  for (uint64_t k = 0; k < S; ++k) {
    const auto len = read_at<int32_t>(idx, lengths + k * 4);
    const auto ptr = read_at<int64_t>(idx, pointers + k * 8);
    if (len < 0 || ptr != seq_start[k] * ts->token_bytes_)
      throw bad(concat("sequence ", k, " has length ", len, " at byte ", ptr, "; expected sequences back to back"));
    seq_start[k + 1] = seq_start[k] + len;
  }
  auto starts = std::make_unique<std::vector<int64_t>>();
  for (uint64_t d = 0; d < D; ++d) {
    const auto at = read_at<int64_t>(idx, docs + d * 8);
    if (at < 0 || static_cast<uint64_t>(at) > S || (d == 0 && at != 0) ||
        (d > 0 && at < read_at<int64_t>(idx, docs + (d - 1) * 8)))
      throw bad(
          concat("document index ", d, " is ", at, "; expected 0, then non-decreasing sequence indices up to ", S));
    starts->push_back(seq_start[static_cast<size_t>(at)]);
  }
  if (starts->back() != seq_start[S])
    throw bad(concat("the documents end at sequence ", read_at<int64_t>(idx, docs + (D - 1) * 8), " of ", S));
  Shard s;
  s.bin = bin_path;
  s.tokens = seq_start[S];
  s.docs = static_cast<int64_t>(D) - 1;
  s.data = map_all(bin_path, s.bin_bytes);
  if (s.bin_bytes != static_cast<size_t>(s.tokens) * static_cast<size_t>(ts->token_bytes_)) {
    if (s.data) ::munmap(const_cast<void*>(s.data), s.bin_bytes);
    throw DataError(concat(bin_path.string(), ": ", s.bin_bytes, " bytes, expected ", s.tokens, " tokens of ",
                           ts->token_bytes_, " bytes (", idx_path.filename().string(), ")"));
  }
  s.starts = starts->data();
  s.idx_bytes = 0;  // built here, not mapped
  ts->owned_starts_.push_back(std::move(starts));
  ts->shards_.push_back(s);  // owned from here: the destructor unmaps the data
  ts->num_tokens_ = s.tokens;
  ts->num_docs_ = s.docs;
  // Every id is checked once: a non-negative integer (floats must be whole).
  const char* data = static_cast<const char*>(s.data);
  for (int64_t i = 0; i < s.tokens; ++i) {
    const auto id = ts->token(s, i);
    const bool whole =
        ts->kind_ != 'f' ||
        (ts->token_bytes_ == 4 ? read_at<float>(data, static_cast<size_t>(i) * 4) == static_cast<float>(id)
                               : read_at<double>(data, static_cast<size_t>(i) * 8) == static_cast<double>(id));
    if (id < 0 || !whole)
      throw DataError(concat(bin_path.string(), ": token ", i, " is not a token id (a non-negative integer)"));
    ts->vocab_size_ = std::max(ts->vocab_size_, id + 1);
  }
  return ts;
}

MegatronWriter::MegatronWriter(stdfs::path prefix, int64_t vocab_size, int64_t eos_id, bool append_eos)
    : prefix_(std::move(prefix)), vocab_size_(vocab_size), eos_id_(eos_id), append_eos_(append_eos) {
  for (const char* suffix : {".bin", ".idx"})
    if (stdfs::exists(with_suffix(prefix_, suffix)))
      throw Error(concat(with_suffix(prefix_, suffix).string(), ": exists; pick a new --output prefix"));
  if (append_eos_ && eos_id_ < 0) throw Error("prepare: the tokenizer has no EOS token to end documents with");
  token_bytes_ = vocab_size_ < 65500 ? 2 : 4;
  tmp_bin_ = with_suffix(prefix_, concat(".bin.tmp-", ::getpid()).c_str());
  tmp_idx_ = with_suffix(prefix_, concat(".idx.tmp-", ::getpid()).c_str());
  if (!prefix_.parent_path().empty()) stdfs::create_directories(prefix_.parent_path());
  bin_ = std::fopen(tmp_bin_.c_str(), "wb");
  if (!bin_) throw Error(concat(tmp_bin_.string(), ": cannot write"));
}

MegatronWriter::~MegatronWriter() {
  if (bin_) std::fclose(bin_);
  if (!finished_) {
    std::error_code ec;
    stdfs::remove(tmp_bin_, ec);
    stdfs::remove(tmp_idx_, ec);
  }
}

void MegatronWriter::add(const std::vector<int64_t>& doc) {
  auto put = [&](int64_t id) {
    if (id < 0 || id >= vocab_size_) throw Error(concat("prepare: token id ", id, " outside the vocabulary"));
    if (token_bytes_ == 2) {
      const auto v = static_cast<uint16_t>(id);
      std::fwrite(&v, 2, 1, bin_);
    } else {
      const auto v = static_cast<int32_t>(id);
      std::fwrite(&v, 4, 1, bin_);
    }
  };
  for (const auto id : doc) put(id);
  if (append_eos_) put(eos_id_);
  const auto len = static_cast<int64_t>(doc.size()) + (append_eos_ ? 1 : 0);
  if (len > INT32_MAX) throw Error("prepare: a document longer than 2^31 tokens");
  lengths_.push_back(static_cast<int32_t>(len));
  tokens_ += len;
}

void MegatronWriter::finish() {
  if (lengths_.empty()) throw Error("prepare: no documents to write");
  if (std::fclose(bin_) != 0) {
    bin_ = nullptr;
    throw Error(concat(tmp_bin_.string(), ": writing failed (disk full?)"));
  }
  bin_ = nullptr;
  std::string idx(kMagic, 9);
  auto put = [&](const auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(static_cast<uint8_t>(token_bytes_ == 2 ? 8 : 4));  // uint16 or int32
  const auto S = static_cast<uint64_t>(lengths_.size());
  put(S);
  put(S + 1);  // document indices: 0, 1, ..., S (one sequence per document)
  for (const auto len : lengths_) put(len);
  int64_t ptr = 0;
  for (const auto len : lengths_) {
    put(ptr);
    ptr += static_cast<int64_t>(len) * token_bytes_;
  }
  for (uint64_t d = 0; d <= S; ++d) put(static_cast<int64_t>(d));
  fs::write_file_atomic(tmp_idx_, idx);
  fs::fsync_path(tmp_bin_);
  stdfs::rename(tmp_bin_, with_suffix(prefix_, ".bin"));
  stdfs::rename(tmp_idx_, with_suffix(prefix_, ".idx"));
  finished_ = true;
}

}  // namespace anvil::data
