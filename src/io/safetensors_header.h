#pragma once
// The safetensors header and tensor table, parsed and validated without
// LibTorch (SafetensorsFile builds on it; the fuzz target calls it alone):
// header length, JSON shape, dtypes, shapes, offsets inside the data section,
// sizes that match dtype x shape, no overlaps.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace anvil::io {

struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", ... (a name safetensors_dtype_size knows)
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // offsets into the data section
};

struct SafetensorsHeader {
  size_t data_start = 0;  // where the data section begins in the file
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

/// Bytes per element of a safetensors dtype name; 0 if unsupported.
size_t safetensors_dtype_size(const std::string& dtype);

/// Parses the first `size` bytes of a safetensors file (the whole file: the
/// offsets are checked against it). Throws CheckpointError starting with `where`.
SafetensorsHeader parse_safetensors_header(const char* bytes, size_t size, const std::string& where);

}  // namespace anvil::io
