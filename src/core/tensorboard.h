#pragma once
// TensorBoard event files, written natively (no Python, no protobuf library):
// TFRecord framing (length, masked CRC-32C) around hand-encoded `Event`
// protos, as TensorFlow's and PyTorch's SummaryWriter write them. Scalars
// are `simple_value`s; text is the text plugin's string tensor. Every start
// logs a SessionLog START first (a resumed run at its next step), so
// TensorBoard drops what an earlier, killed run logged past that checkpoint:
// the logs then hold each step once. docs/getting-started.md.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

class TensorBoardWriter {
 public:
  /// Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid>.<n>
  /// file in it, and logs a SessionLog START: at step 0, or with `resumed_at`
  /// (the checkpoint's step) at resumed_at + 1.
  TensorBoardWriter(const std::filesystem::path& dir, std::optional<int64_t> resumed_at);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event at `step` holding every scalar (stored as float32, as
  /// TensorBoard's simple_value is).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  /// A text-plugin value (Markdown) at `step`.
  void text(int64_t step, const std::string& tag, const std::string& markdown);
  /// Flushes the file (every call above does).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

/// CRC-32C (Castagnoli) of `n` bytes, as TFRecord frames use it (unmasked).
uint32_t crc32c(const void* data, size_t n);

}  // namespace anvil
