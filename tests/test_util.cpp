#include "test_util.h"

#include "anvil/models/registry.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "data/token_shards.h"
#include "data/datasets.h"

namespace anvil::testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("anvil-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

int run(const std::string& cmd, std::string* out) {
  // A group, so that redirections inside `cmd` apply to it as written.
  FILE* pipe = ::popen(("{ " + cmd + "\n} 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf{};
  std::string text;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) text.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int kill_after_checkpoint(const std::string& cmd, const std::filesystem::path& log_file,
                          const std::filesystem::path& checkpoint, std::string* out) {
  // The trainer is the background job itself (exec), so the kill reaches it and not a subshell.
  return run("cd " + source_dir() + " && (exec " + cmd + " >" + log_file.string() + " 2>&1) & pid=$!; " +
                 "for i in $(seq 1 6000); do [ -f " + (checkpoint / "trainer_state.json").string() +
                 " ] && break; sleep 0.02; done; kill -9 $pid; wait $pid; true",
             out);
}

std::string source_dir() { return ANVIL_SOURCE_DIR; }
namespace {
std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
}  // namespace

// scripts/learning_sweep.sh runs the tests against a copy of the binaries,
// so that a rebuild during its hour cannot change them under it.
std::string trainer_bin() { return env_or("ANVIL_TRAINER_BIN", ANVIL_TRAINER_BIN); }
std::string cli_bin() { return env_or("ANVIL_CLI_BIN", ANVIL_CLI_BIN); }
std::vector<std::string> debug_flavors() {
  std::vector<std::string> out;
  for (const auto& f : models::family_names()) out.push_back(f + "-debug");
  return out;
}
std::string flavor_test_name(const std::string& flavor) {
  auto n = flavor;
  std::erase(n, '-');
  std::erase(n, '.');
  return n;
}
std::string mpirun(int ranks) {
  // --oversubscribe: more ranks than this machine's cores; --bind-to none:
  // ranks share the cores instead of each being pinned to one.
  return ranks > 0 ? "mpirun --allow-run-as-root --oversubscribe --bind-to none -np " + std::to_string(ranks) + " "
                   : std::string();
}
std::string python_bin() { return ANVIL_PYTHON; }

TrainerProcess::TrainerProcess(const std::filesystem::path& config, const std::filesystem::path& out,
                               const std::filesystem::path& log, const std::string& env) {
  pid_ = ::fork();
  if (pid_ != 0) return;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
  if (::chdir(source_dir().c_str()) != 0) ::_exit(126);
  const std::string bin = trainer_bin(), cfg = config.string(), o = "output_dir=" + out.string();
  ::execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), o.c_str(), static_cast<char*>(nullptr));
  ::_exit(127);
}

void TrainerProcess::signal(int sig) { ::kill(pid_, sig); }

int TrainerProcess::wait() {
  int status = 0;
  ::waitpid(pid_, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool TrainerProcess::running() {
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
  exited_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

std::filesystem::path fixture_checkpoint() {
  if (const char* dir = std::getenv("ANVIL_FIXTURE_CHECKPOINT"); dir && *dir) return dir;
  return fixture_dir() / "quickstart-sft" / "checkpoint-1000";
}

std::filesystem::path fixture_dir() { return ANVIL_FIXTURE_DIR; }

ReferenceFolder::ReferenceFolder(const std::string& env, const std::string& script, const std::string& args) {
  if (const char* dir = std::getenv(env.c_str()); dir && *dir) {
    path_ = dir;
    ok_ = std::filesystem::is_directory(path_);
    if (!ok_) log_ = "$" + env + " names " + path_.string() + ", which is not a folder (did its ctest fixture fail?)";
    return;
  }
  temp_ = std::make_unique<TempDir>();
  path_ = temp_->path();
  const auto cmd = python_bin() + " " + source_dir() + "/tests/parity/" + script + " " + path_.string() +
                   (args.empty() ? "" : " " + args) + " 2>&1";
  ok_ = run(cmd, &log_) == 0;
}

std::string seed_override() {
  const char* seed = std::getenv("ANVIL_TEST_SEED");
  return seed && *seed ? std::string(" train.seed=") + seed : std::string();
}

bool sweeping() {
  const char* path = std::getenv("ANVIL_LEARNING_RECORD");
  return path && *path;
}

void record_figure(const std::string& figure, double value, double baseline, double threshold, bool at_most) {
  const char* path = std::getenv("ANVIL_LEARNING_RECORD");
  if (!path || !*path) return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const nlohmann::json line = {{"test", std::string(info->test_suite_name()) + "." + info->name()},
                               {"figure", figure},
                               {"value", value},
                               {"baseline", baseline},
                               {"threshold", threshold},
                               {"at_most", at_most},
                               {"fixture", fixture_checkpoint().string()},
                               {"seed", env_or("ANVIL_TEST_SEED", "")}};
  std::ofstream(path, std::ios::app) << line.dump() << "\n";
}

std::vector<std::filesystem::path> files_below(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(std::filesystem::relative(e.path(), dir));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int64_t>> shard_documents(const data::TokenShards& ts) {
  std::vector<std::vector<int64_t>> docs;
  for (const auto& s : ts.shards())
    for (int64_t d = 0; d < s.docs; ++d) {
      std::vector<int64_t> doc;
      for (int64_t i = s.starts[d]; i < s.starts[d + 1]; ++i) doc.push_back(ts.token(s, i));
      docs.push_back(doc);
    }
  return docs;
}

nlohmann::json python_reference(const std::string& script) {
  TempDir dir;
  std::string out;
  const auto cmd = python_bin() + " " + source_dir() + "/tests/parity/" + script + " " + (dir / "ref.json").string();
  EXPECT_EQ(run(cmd, &out), 0) << out;
  return nlohmann::json::parse(read_text(dir / "ref.json"));
}

std::vector<nlohmann::json> metric_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::map<int64_t, nlohmann::json> metrics_by_step(const std::filesystem::path& path) {
  std::map<int64_t, nlohmann::json> out;
  for (auto& m : metric_lines(path)) out[m["step"].get<int64_t>()] = m;
  return out;
}

void expect_runs_agree(const std::filesystem::path& one, const std::filesystem::path& ranks,
                       const std::filesystem::path& resumed, size_t steps) {
  const auto a = metrics_by_step(one / "metrics.jsonl"), b = metrics_by_step(ranks / "metrics.jsonl"),
             c = metrics_by_step(resumed / "metrics.jsonl");
  ASSERT_EQ(a.size(), steps);
  ASSERT_EQ(b.size(), steps);
  ASSERT_EQ(c.size(), steps);
  for (const auto& [step, m] : a)
    for (const auto& [k, v] : m.items()) {
      if (!v.is_number() || k.rfind("time", 0) == 0 || k.find("per_s") != std::string::npos ||
          k.find("mem") != std::string::npos || k == "step")
        continue;
      ASSERT_TRUE(b.at(step).contains(k) && c.at(step).contains(k)) << step << " " << k;
      const double x = v.get<double>(), y = b.at(step)[k].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::max(1.0, std::abs(x))) << "ranks, step " << step << " " << k;
      EXPECT_EQ(x, c.at(step)[k].get<double>()) << "resumed, step " << step << " " << k;
    }
}

std::string tiny_sft_run(int64_t max_steps, int64_t save_every) {
  return "model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, "
         "num_attention_heads: 4, "
         "dropout: 0.0}\n"
         "tokenizer: {path: data/tokenizer.model}\n"
         "data: {train: [{path: data/sft_train.jsonl}]}\n"
         "optimizer: {lr: 1.0e-3}\n"
         "schedule: {warmup_steps: 0}\n"
         "train: {max_steps: " +
         std::to_string(max_steps) + ", micro_batch_size: 4, save_every: " + std::to_string(save_every) +
         ", keep_checkpoints: 0, log_every: 1000, threads: 1}\n"
         "eval: {generate_samples: 0}\n";
}

int train_in(const TempDir& dir, const std::string& yaml, const std::string& extra, std::string* log,
             const std::string& prefix) {
  write_text(dir / "run.yaml", yaml);
  return run("cd " + source_dir() + " && " + prefix + trainer_bin() + " --config " + (dir / "run.yaml").string() +
                 " output_dir=" + (dir / "out").string() + " " + extra,
             log);
}

std::vector<std::pair<int64_t, double>> read_losses(const std::filesystem::path& metrics) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  }
  return out;
}

}  // namespace anvil::testing
