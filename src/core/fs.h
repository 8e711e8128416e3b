#pragma once
// Durable file operations: everything a checkpoint needs to be all-or-nothing.

#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace anvil::fs {

/// Reads a whole file; throws IoError naming the path.
std::string read_file(const std::filesystem::path& path);

/// Writes `data` to `path` durably: temp file in the same folder, fsync,
/// rename over `path`, fsync the folder.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

/// Like write_file_atomic, but streams: `fill` writes the content.
void write_atomic(const std::filesystem::path& path, const std::function<void(std::ostream&)>& fill);

/// fsync a file or a directory.
void fsync_path(const std::filesystem::path& path);

/// fsyncs every file below `dir`, then `dir` itself.
void fsync_tree(const std::filesystem::path& dir);

}  // namespace anvil::fs
