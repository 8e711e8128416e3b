#pragma once
// Helpers shared by the test suite: temp folders, running our binaries.

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::data {
class TokenShards;
}

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
/// Starts `cmd` (a trainer command line) in the background from the source
/// tree, its output to `log_file`; once `checkpoint`/trainer_state.json exists
/// (waiting up to 120 s), kills it with SIGKILL, as a crash would. Returns
/// run()'s status; the caller checks what the killed run left.
int kill_after_checkpoint(const std::string& cmd, const std::filesystem::path& log_file,
                          const std::filesystem::path& checkpoint, std::string* out = nullptr);

std::string source_dir();
std::string trainer_bin();
std::string cli_bin();
/// configs/models/<family>-debug for every family of the model registry, in
/// its order: the tiny flavors tests that cover every family run.
std::vector<std::string> debug_flavors();
/// The test-name form of a flavor ("qwen2-debug" -> "qwen2debug").
std::string flavor_test_name(const std::string& flavor);
/// "mpirun ... -np RANKS " (more ranks than cores allowed, none pinned), or ""
/// for ranks <= 0: the prefix of a command run on RANKS processes.
std::string mpirun(int ranks);
std::string python_bin();

/// The folder of reference outputs that a script of tests/parity writes for
/// all the tests of one file (`python script DIR [args]`). Under ctest, a
/// fixture test runs the script once per ctest run and names its folder in
/// the environment variable `env` (tests/CMakeLists.txt); a test run alone
/// (no `env`) runs the script itself into a temp folder, with `args`.
class ReferenceFolder {
 public:
  ReferenceFolder(const std::string& env, const std::string& script, const std::string& args = "");
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }
  /// Whether the folder is there (the script succeeded); `log()` says why not.
  bool ok() const { return ok_; }
  const std::string& log() const { return log_; }

 private:
  std::unique_ptr<TempDir> temp_;
  std::filesystem::path path_;
  bool ok_ = false;
  std::string log_;
};

/// Runs a Python reference script of tests/parity (`script OUT.json`) with the
/// venv's python and returns the JSON it wrote; a failure is a test failure.
nlohmann::json python_reference(const std::string& script);

/// Every line of a metrics.jsonl, in order.
std::vector<nlohmann::json> metric_lines(const std::filesystem::path& path);
/// The last line of each step of a metrics.jsonl, by step.
std::map<int64_t, nlohmann::json> metrics_by_step(const std::filesystem::path& path);
/// Compares the metrics.jsonl of a one-process run (`one`, `steps` lines)
/// with the same run on several ranks (every numeric value within 1e-5,
/// relative) and resumed from a checkpoint (bit for bit); timings, memory
/// and throughput are left out.
void expect_runs_agree(const std::filesystem::path& one, const std::filesystem::path& ranks,
                       const std::filesystem::path& resumed, size_t steps);

/// A tiny GPT-2 SFT run on the bundled data (2 layers, 32 wide, micro-batches
/// of 4, one thread, no eval generation), `max_steps` steps, saving every
/// `save_every` and keeping every checkpoint.
std::string tiny_sft_run(int64_t max_steps, int64_t save_every);

/// Writes `yaml` to dir/run.yaml and runs `prefix` trainer --config it
/// output_dir=dir/out `extra` from the source folder; returns the exit code.
int train_in(const TempDir& dir, const std::string& yaml, const std::string& extra, std::string* log,
             const std::string& prefix = "");

/// The quickstart SFT run's checkpoint-1000, made by the QuickstartLearning
/// ctest fixture (tests that need it run after it), or the checkpoint
/// $ANVIL_FIXTURE_CHECKPOINT names (a fixture of another seed, for the sweep).
std::filesystem::path fixture_checkpoint();
/// The build tree's folder of ctest fixtures (build/test-fixtures).
std::filesystem::path fixture_dir();

/// " train.seed=N" when ANVIL_TEST_SEED=N is set (scripts/learning_sweep.sh
/// varies the seed of a learning test's own runs), else "". Learning tests
/// append it to every trainer command they run.
std::string seed_override();

/// A learned figure of the running test, its untrained or pre-objective
/// `baseline` and the `threshold` it is held to (value >= threshold, or
/// value < threshold when `at_most`): one JSON line appended to
/// $ANVIL_LEARNING_RECORD when set (scripts/learning_sweep.sh collects them
/// into docs/reliability.md's table); nothing otherwise.
void record_figure(const std::string& figure, double value, double baseline, double threshold, bool at_most = false);
/// Whether scripts/learning_sweep.sh runs the test ($ANVIL_LEARNING_RECORD
/// set): a test that checks more than learning (resume, sharding) returns
/// after its learned figures, which are all the sweep reads.
bool sweeping();

/// The regular files below `dir`, relative to it, sorted.
std::vector<std::filesystem::path> files_below(const std::filesystem::path& dir);

/// The documents of every shard of `ts`, in order, as token lists.
std::vector<std::vector<int64_t>> shard_documents(const data::TokenShards& ts);

/// The trainer (`--config config output_dir=out`) in a child process run from
/// the source folder, its output appended to `log`, with `env` ("NAME=value")
/// set when given.
class TrainerProcess {
 public:
  TrainerProcess(const std::filesystem::path& config, const std::filesystem::path& out,
                 const std::filesystem::path& log, const std::string& env = "");
  void signal(int sig);
  /// Exit code, or 128 + signal.
  int wait();
  /// Whether it still runs; once it has exited, exited() holds its code.
  bool running();
  int exited() const { return exited_; }

 private:
  int pid_;
  int exited_ = -1;
};

/// The `loss` of every line of a metrics.jsonl, by step.
std::vector<std::pair<int64_t, double>> read_losses(const std::filesystem::path& metrics);

}  // namespace anvil::testing
