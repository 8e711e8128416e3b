#include "data/token_shards.h"
#include "anvil/tokenizer/tokenizer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "anvil/core/error.h"
#include "core/fs.h"

namespace anvil::data {
namespace stdfs = std::filesystem;

namespace {

constexpr const char* kFormat = "anvil-token-shards";

std::string shard_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_%05zu", i);
  return buf;
}

}  // namespace

struct ShardWriter::Impl {
  stdfs::path dir, tmp;
  int64_t vocab_size, eos_id;
  ShardWriterOptions opt;
  int token_bytes;
  std::ofstream bin;
  std::vector<int64_t> starts;  // current shard
  int64_t shard_tokens = 0;
  nlohmann::json shards = nlohmann::json::array();
  bool finished = false;
};

ShardWriter::ShardWriter(stdfs::path dir, int64_t vocab_size, int64_t eos_id, ShardWriterOptions opt)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  if (stdfs::exists(dir) && !(stdfs::is_directory(dir) && stdfs::is_empty(dir)))
    throw Error(concat(dir.string(), ": output exists and is not an empty folder; pick a new --output"));
  m.dir = dir;
  m.tmp = dir;
  m.tmp += concat(".tmp-", ::getpid());
  stdfs::remove_all(m.tmp);
  stdfs::create_directories(m.tmp);
  m.vocab_size = vocab_size;
  m.eos_id = eos_id;
  m.opt = opt;
  m.token_bytes = vocab_size <= 65536 ? 2 : 4;
  if (opt.append_eos && eos_id < 0) throw Error("prepare: the tokenizer has no EOS token to end documents with");
}

ShardWriter::~ShardWriter() {
  if (impl_ && !impl_->finished) {
    impl_->bin.close();
    std::error_code ec;
    stdfs::remove_all(impl_->tmp, ec);
  }
}

void ShardWriter::add(const std::vector<int64_t>& doc) {
  auto& m = *impl_;
  if (!m.bin.is_open()) {
    m.bin.open(m.tmp / (shard_name(m.shards.size()) + ".bin"), std::ios::binary);
    if (!m.bin) throw Error(concat(m.tmp.string(), ": cannot write shard"));
    m.starts.assign(1, 0);
    m.shard_tokens = 0;
  }
  auto put = [&](int64_t id) {
    if (id < 0 || id >= m.vocab_size) throw Error(concat("prepare: token id ", id, " outside the vocabulary"));
    if (m.token_bytes == 2) {
      const auto v = static_cast<uint16_t>(id);
      m.bin.write(reinterpret_cast<const char*>(&v), 2);
    } else {
      const auto v = static_cast<uint32_t>(id);
      m.bin.write(reinterpret_cast<const char*>(&v), 4);
    }
  };
  for (auto id : doc) put(id);
  if (m.opt.append_eos) put(m.eos_id);
  const auto n = static_cast<int64_t>(doc.size()) + (m.opt.append_eos ? 1 : 0);
  m.shard_tokens += n;
  m.starts.push_back(m.shard_tokens);
  total_tokens_ += n;
  ++total_docs_;
  if (m.shard_tokens >= m.opt.shard_tokens) close_shard();
}

void ShardWriter::close_shard() {
  auto& m = *impl_;
  if (!m.bin.is_open()) return;
  m.bin.close();
  if (!m.bin) throw Error(concat(m.tmp.string(), ": writing a shard failed (disk full?)"));
  const auto name = shard_name(m.shards.size());
  std::ofstream idx(m.tmp / (name + ".idx"), std::ios::binary);
  idx.write(reinterpret_cast<const char*>(m.starts.data()), static_cast<std::streamsize>(m.starts.size() * 8));
  idx.close();
  if (!idx) throw Error(concat(m.tmp.string(), ": writing an index failed (disk full?)"));
  m.shards.push_back({{"name", name}, {"tokens", m.shard_tokens}, {"docs", static_cast<int64_t>(m.starts.size()) - 1}});
}

void ShardWriter::finish(const std::string& tokenizer_kind, const std::vector<std::string>& sources,
                         const std::string& tokenizer_fingerprint) {
  auto& m = *impl_;
  close_shard();
  if (total_docs_ == 0) throw Error("prepare: no documents to write");
  nlohmann::json meta = {{"format", kFormat},
                         {"version", 1},
                         {"dtype", m.token_bytes == 2 ? "uint16" : "uint32"},
                         {"vocab_size", m.vocab_size},
                         {"eos_id", m.eos_id},
                         {"eos_appended", m.opt.append_eos},
                         {"num_docs", total_docs_},
                         {"num_tokens", total_tokens_},
                         {"tokenizer", tokenizer_kind},
                         {"sources", sources},
                         {"shards", m.shards}};
  if (!tokenizer_fingerprint.empty()) meta["tokenizer_fingerprint"] = tokenizer_fingerprint;
  fs::write_file_atomic(m.tmp / "meta.json", meta.dump(2) + "\n");
  if (stdfs::exists(m.dir)) stdfs::remove(m.dir);  // an empty folder (checked in the constructor)
  stdfs::rename(m.tmp, m.dir);
  m.finished = true;
}

