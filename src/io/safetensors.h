#pragma once
// Safetensors (https://huggingface.co/docs/safetensors) reader and writer.
// The reader memory-maps the file and validates the header before touching
// any tensor: header size, JSON shape, dtypes, offsets in bounds, contiguous
// and non-overlapping. A corrupt file raises CheckpointError, never crashes.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace anvil::io {

using TensorMap = std::map<std::string, at::Tensor>;

/// Writes `tensors` (any device; copied to CPU) atomically to `path`.
void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A validated, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const;
  /// An owning CPU tensor with the stored dtype (a copy out of the mapping).
  at::Tensor get(const std::string& name) const;
  /// Elements [begin, begin + count) of the tensor, flattened: a 1-D owning
  /// copy of just those bytes out of the mapping (a rank's piece of a shard).
  at::Tensor get_elements(const std::string& name, int64_t begin, int64_t count) const;
  /// How many elements the tensor holds.
  int64_t numel(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin, end;  // offsets into the data section
  };
  std::filesystem::path path_;
  const char* map_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Reads every tensor of a file.
TensorMap load_safetensors(const std::filesystem::path& path);

}  // namespace anvil::io
