// MosaicML streaming (MDS) folders (token_shards.h), read in place.
// index.json: {"version": 2, "shards": [{"format": "mds", "version": 2,
//   "column_names", "column_encodings", "column_sizes" (null: size varies),
//   "samples", "compression" (null, "zstd", "zstd:LEVEL", ...),
//   "raw_data": {"basename", "bytes"}, "zip_data": {"basename", "bytes"} or
//   null}]}; basenames are relative to the folder.
// A shard (raw_data): uint32 sample count N, uint32 offsets[N + 1] (where
//   each sample begins in the file; the last is the file size), the writer's
//   config as JSON, the samples. A sample: one uint32 size per column of
//   varying size, then every column's bytes, in column order.
// An ndarray column: [dtype code: uint8, unless the encoding fixes it]
//   [ndim << 2 | log2 of the shape's uint size: uint8, shape: ndim uints,
//   unless the encoding fixes it] values, row-major.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "data/token_shards.h"

namespace anvil::data {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr int64_t kMaxTokenId = int64_t{1} << 31;

struct Dtype {
  char kind = 0;  // 'u' unsigned, 'i' signed; 0 unknown or unsupported
  int bytes = 0;
};

/// The integer dtypes token ids come in, by numpy name.
Dtype dtype_named(const std::string& name) {
  static const std::pair<const char*, Dtype> kNames[] = {
      {"uint8", {'u', 1}},  {"int8", {'i', 1}},  {"uint16", {'u', 2}}, {"int16", {'i', 2}},
      {"uint32", {'u', 4}}, {"int32", {'i', 4}}, {"uint64", {'u', 8}}, {"int64", {'i', 8}}};
  for (const auto& [n, d] : kNames)
    if (name == n) return d;
  return {};
}

/// streaming's NDArray value dtype codes (encodings.py, _int2value_dtype).
const char* dtype_of_code(uint8_t code) {
  switch (code) {
    case 8:
      return "uint8";
    case 9:
      return "int8";
    case 16:
      return "uint16";
    case 17:
      return "int16";
    case 18:
      return "float16";
    case 32:
      return "uint32";
    case 33:
      return "int32";
    case 34:
      return "float32";
    case 64:
      return "uint64";
    case 65:
      return "int64";
    case 66:
      return "float64";
    default:
      return nullptr;
  }
}

/// A bytes column does not say its dtype: what a wrong guess looks like.
std::string bytes_hint(const std::string& dtype) {
  return concat("; a bytes column is read as ", dtype,
                " tokens (llm-foundry's token_encoding_type, default int64): set data.train[i].token_dtype");
}

/// How the token column of one shard is encoded: `bytes`, `ndarray`,
/// `ndarray:DTYPE` or `ndarray:DTYPE:D0,D1,...`.
struct TokenEncoding {
  bool ndarray = false;
  std::optional<std::string> dtype;  // fixed by the encoding (or, for bytes, by MdsOptions)
  std::optional<int64_t> count;      // values per sample, when the encoding fixes the shape
};

template <class T>
T read_le(const char* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

/// A read-only mapping of a whole file, or of memory filled by decompression;
/// TokenShards' destructor unmaps either.
struct Mapping {
  const char* data = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (data) ::munmap(const_cast<char*>(data), bytes);
  }
  void release() { data = nullptr; }
};

void map_file(const stdfs::path& p, Mapping& m) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(concat(p.string(), ": cannot open MDS shard"));
  struct stat st {};
  ::fstat(fd, &st);
  m.bytes = static_cast<size_t>(st.st_size);
  void* addr = m.bytes ? ::mmap(nullptr, m.bytes, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  ::close(fd);
  if (addr == MAP_FAILED) throw DataError(concat(p.string(), ": mmap failed"));
  m.data = static_cast<const char*>(addr);
}

/// Decompresses a zstd shard into anonymous memory of `raw_bytes`.
void decompress_zstd(const stdfs::path& zip, size_t raw_bytes, Mapping& out) {
  Mapping in;
  map_file(zip, in);
  void* addr = ::mmap(nullptr, raw_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED)
    throw DataError(concat(zip.string(), ": cannot allocate ", raw_bytes, " bytes to decompress"));
  out.data = static_cast<const char*>(addr);
  out.bytes = raw_bytes;
  const size_t n = ZSTD_decompress(addr, raw_bytes, in.data, in.bytes);
  if (ZSTD_isError(n))
    throw DataError(concat(zip.string(), ": does not decompress (zstd: ", ZSTD_getErrorName(n), "); expected ",
                           raw_bytes, " bytes (index.json raw_data.bytes)"));
  if (n != raw_bytes)
    throw DataError(concat(zip.string(), ": decompresses to ", n, " bytes, index.json says ", raw_bytes));
  ::mprotect(addr, raw_bytes, PROT_READ);
}

/// index.json, with errors that name it and the key.
class Index {
 public:
  explicit Index(const stdfs::path& dir) : path_(dir / "index.json") {
    if (!stdfs::is_regular_file(path_)) throw DataError(concat(dir.string(), ": no index.json (not an MDS folder)"));
    j_ = json::parse(fs::read_file(path_), nullptr, false);
    if (j_.is_discarded() || !j_.is_object() || !j_.contains("shards") || !j_["shards"].is_array())
      throw bad("(file)", "expected a JSON object with a list \"shards\"");
  }
  const json& shards() const { return j_["shards"]; }
  DataError bad(const std::string& key, const std::string& what) const {
    return DataError(concat(path_.string(), ": ", key, ": ", what));
  }

