#include "anvil/io/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "anvil/core/fs.h"

namespace anvil::io {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},   {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort},  {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw CheckpointError(concat("safetensors: unsupported dtype ", c10::toString(t)));
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
    header[name] = {{"dtype", dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
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
  if (size_ < 8) {
    ::close(fd);
    throw CheckpointError(concat(where, ": not a safetensors file (", size_, " bytes, expected at least 8)"));
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw CheckpointError(concat(where, ": mmap failed"));
  map_ = static_cast<const char*>(m);

  try {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(map_[i]);
    if (n > kMaxHeaderBytes || n > size_ - 8)
      throw CheckpointError(concat(where, ": header length ", n, " exceeds the file (", size_, " bytes)"));
    data_start_ = 8 + n;
    auto header = nlohmann::json::parse(map_ + 8, map_ + 8 + n, nullptr, false);
    if (header.is_discarded() || !header.is_object())
      throw CheckpointError(concat(where, ": header is not a JSON object"));
    const size_t data_size = size_ - data_start_;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& [name, e] : header.items()) {
      if (name == "__metadata__") {
        if (!e.is_object()) throw CheckpointError(concat(where, ": __metadata__ must be an object"));
        for (const auto& [k, v] : e.items()) {
          if (!v.is_string()) throw CheckpointError(concat(where, ": __metadata__.", k, " must be a string"));
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const auto bad = [&](const std::string& what) {
        return CheckpointError(concat(where, ": tensor \"", name, "\": ", what));
      };
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
        throw bad("expected an object with dtype, shape and data_offsets");
      if (!e["dtype"].is_string()) throw bad("dtype must be a string");
      const auto dt = e["dtype"].get<std::string>();
      const auto* found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                       [&](const DtypeName& d) { return dt == d.name; });
      if (found == std::end(kDtypes)) throw bad(concat("unsupported dtype \"", dt, "\""));
      Entry entry{found->type, {}, 0, 0};
      if (!e["shape"].is_array()) throw bad("shape must be a list");
      uint64_t numel = 1;
      for (const auto& d : e["shape"]) {
        if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
        const auto v = d.get<uint64_t>();
        if (v > (1ull << 40)) throw bad("dimension too large");
        entry.shape.push_back(static_cast<int64_t>(v));
        numel *= v;
        if (numel > (1ull << 48)) throw bad("too many elements");
      }
      const auto& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad("data_offsets must be [begin, end]");
      entry.begin = off[0].get<size_t>();
      entry.end = off[1].get<size_t>();
      if (entry.begin > entry.end || entry.end > data_size)
        throw bad(concat("data_offsets [", entry.begin, ", ", entry.end, "] outside the data section (", data_size,
                         " bytes)"));
      if (entry.end - entry.begin != numel * c10::elementSize(entry.dtype))
        throw bad(concat("data_offsets span ", entry.end - entry.begin, " bytes, expected ",
                         numel * c10::elementSize(entry.dtype), " for its dtype and shape"));
      spans.emplace_back(entry.begin, entry.end);
      entries_.emplace(name, std::move(entry));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        throw CheckpointError(concat(where, ": tensors overlap in the data section"));
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

at::Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw CheckpointError(concat(path_.string(), ": no tensor named \"", name, "\""));
  const auto& e = it->second;
  auto out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(out.data_ptr(), map_ + data_start_ + e.begin, e.end - e.begin);
  return out;
}

TensorMap load_safetensors(const std::filesystem::path& path) {
  SafetensorsFile f(path);
  TensorMap out;
  for (const auto& n : f.names()) out.emplace(n, f.get(n));
  return out;
}

}  // namespace anvil::io
