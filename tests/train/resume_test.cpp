// Crash safety: a run SIGKILLed at arbitrary moments and resumed must produce
// bit-identical losses to an uninterrupted run; SIGTERM saves and exits 0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

const char* kTinyRun = R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.1}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}]}
optimizer: {lr: 1.0e-3, weight_decay: 0.01}
schedule: {warmup_steps: 5, decay: cosine}
train: {max_steps: 100, micro_batch_size: 8, grad_accum_steps: 2, save_every: 7, log_every: 1000, threads: 1,
        keep_checkpoints: 3}
eval: {generate_samples: 0}
)";

using anvil::testing::TrainerProcess;

size_t metric_lines(const stdfs::path& metrics) {
  std::ifstream in(metrics);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) n += !line.empty();
  return n;
}

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_ / "tiny.yaml";
    anvil::testing::write_text(config_, kTinyRun);
  }
  std::vector<std::pair<int64_t, double>> run_to_end(const stdfs::path& out) {
    TrainerProcess p(config_, out, dir_ / "log.txt");
    EXPECT_EQ(p.wait(), 0) << anvil::testing::read_text(dir_ / "log.txt");
    return anvil::testing::read_losses(out / "metrics.jsonl");
  }
  TempDir dir_;
  stdfs::path config_;
};

TEST_F(ResumeTest, SigkillAtRandomMomentsThenResumeIsBitIdentical) {
  const auto reference = run_to_end(dir_ / "ref");
  ASSERT_EQ(reference.size(), 100u);

  const auto out = dir_ / "killed";
  std::mt19937 rng(2024);
  int kills = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    TrainerProcess p(config_, out, dir_ / "log.txt");
    // Let it make some progress, then kill at a random moment: during a step,
    // a metrics write or a checkpoint save.
    const size_t before = metric_lines(out / "metrics.jsonl");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (p.running() && metric_lines(out / "metrics.jsonl") < before + 3 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 60)(rng)));
    if (!p.running()) {
      ASSERT_EQ(p.exited(), 0) << anvil::testing::read_text(dir_ / "log.txt");
      break;
    }
    p.signal(SIGKILL);
    EXPECT_EQ(p.wait(), 128 + SIGKILL);
    ++kills;
    if (kills == 4) break;
  }
  EXPECT_GE(kills, 3);
  const auto log_before = anvil::testing::read_text(dir_ / "log.txt").size();
  const auto resumed = run_to_end(out);
  // A restart from scratch would also reproduce the losses: make sure the
  // last run really continued from a checkpoint.
  const auto last_log = anvil::testing::read_text(dir_ / "log.txt").substr(log_before);
  EXPECT_NE(last_log.find("resumed from"), std::string::npos) << last_log;
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_EQ(resumed[i].first, reference[i].first);
    EXPECT_EQ(resumed[i].second, reference[i].second) << "step " << reference[i].first;  // bit for bit
  }
  // No temp folders left behind, and only the newest checkpoints are kept.
  int complete = 0;
  for (const auto& e : stdfs::directory_iterator(out)) {
    EXPECT_NE(e.path().filename().string().rfind(".checkpoint-", 0), 0u) << e.path();
    complete += e.path().filename().string().rfind("checkpoint-", 0) == 0;
  }
  EXPECT_EQ(complete, 3);
  EXPECT_TRUE(stdfs::exists(out / "checkpoint-100" / "model.safetensors"));
}

TEST_F(ResumeTest, SigtermFinishesTheStepSavesAndExitsZero) {
  const auto reference = run_to_end(dir_ / "ref");
  const auto out = dir_ / "term";
  TrainerProcess p(config_, out, dir_ / "log.txt");
  while (p.running() && metric_lines(out / "metrics.jsonl") < 7)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), 0) << anvil::testing::read_text(dir_ / "log.txt");
  const auto lines = metric_lines(out / "metrics.jsonl");
  ASSERT_GE(lines, 7u);
  ASSERT_LT(lines, 100u) << "the run finished before SIGTERM arrived";
  EXPECT_TRUE(stdfs::exists(out / ("checkpoint-" + std::to_string(lines)) / "trainer_state.json"));
  EXPECT_NE(anvil::testing::read_text(dir_ / "log.txt").find("stop requested"), std::string::npos);
  const auto resumed = run_to_end(out);
  EXPECT_NE(anvil::testing::read_text(dir_ / "log.txt").find("at step " + std::to_string(lines)), std::string::npos);
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_EQ(resumed[i].second, reference[i].second) << i;
}