// ---- reading -------------------------------------------------------------------

namespace {

const void* map_file(const stdfs::path& p, size_t expected_bytes, size_t& mapped) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(concat(p.string(), ": cannot open token shard"));
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != expected_bytes) {
    ::close(fd);
    throw DataError(concat(p.string(), ": expected ", expected_bytes, " bytes (from meta.json), found ", st.st_size,
                           "; the shard folder is damaged, re-run anvil prepare"));
  }
  mapped = expected_bytes;
  if (expected_bytes == 0) {
    ::close(fd);
    return nullptr;
  }
  void* addr = ::mmap(nullptr, expected_bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) throw DataError(concat(p.string(), ": mmap failed"));
  return addr;
}

}  // namespace

std::shared_ptr<const TokenShards> TokenShards::open(const stdfs::path& dir) {
  const auto meta_path = dir / "meta.json";
  if (!stdfs::is_regular_file(meta_path))
    throw DataError(
        concat(dir.string(), stdfs::is_regular_file(dir / "index.json")
                                 ? ": holds an index.json that lists no MDS shards, and no meta.json of "
                                   "token shards (anvil prepare writes those)"
                                 : ": not a token shard folder (no meta.json; write one with anvil prepare)"));
  auto meta = nlohmann::json::parse(fs::read_file(meta_path), nullptr, false);
  auto bad = [&](const std::string& key, const std::string& what) {
    return DataError(concat(meta_path.string(), ": ", key, ": ", what));
  };
  if (meta.is_discarded() || !meta.is_object()) throw bad("(file)", "expected a JSON object");
  const auto text = [&](const char* key) {
    const auto it = meta.find(key);
    return it != meta.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (text("format") != kFormat) throw bad("format", concat("expected \"", kFormat, "\""));
  const auto dtype = text("dtype");
  if (dtype != "uint16" && dtype != "uint32") throw bad("dtype", "expected uint16 or uint32");
  if (!meta.contains("shards") || !meta["shards"].is_array()) throw bad("shards", "expected a list");
  std::shared_ptr<TokenShards> ts(new TokenShards());
  ts->dir_ = dir;
  ts->token_bytes_ = dtype == "uint16" ? 2 : 4;
  if (!meta.contains("vocab_size") || !meta["vocab_size"].is_number_integer() || meta["vocab_size"].get<int64_t>() < 1)
    throw bad("vocab_size", "expected a positive integer");
  ts->vocab_size_ = meta["vocab_size"].get<int64_t>();
  ts->tokenizer_kind_ = text("tokenizer");
  ts->tokenizer_fingerprint_ = text("tokenizer_fingerprint");
  if (meta.contains("eos_id") && meta["eos_id"].is_number_integer()) ts->eos_id_ = meta["eos_id"].get<int64_t>();
  for (size_t i = 0; i < meta["shards"].size(); ++i) {
    const auto& j = meta["shards"][i];
    const auto key = concat("shards[", i, "]");
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("tokens") ||
        !j["tokens"].is_number_integer() || !j.contains("docs") || !j["docs"].is_number_integer())
      throw bad(key, "expected {name, tokens, docs}");
    // A file name inside this folder, and counts whose byte sizes fit a size_t.
    const auto name = j["name"].get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      throw bad(key + ".name", concat("expected a file name inside the folder, got \"", name, "\""));
    constexpr int64_t kMaxCount = int64_t{1} << 50;
    for (const char* count : {"tokens", "docs"})
      if (j[count].get<int64_t>() < 0 || j[count].get<int64_t>() > kMaxCount)
        throw bad(concat(key, ".", count), concat("expected an integer in [0, 2^50], got ", j[count].dump()));
    Shard s;
    s.tokens = j["tokens"].get<int64_t>();
    s.docs = j["docs"].get<int64_t>();
    s.bin = dir / (name + ".bin");
    s.data = map_file(s.bin, static_cast<size_t>(s.tokens) * static_cast<size_t>(ts->token_bytes_), s.bin_bytes);
    const auto idx = dir / (name + ".idx");
    s.starts = static_cast<const int64_t*>(map_file(idx, static_cast<size_t>(s.docs + 1) * 8, s.idx_bytes));
    if (s.starts[0] != 0 || s.starts[s.docs] != s.tokens || !std::is_sorted(s.starts, s.starts + s.docs + 1))
      throw DataError(
          concat(idx.string(), ": document offsets do not span the shard's ", s.tokens, " tokens in order"));
    // Every id is checked here, once, so a damaged or foreign shard is named
    // before training instead of failing as an out-of-range index at step N.
    for (int64_t i = 0; i < s.tokens; ++i)
      if (const auto id = ts->token(s, i); id >= ts->vocab_size_)
        throw DataError(concat(s.bin.string(), ": token ", i, " is id ", id, ", outside the vocabulary of ",
                               ts->vocab_size_, " that meta.json declares; re-run anvil prepare"));
    ts->num_tokens_ += s.tokens;
    ts->num_docs_ += s.docs;
    ts->shards_.push_back(s);
  }
  return ts;
}

