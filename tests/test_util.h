#pragma once
// Helpers shared by the test suite: temp folders, running our binaries.

#include <filesystem>
#include <string>
#include <vector>

namespace anvil::testing {

/// A fresh folder under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

void write_text(const std::filesystem::path& p, const std::string& text);
std::string read_text(const std::filesystem::path& p);

/// Runs a command through /bin/sh; returns its exit status, output in `out`.
int run(const std::string& cmd, std::string* out = nullptr);

std::string source_dir();
std::string trainer_bin();
std::string cli_bin();
std::string python_bin();

/// The `loss` of every line of a metrics.jsonl, by step.
std::vector<std::pair<int64_t, double>> read_losses(const std::filesystem::path& metrics);

}  // namespace anvil::testing