 private:
  stdfs::path path_;
  json j_;
};

std::string text_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// A file of the folder named by index.json: relative, never leaving it.
stdfs::path file_in(const stdfs::path& dir, const Index& index, const std::string& key, const json& info) {
  if (!info.is_object() || !info.contains("basename") || !info["basename"].is_string() || !info.contains("bytes") ||
      !info["bytes"].is_number_unsigned())
    throw index.bad(key, "expected {basename, bytes}");
  const stdfs::path name = info["basename"].get<std::string>();
  bool inside = !name.empty() && name.is_relative();
  for (const auto& part : name)
    if (part == "..") inside = false;
  if (!inside || name.string().find('\0') != std::string::npos)
    throw index.bad(key + ".basename", concat("expected a file inside the folder, got \"", name.string(), "\""));
  return dir / name;
}

/// The shard's bytes: the raw file when it is there (uncompressed shards, or
/// streaming's cache that kept the decompressed copy), else the zstd file
/// decompressed.
void load_shard(const stdfs::path& dir, const Index& index, size_t i, Mapping& out, stdfs::path& file) {
  const auto& j = index.shards()[i];
  const auto key = concat("shards[", i, "]");
  file = file_in(dir, index, key + ".raw_data", j.value("raw_data", json()));
  const auto raw_bytes = j["raw_data"]["bytes"].get<size_t>();
  const auto compression = text_field(j, "compression");
  const auto zip = j.value("zip_data", json());
  if (stdfs::is_regular_file(file) || compression.empty() || zip.is_null()) {
    map_file(file, out);
    if (out.bytes != raw_bytes)
      throw DataError(
          concat(file.string(), ": ", out.bytes, " bytes, index.json says ", raw_bytes, "; the MDS folder is damaged"));
    return;
  }
  if (compression != "zstd" && compression.rfind("zstd:", 0) != 0)
    throw index.bad(key + ".compression",
                    concat("\"", compression, "\": Anvil decompresses zstd shards; decompress these beside ", "them (",
                           file.filename().string(), ") or write the folder with compression zstd"));
  const auto zip_file = file_in(dir, index, key + ".zip_data", zip);
  if (!stdfs::is_regular_file(zip_file))
    throw DataError(
        concat(zip_file.string(), ": missing (neither it nor ", file.filename().string(), " is in the folder)"));
  if (stdfs::file_size(zip_file) != zip["bytes"].get<size_t>())
    throw DataError(concat(zip_file.string(), ": ", stdfs::file_size(zip_file), " bytes, index.json says ",
                           zip["bytes"].get<size_t>(), "; the MDS folder is damaged"));
  file = zip_file;
  decompress_zstd(zip_file, raw_bytes, out);
}

/// The token column's encoding: bytes, ndarray, ndarray:DTYPE or
/// ndarray:DTYPE:D0,D1,...
template <class Bad>
TokenEncoding token_encoding(const std::string& enc, const MdsOptions& opt, const Bad& bad) {
  TokenEncoding e;
  const auto colon = enc.find(':');
  const auto head = enc.substr(0, colon);
  if (head == "bytes" && colon == std::string::npos) {
    if (!dtype_named(opt.bytes_dtype).kind)
      throw bad(concat("bytes: the token dtype \"", opt.bytes_dtype, "\" is not an integer dtype"));
    e.dtype = opt.bytes_dtype;
    return e;
  }
  auto unsupported = [&] {
    return bad(concat("column \"", opt.column, "\" is encoded \"", enc,
                      "\"; expected token ids as bytes, ndarray or ndarray:DTYPE[:SHAPE] of an integer dtype (uint8 "
                      "... int64)"));
  };
  if (head != "ndarray") throw unsupported();
  e.ndarray = true;
  if (colon == std::string::npos) return e;
  const auto rest = enc.substr(colon + 1);
  const auto colon2 = rest.find(':');
  e.dtype = rest.substr(0, colon2);
  if (!dtype_named(*e.dtype).kind) throw unsupported();
  if (colon2 == std::string::npos) return e;
  int64_t count = 1;
  const auto shape = rest.substr(colon2 + 1);
  for (size_t p = 0; p <= shape.size();) {
    const auto comma = std::min(shape.find(',', p), shape.size());
    const auto dim = shape.substr(p, comma - p);
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos || dim.size() > 9 ||
        std::stoll(dim) < 1 || count > (int64_t{1} << 40) / std::stoll(dim))
      throw unsupported();
    count *= std::stoll(dim);
    p = comma + 1;
  }
  e.count = count;
  return e;
}

