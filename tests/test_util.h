#pragma once
// Helpers shared by the test suite: temp folders, running our binaries.

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
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

/// Runs a Python reference script of tests/parity (`script OUT.json`) with the
/// venv's python and returns the JSON it wrote; a failure is a test failure.
nlohmann::json python_reference(const std::string& script);

/// Every line of a metrics.jsonl, in order.
std::vector<nlohmann::json> metric_lines(const std::filesystem::path& path);
/// The last line of each step of a metrics.jsonl, by step.
std::map<int64_t, nlohmann::json> metrics_by_step(const std::filesystem::path& path);

/// A tiny GPT-2 SFT run on the bundled data (2 layers, 32 wide, micro-batches
/// of 4, one thread, no eval generation), `max_steps` steps, saving every
/// `save_every` and keeping every checkpoint.
std::string tiny_sft_run(int64_t max_steps, int64_t save_every);

/// Writes `yaml` to dir/run.yaml and runs `prefix` trainer --config it
/// output_dir=dir/out `extra` from the source folder; returns the exit code.
int train_in(const TempDir& dir, const std::string& yaml, const std::string& extra, std::string* log,
             const std::string& prefix = "");

/// The `loss` of every line of a metrics.jsonl, by step.
std::vector<std::pair<int64_t, double>> read_losses(const std::filesystem::path& metrics);

}  // namespace anvil::testing
