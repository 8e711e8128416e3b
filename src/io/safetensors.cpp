#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "io/safetensors_header.h"

namespace anvil::io {
namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw CheckpointError(concat("safetensors: unsupported dtype ", c10::toString(t)));
}

at::ScalarType scalar_type(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw CheckpointError(concat("safetensors: unsupported dtype ", name));
}

}  // namespace

void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(at::kCPU).contiguous();
    const size_t bytes = c.numel() * c.element_size();
    header[name] = {
        {"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep tensor data 8-byte aligned
  fs::write_atomic(path, [&](std::ostream& out) {
    uint64_t n = h.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little endian
    out.write(len, 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& c : data)
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  });
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const auto where = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(concat(where, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw CheckpointError(concat(where, ": cannot stat"));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {  // mmap of an empty file fails; the parser says what is wrong
    ::close(fd);
    parse_safetensors_header("", size_, where);
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw CheckpointError(concat(where, ": mmap failed"));
  map_ = static_cast<const char*>(m);

  try {
    auto header = parse_safetensors_header(map_, size_, where);
    data_start_ = header.data_start;
    metadata_ = std::move(header.metadata);
    for (auto& [name, e] : header.entries)
      entries_.emplace(name, Entry{scalar_type(e.dtype), std::move(e.shape), e.begin, e.end});
  } catch (...) {
    ::munmap(const_cast<char*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<char*>(map_), size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, _] : entries_) out.push_back(k);
  return out;
}

std::vector<int64_t> SafetensorsFile::shape(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw CheckpointError(concat(path_.string(), ": no tensor named \"", name, "\""));
  return it->second.shape;
}

namespace {
/// Drops the whole pages of [p, p + n) from this process's resident memory
/// once copied (the mapping is read-only: a later read faults them back in
/// from the page cache), so reading a model costs its copy, not its copy and
/// the file's pages besides.
void release_pages(const char* p, size_t n) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}
}  // namespace

at::Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw CheckpointError(concat(path_.string(), ": no tensor named \"", name, "\""));
  const auto& e = it->second;
  auto out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) {
    std::memcpy(out.data_ptr(), map_ + data_start_ + e.begin, e.end - e.begin);
    release_pages(map_ + data_start_ + e.begin, e.end - e.begin);
  }
  return out;
}

int64_t SafetensorsFile::numel(const std::string& name) const {
  int64_t n = 1;
  for (const auto d : shape(name)) n *= d;
  return n;
}

at::Tensor SafetensorsFile::get_elements(const std::string& name, int64_t begin, int64_t count) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw CheckpointError(concat(path_.string(), ": no tensor named \"", name, "\""));
  const auto& e = it->second;
  const int64_t total = numel(name);
  if (begin < 0 || count < 0 || begin + count > total)
    throw CheckpointError(
        concat(path_.string(), ": elements [", begin, ", ", begin + count, ") of \"", name, "\", which holds ", total));
  auto out = at::empty({count}, at::TensorOptions().dtype(e.dtype));
  const auto size = static_cast<size_t>(c10::elementSize(e.dtype));
  if (count > 0) {
    const char* from = map_ + data_start_ + e.begin + static_cast<size_t>(begin) * size;
    std::memcpy(out.data_ptr(), from, static_cast<size_t>(count) * size);
    release_pages(from, static_cast<size_t>(count) * size);
  }
  return out;
}

TensorMap load_safetensors(const std::filesystem::path& path) {
  SafetensorsFile f(path);
  TensorMap out;
  for (const auto& n : f.names()) out.emplace(n, f.get(n));
  return out;
}

}  // namespace anvil::io