/// The shard's columns from index.json: which one holds the tokens, its
/// encoding, and each column's fixed size (nullopt: stored per sample).
struct Columns {
  size_t token_column = 0;
  TokenEncoding encoding;
  std::vector<std::string> names;
  std::vector<std::optional<uint32_t>> sizes;
};

Columns columns_of(const Index& index, size_t i, const MdsOptions& opt) {
  const auto& j = index.shards()[i];
  const auto key = concat("shards[", i, "]");
  auto list = [&](const char* name) {
    const auto it = j.find(name);
    if (it == j.end() || !it->is_array()) throw index.bad(concat(key, ".", name), "expected a list");
    return *it;
  };
  const auto names = list("column_names"), encodings = list("column_encodings"), sizes = list("column_sizes");
  if (encodings.size() != names.size() || sizes.size() != names.size())
    throw index.bad(key, "column_names, column_encodings and column_sizes differ in length");
  Columns c;
  std::string found;
  bool has = false;
  for (size_t k = 0; k < names.size(); ++k) {
    if (!names[k].is_string() || !encodings[k].is_string() ||
        !(sizes[k].is_null() || (sizes[k].is_number_unsigned() && sizes[k].get<uint64_t>() <= UINT32_MAX)))
      throw index.bad(concat(key, ".columns[", k, "]"), "expected a name, an encoding and a size (or null)");
    // streaming's reader takes a size of 0 as "stored per sample" too.
    const auto size = sizes[k].is_null() ? 0 : sizes[k].get<uint32_t>();
    c.sizes.push_back(size ? std::optional<uint32_t>(size) : std::nullopt);
    c.names.push_back(names[k].get<std::string>());
    found += concat(k ? ", " : "", names[k].get<std::string>(), " (", encodings[k].get<std::string>(), ")");
    if (names[k].get<std::string>() == opt.column) c.token_column = k, has = true;
  }
  if (!has)
    throw index.bad(key + ".column_names", concat("no column \"", opt.column, "\" of token ids (llm-foundry's ",
                                                  "convert_dataset_hf --concat_tokens writes one); found ", found));
  c.encoding = token_encoding(encodings[c.token_column].get<std::string>(), opt, [&](const std::string& what) {
    return index.bad(concat(key, ".column_encodings[", c.token_column, "]"), what);
  });
  return c;
}

/// One sample's token values: where they begin in the shard, how many, and
/// their dtype. `at`/`size` is the column's span in the shard.
struct SampleTokens {
  size_t begin = 0;
  int64_t count = 0;
  std::string dtype;
};

