#include "core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "anvil/core/error.h"

namespace anvil::fs {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(concat(path.string(), ": cannot open for reading"));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void fsync_path(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(concat(path.string(), ": cannot open to fsync: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(concat(path.string(), ": fsync failed: ", std::strerror(err)));
}

void fsync_tree(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) fsync_path(e.path());
  fsync_path(dir);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view data) {
  write_atomic(path, [&](std::ostream& out) { out.write(data.data(), static_cast<std::streamsize>(data.size())); });
}

void write_atomic(const std::filesystem::path& path, const std::function<void(std::ostream&)>& fill) {
  auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  auto tmp = dir / (concat(".", path.filename().string(), ".tmp.", ::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(concat(tmp.string(), ": cannot open for writing: ", std::strerror(errno)));
    errno = 0;
    fill(out);
    out.flush();
    if (!out) {
      // ENOSPC, EFBIG, EIO...: name the cause and leave nothing half-written behind.
      const int err = errno;
      out.close();
      ::unlink(tmp.c_str());
      throw IoError(concat(path.string(), ": write failed: ", err ? std::strerror(err) : "stream error"));
    }
  }
  fsync_path(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError(concat(path.string(), ": rename failed: ", ec.message()));
  fsync_path(dir);
}

}  // namespace anvil::fs