TokenShards::~TokenShards() {
  for (auto& s : shards_) {
    if (s.data && s.bin_bytes) ::munmap(const_cast<void*>(s.data), s.bin_bytes);
    if (s.starts && s.idx_bytes) ::munmap(const_cast<int64_t*>(s.starts), s.idx_bytes);  // 0: built, not mapped
  }
}

namespace {
template <class T>
int64_t load_as(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<int64_t>(v);
}

int64_t load_token(const char* p, char kind, int bytes) {
  if (kind == 'u') {
    if (bytes == 2) return load_as<uint16_t>(p);
    if (bytes == 4) return load_as<uint32_t>(p);
    return bytes == 1 ? load_as<uint8_t>(p) : load_as<uint64_t>(p);
  }
  if (kind == 'i') {
    if (bytes == 4) return load_as<int32_t>(p);
    if (bytes == 2) return load_as<int16_t>(p);
    return bytes == 1 ? load_as<int8_t>(p) : load_as<int64_t>(p);
  }
  return bytes == 4 ? load_as<float>(p) : load_as<double>(p);
}
}  // namespace

int64_t TokenShards::token(const Shard& s, int64_t i) const {
  const char* base = static_cast<const char*>(s.data);
  if (!s.doc_bytes) return load_token(base + i * token_bytes_, kind_, token_bytes_);
  const auto d = std::upper_bound(s.starts, s.starts + s.docs + 1, i) - s.starts - 1;
  return load_token(base + s.doc_bytes[d] + (i - s.starts[d]) * token_bytes_, kind_, token_bytes_);
}

void TokenShards::read(const Shard& s, int64_t start, int64_t n, int64_t* out) const {
  const char* base = static_cast<const char*>(s.data);
  if (!s.doc_bytes) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_token(base + (start + i) * token_bytes_, kind_, token_bytes_);
    return;
  }
  auto d = std::upper_bound(s.starts, s.starts + s.docs + 1, start) - s.starts - 1;
  for (int64_t i = start; i < start + n; ++i) {
    while (i >= s.starts[d + 1]) ++d;  // skips empty documents too
    *out++ = load_token(base + s.doc_bytes[d] + (i - s.starts[d]) * token_bytes_, kind_, token_bytes_);
  }
}

PretrainDataset::PretrainDataset(std::shared_ptr<const TokenShards> shards, int64_t seq_len, std::string name)
    : shards_(std::move(shards)), seq_len_(seq_len), name_(std::move(name)) {
  for (const auto& s : shards_->shards()) {
    first_window_.push_back(total_);
    total_ += s.tokens / seq_len_;
  }
  if (total_ == 0)
    throw DataError(concat(name_, ": ", shards_->num_tokens(), " tokens do not fill one window of ", seq_len_,
                           " (data.max_length)"));
}

void PretrainDataset::get(int64_t i, LmSample& out) const {
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), i) - 1;
  const auto& s = shards_->shards()[static_cast<size_t>(it - first_window_.begin())];
  const auto start = (i - *it) * seq_len_;
  out.input_ids.resize(static_cast<size_t>(seq_len_));
  shards_->read(s, start, seq_len_, out.input_ids.data());
  out.labels = out.input_ids;
  out.doc_starts.assign(1, 0);
  // Documents that begin inside the window (start, start + seq_len).
  const auto* first = std::upper_bound(s.starts, s.starts + s.docs + 1, start);
  for (const auto* p = first; p < s.starts + s.docs + 1 && *p < start + seq_len_; ++p)
    out.doc_starts.push_back(*p - start);
}

void check_shard_tokenizer(const TokenShards& shards, const tokenizer::Tokenizer& tok, const std::string& where) {
  const auto ours = tokenizer::fingerprint(tok);
  const auto& theirs = shards.tokenizer_fingerprint();
  const bool other = !theirs.empty() ? theirs != ours
                                     : shards.vocab_size() != tok.vocab_size() ||
                                           (shards.eos_id() >= 0 && shards.eos_id() != tok.eos_id());
  if (!other) return;
  const auto kind = shards.tokenizer_kind().empty() ? std::string("a") : "a " + shards.tokenizer_kind();
  throw DataError(concat(where, ": the shards were written with another tokenizer than this run's (meta.json: ", kind,
                         " tokenizer of ", shards.vocab_size(), " tokens, EOS ", shards.eos_id(),
                         theirs.empty() ? std::string() : ", fingerprint " + theirs, "; tokenizer.path: a ", tok.kind(),
                         " tokenizer of ", tok.vocab_size(), " tokens, EOS ", tok.eos_id(), ", fingerprint ", ours,
                         "); the ids would mean other tokens. Re-run anvil prepare with the run's tokenizer"));
}

}  // namespace anvil::data