template <class Bad>
SampleTokens tokens_of(const char* p, size_t at, size_t size, const TokenEncoding& enc, const Bad& bad) {
  SampleTokens t;
  size_t q = at;
  const size_t end = at + size;
  auto need = [&](size_t n, const char* what) {
    if (end - q < n) throw bad(concat("its tokens end inside the ndarray's ", what));
  };
  if (enc.ndarray && !enc.dtype) {
    need(1, "dtype");
    const auto code = read_le<uint8_t>(p, q++);
    const char* name = dtype_of_code(code);
    if (!name) throw bad(concat("ndarray dtype code ", static_cast<int>(code), " is not one of streaming's"));
    t.dtype = name;
  } else {
    t.dtype = *enc.dtype;
  }
  const auto dtype = dtype_named(t.dtype);
  if (!dtype.kind) throw bad(concat("its tokens are ", t.dtype, "; expected an integer dtype (uint8 ... int64)"));
  if (!enc.ndarray) {
    if (size % static_cast<size_t>(dtype.bytes))
      throw bad(
          concat("its ", size, " bytes of tokens are not a whole number of ", t.dtype, " values", bytes_hint(t.dtype)));
    t.begin = at;
    t.count = static_cast<int64_t>(size) / dtype.bytes;
    return t;
  }
  if (enc.count) {
    t.count = *enc.count;
  } else {
    need(1, "shape");
    const auto b = read_le<uint8_t>(p, q++);
    const size_t ndim = b >> 2, dim_bytes = size_t{1} << (b & 3);
    need(ndim * dim_bytes, "shape");
    t.count = 1;
    for (size_t k = 0; k < ndim; ++k, q += dim_bytes) {
      uint64_t dim = 0;
      std::memcpy(&dim, p + q, dim_bytes);  // little-endian
      if (dim > size || (dim && static_cast<uint64_t>(t.count) > size / dim))
        throw bad(concat("its ndarray shape does not fit its ", size, " bytes"));
      t.count *= static_cast<int64_t>(dim);
    }
  }
  if (static_cast<int64_t>(end - q) != t.count * dtype.bytes)
    throw bad(concat("its ndarray holds ", end - q, " bytes of values, expected ", t.count, " ", t.dtype, " values"));
  t.begin = q;
  return t;
}

/// A shard's samples as documents: where each one's tokens begin and how
/// many it holds, all of one dtype.
struct IndexedShard {
  TokenShards::Shard shard;
  std::unique_ptr<std::vector<int64_t>> starts = std::make_unique<std::vector<int64_t>>(1, 0);
  std::unique_ptr<std::vector<int64_t>> doc_bytes = std::make_unique<std::vector<int64_t>>();
  std::string dtype;  // empty when the shard holds no samples
};

IndexedShard index_samples(const Mapping& m, const stdfs::path& file, const Columns& cols, uint32_t samples) {
  const char* p = m.data;
  const size_t n = m.bytes;
  auto bad = [&](const std::string& what) { return DataError(concat(file.string(), ": ", what)); };
  const size_t table = 4 + 4 * (static_cast<size_t>(samples) + 1);
  if (n < table) throw bad(concat(n, " bytes, too short for the header of ", samples, " samples"));
  if (read_le<uint32_t>(p, 0) != samples)
    throw bad(concat("holds ", read_le<uint32_t>(p, 0), " samples, index.json says ", samples));
  if (read_le<uint32_t>(p, table - 4) != n)
    throw bad(concat("its samples end at byte ", read_le<uint32_t>(p, table - 4), ", the file has ", n));
  size_t varying = 0;
  for (const auto& size : cols.sizes) varying += size ? 0 : 1;
  IndexedShard out;
  for (uint32_t k = 0; k < samples; ++k) {
    const size_t begin = read_le<uint32_t>(p, 4 + 4 * size_t{k}), end = read_le<uint32_t>(p, 8 + 4 * size_t{k});
    auto sample_bad = [&](const std::string& what) { return bad(concat("sample ", k, ": ", what)); };
    if (begin < table || end < begin || end > n || end - begin < 4 * varying)
      throw sample_bad(concat("spans bytes ", begin, " to ", end, " of ", n, "; expected its header and columns"));
    size_t at = begin + 4 * varying, header = begin, token_at = 0, token_size = 0;
    for (size_t c = 0; c < cols.sizes.size(); ++c) {
      size_t size = 0;
      if (cols.sizes[c]) {
        size = *cols.sizes[c];
      } else {
        size = read_le<uint32_t>(p, header);
        header += 4;
      }
      if (end - at < size)
        throw sample_bad(concat("column \"", cols.names[c], "\" of ", size, " bytes runs past the sample's end"));
      if (c == cols.token_column) token_at = at, token_size = size;
      at += size;
    }
    if (at != end) throw sample_bad(concat("its columns take ", at - begin, " bytes of its ", end - begin));
    const auto t = tokens_of(p, token_at, token_size, cols.encoding, sample_bad);
    if (k > 0 && t.dtype != out.dtype)
      throw sample_bad(
          concat("its tokens are ", t.dtype, ", earlier samples' ", out.dtype, "; expected one dtype per folder"));
    out.dtype = t.dtype;
    out.doc_bytes->push_back(static_cast<int64_t>(t.begin));
    out.starts->push_back(out.starts->back() + t.count);
  }
  auto& s = out.shard;
  s.bin = file;
  s.tokens = out.starts->back();
  s.docs = samples;
  s.data = p;
  s.bin_bytes = n;
  s.starts = out.starts->data();
  s.doc_bytes = out.doc_bytes->data();
  s.idx_bytes = 0;  // built here, not mapped
  return out;
}