// Ctrl-C twice: the first asks for a save after the step (and says so), the
// second exits at once with 130, saying that nothing more is saved.
TEST_F(ResumeTest, ASecondInterruptExitsAtOnceSayingSo) {
  const auto out = dir_ / "twice";
  // Two SIGINTs raised in the trainer at step 5: sent from here, the second
  // could arrive after the save it should cut short.
  TrainerProcess p(config_, out, dir_ / "log.txt", "ANVIL_TEST_SIGNALS_AT_STEP=5:INT,INT");
  EXPECT_EQ(p.wait(), 130);
  // Step 5's line would have been written while step 6 ran (train.overlap_step_reads), which the second
  // interrupt cut short at its start.
  EXPECT_EQ(metric_lines(out / "metrics.jsonl"), 4u);
  const auto log = anvil::testing::read_text(dir_ / "log.txt");
  EXPECT_NE(log.find("trainer: stop requested: finishing this step (an RL run: this iteration), then saving a "
                     "checkpoint (interrupt again to exit at once, without saving)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("trainer: interrupted again: exiting now, without saving; the last complete checkpoint is kept"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace anvil::train

namespace anvil::train {
namespace {

// A mixture of experts (Mixtral) with its load-balancing loss in the loss:
// stopped by SIGTERM and resumed, every step's loss and moe/aux_loss equal the
// uninterrupted run's bit for bit (the router statistics live within a
// micro-batch, the jitter-free routing is a function of the weights); and the
// load-balancing loss is logged on every step.
TEST(ResumeMoe, MixtralWithItsLoadBalancingLossResumesBitIdentical) {
  TempDir dir;
  const auto config = dir / "moe.yaml";
  anvil::testing::write_text(config, R"(
model: {family: mixtral, max_position_embeddings: 32, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        intermediate_size: 64, num_experts: 4, num_experts_per_tok: 2, router_aux_loss_coef: 0.01}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}]}
optimizer: {lr: 1.0e-3, weight_decay: 0.01}
train: {max_steps: 12, micro_batch_size: 8, grad_accum_steps: 2, save_every: 4, log_every: 1000, threads: 1}
eval: {generate_samples: 0}
)");
  const auto run = [&](const stdfs::path& out, const std::string& env) {
    TrainerProcess p(config, out, dir / "log.txt", env);
    EXPECT_EQ(p.wait(), 0) << anvil::testing::read_text(dir / "log.txt");
  };
  const auto lines_of = [](const stdfs::path& metrics) {
    std::vector<nlohmann::json> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  run(dir / "ref", "");
  run(dir / "cut", "ANVIL_TEST_SIGNALS_AT_STEP=5:TERM");
  const auto cut = metric_lines(dir / "cut" / "metrics.jsonl");
  ASSERT_GE(cut, 5u);
  ASSERT_LT(cut, 12u);
  run(dir / "cut", "");
  const auto ref = lines_of(dir / "ref" / "metrics.jsonl"), resumed = lines_of(dir / "cut" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 12u);
  ASSERT_EQ(resumed.size(), 12u);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(ref[i].contains("moe/aux_loss")) << "step " << i + 1;
    EXPECT_EQ(resumed[i]["loss"].get<double>(), ref[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(resumed[i]["moe/aux_loss"].get<double>(), ref[i]["moe/aux_loss"].get<double>()) << "step " << i + 1;
    // Two experts of four per token: k = 2 when balanced, at most E = 4.
    EXPECT_GT(ref[i]["moe/aux_loss"].get<double>(), 1.9);
    EXPECT_LT(ref[i]["moe/aux_loss"].get<double>(), 4.0);
  }
}

}  // namespace
}  // namespace anvil::train
