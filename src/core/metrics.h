#pragma once
// metrics.jsonl: one JSON object per logged step, appended and flushed.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace anvil {

/// Scalar metrics of one step, by name ("loss", "lr", "eval/loss", ...).
using Metrics = std::map<std::string, double>;

class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Opens `path` for appending. Lines with `step > keep_until_step` are
  /// dropped first, so a resumed run does not repeat steps it will redo.
  MetricsWriter(const std::filesystem::path& path, int64_t keep_until_step);

  void write(int64_t step, const Metrics& metrics);
  bool is_open() const { return out_.is_open(); }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace anvil