/// The largest token id of `ts`, each checked once, so a wrong dtype or a
/// damaged shard is named before training instead of failing as an
/// out-of-range index at step N.
int64_t largest_id(const TokenShards& ts, const std::string& dtype, const std::vector<bool>& bytes_column) {
  int64_t top = -1;
  std::vector<int64_t> ids(size_t{1} << 16);
  for (size_t k = 0; k < ts.shards().size(); ++k) {
    const auto& s = ts.shards()[k];
    for (int64_t at = 0; at < s.tokens; at += static_cast<int64_t>(ids.size())) {
      const auto n = std::min<int64_t>(static_cast<int64_t>(ids.size()), s.tokens - at);
      ts.read(s, at, n, ids.data());
      for (int64_t t = 0; t < n; ++t) {
        const auto id = ids[static_cast<size_t>(t)];
        if (id < 0 || id >= kMaxTokenId)
          throw DataError(concat(
              s.bin.string(), ": sample ", std::upper_bound(s.starts, s.starts + s.docs + 1, at + t) - s.starts - 1,
              " holds ", id, " as ", dtype, ", not a token id (below 2^31)", bytes_column[k] ? bytes_hint(dtype) : ""));
        top = std::max(top, id);
      }
    }
  }
  return top;
}

}  // namespace

bool is_mds_dataset(const stdfs::path& path) {
  if (!stdfs::is_directory(path) || !stdfs::is_regular_file(path / "index.json")) return false;
  const auto j = json::parse(fs::read_file(path / "index.json"), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("shards") || !j["shards"].is_array() || j["shards"].empty())
    return false;
  for (const auto& s : j["shards"])
    if (!s.is_object() || text_field(s, "format") != "mds") return false;
  return true;
}

std::shared_ptr<const TokenShards> TokenShards::open_mds(const stdfs::path& dir, const MdsOptions& opt) {
  const Index index(dir);
  if (index.shards().empty()) throw index.bad("shards", "expected at least one shard");
  std::shared_ptr<TokenShards> ts(new TokenShards());
  ts->dir_ = dir;
  std::string dtype;
  std::vector<bool> bytes_column;  // per shard: the dtype came from MdsOptions
  for (size_t i = 0; i < index.shards().size(); ++i) {
    const auto& j = index.shards()[i];
    const auto key = concat("shards[", i, "]");
    if (!j.is_object() || text_field(j, "format") != "mds")
      throw index.bad(key + ".format", concat("\"", j.is_object() ? text_field(j, "format") : "",
                                              "\"; Anvil reads MDS shards (streaming's MDSWriter)"));
    if (j.value("version", json()) != 2) throw index.bad(key + ".version", "expected 2");
    if (!j.contains("samples") || !j["samples"].is_number_unsigned() || j["samples"].get<uint64_t>() > UINT32_MAX)
      throw index.bad(key + ".samples", "expected a sample count");
    const auto cols = columns_of(index, i, opt);
    Mapping m;
    stdfs::path file;
    load_shard(dir, index, i, m, file);
    auto is = index_samples(m, file, cols, j["samples"].get<uint32_t>());
    m.release();  // the shard owns the mapping from here
    ts->shards_.push_back(is.shard);
    ts->owned_starts_.push_back(std::move(is.starts));
    ts->owned_starts_.push_back(std::move(is.doc_bytes));
    bytes_column.push_back(!cols.encoding.ndarray);
    if (!dtype.empty() && !is.dtype.empty() && is.dtype != dtype)
      throw DataError(concat(file.string(), ": its tokens are ", is.dtype, ", earlier shards' ", dtype,
                             "; expected one dtype per folder"));
    if (dtype.empty()) dtype = is.dtype;
    ts->num_tokens_ += is.shard.tokens;
    ts->num_docs_ += is.shard.docs;
  }
  if (dtype.empty()) throw index.bad("shards", "no samples");
  const auto d = dtype_named(dtype);
  ts->kind_ = d.kind;
  ts->token_bytes_ = d.bytes;
  ts->vocab_size_ = largest_id(*ts, dtype, bytes_column) + 1;
  return ts;
}

}  // namespace anvil::data
