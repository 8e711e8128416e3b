// Checkpoints written in the background (src/train/checkpoint_writer.h):
// a SIGKILL in the middle of a write leaves the previous checkpoint complete
// and the run resumes from it bit for bit; what the background writer puts
// on disk is byte for byte what a save written at once puts there, even when
// its copy of the live weights is late and the loop must wait for it; a
// write that fails stops the run with the checkpoint's name.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "io/trainer_state.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

// Dropout on, so the RNG state a checkpoint holds matters to the losses.
const char* kRun = R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.1}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}]}
optimizer: {lr: 1.0e-3, weight_decay: 0.01}
schedule: {warmup_steps: 2, decay: cosine}
train: {max_steps: 6, micro_batch_size: 8, grad_accum_steps: 2, save_every: 2, keep_checkpoints: 0,
        log_every: 1000, threads: 1}
eval: {generate_samples: 0}
)";

using Trainer = anvil::testing::TrainerProcess;

/// The hidden temp folder of checkpoint-`step` being written in `out`, if any.
std::optional<stdfs::path> temp_folder(const stdfs::path& out, int step) {
  if (!stdfs::is_directory(out)) return std::nullopt;
  const auto prefix = ".checkpoint-" + std::to_string(step) + ".tmp-";
  for (const auto& e : stdfs::directory_iterator(out))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path();
  return std::nullopt;
}

using anvil::testing::files_below;

class CheckpointAsync : public ::testing::Test {
 protected:
  void SetUp() override { anvil::testing::write_text(dir_ / "run.yaml", kRun); }
  /// Runs to the end with `env`; returns the losses by step.
  std::vector<std::pair<int64_t, double>> run_to_end(const stdfs::path& out, const std::string& env = "",
                                                     const std::string& config = "run.yaml") {
    Trainer t(dir_ / config, out, dir_ / "log.txt", env);
    EXPECT_EQ(t.wait(), 0) << anvil::testing::read_text(dir_ / "log.txt");
    return anvil::testing::read_losses(out / "metrics.jsonl");
  }
  /// Every write pauses 1 s before its first file and 1 s before
  /// trainer_state.json; the kill lands in the second pause of
  /// checkpoint-4's write, its folder full but for the file that marks it
  /// complete. Returns that folder.
  std::optional<stdfs::path> kill_while_writing_checkpoint_4(const stdfs::path& out) {
    Trainer t(dir_ / "run.yaml", out, dir_ / "log.txt", "ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS=1000");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::optional<stdfs::path> tmp;
    while (!((tmp = temp_folder(out, 4)) && stdfs::exists(*tmp / "config.yaml")) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t.signal(SIGKILL);
    EXPECT_EQ(t.wait(), 128 + SIGKILL) << anvil::testing::read_text(dir_ / "log.txt");
    return tmp;
  }
  /// Re-running in `out` continues from checkpoint-2 with `reference`'s losses, bit for bit.
  void expect_resumes_from_checkpoint_2(const stdfs::path& out,
                                        const std::vector<std::pair<int64_t, double>>& reference) {
    const auto log_before = anvil::testing::read_text(dir_ / "log.txt").size();
    const auto resumed = run_to_end(out);
    const auto log = anvil::testing::read_text(dir_ / "log.txt").substr(log_before);
    EXPECT_NE(log.find("resumed from " + (out / "checkpoint-2").string() + " at step 2"), std::string::npos) << log;
    ASSERT_EQ(resumed.size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i)
      EXPECT_EQ(resumed[i].second, reference[i].second) << "step " << reference[i].first;  // bit for bit
  }
  TempDir dir_;
};

TEST_F(CheckpointAsync, SigkillDuringABackgroundWriteKeepsThePreviousCheckpointAndResumesBitIdentically) {
  const auto reference = run_to_end(dir_ / "ref");
  ASSERT_EQ(reference.size(), 6u);

  const auto out = dir_ / "killed";
  const auto tmp = kill_while_writing_checkpoint_4(out);
  ASSERT_TRUE(tmp) << "no write of checkpoint-4 was seen; log:\n" << anvil::testing::read_text(dir_ / "log.txt");

  // The half-written folder is there, hidden and without trainer_state.json;
  // the newest complete checkpoint is the previous one, and it loads.
  EXPECT_TRUE(stdfs::exists(*tmp / "model.safetensors"));
  EXPECT_FALSE(stdfs::exists(*tmp / io::kTrainerStateFile));
  EXPECT_FALSE(stdfs::exists(out / "checkpoint-4"));
  const auto latest = checkpoint::latest_checkpoint(out);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->string(), (out / "checkpoint-2").string());
  EXPECT_EQ(io::trainer_state_of(io::read_trainer_state(out / "checkpoint-2")).step, 2);
  EXPECT_NO_THROW(checkpoint::load_model_dir(out / "checkpoint-2"));
  EXPECT_TRUE(
      io::SafetensorsFile(out / "checkpoint-2" / "optimizer.safetensors").contains("transformer.wte.weight.exp_avg"));

  expect_resumes_from_checkpoint_2(out, reference);
  EXPECT_FALSE(temp_folder(out, 4)) << "the leftover of the killed write is removed by the next save";
  EXPECT_TRUE(stdfs::exists(out / "checkpoint-6" / io::kTrainerStateFile));
}

TEST_F(CheckpointAsync, BackgroundCheckpointsAreByteIdenticalToOnesWrittenAtOnce) {
  // train.background_saves: false writes each checkpoint at once (no host copy kept).
  std::string at_once_yaml = kRun;
  at_once_yaml.replace(at_once_yaml.find("threads: 1}"), 11, "threads: 1, background_saves: false}");
  anvil::testing::write_text(dir_ / "at_once.yaml", at_once_yaml);
  const auto at_once = run_to_end(dir_ / "sync", "", "at_once.yaml");
  EXPECT_EQ(anvil::testing::read_text(dir_ / "log.txt").find("in the background"), std::string::npos)
      << anvil::testing::read_text(dir_ / "log.txt");
  // Each background write waits 0.3 s before it copies the live weights and
  // moments, so the next optimizer step must wait for the copy, and 0.3 s
  // before trainer_state.json.
  const auto background = run_to_end(dir_ / "async", "ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS=300");
  const auto log = anvil::testing::read_text(dir_ / "log.txt");
  EXPECT_NE(log.find("writing " + (dir_ / "async" / "checkpoint-2").string() + " in the background"), std::string::npos)
      << log;
  ASSERT_EQ(background, at_once);  // bit for bit

  for (const char* ckpt : {"checkpoint-2", "checkpoint-4", "checkpoint-6"}) {
    const auto a = dir_ / "sync" / ckpt, b = dir_ / "async" / ckpt;
    const auto files = files_below(a);
    ASSERT_EQ(files, files_below(b)) << ckpt;
    EXPECT_GE(files.size(), 9u);  // weights, config, tokenizer, optimizer (2), rng, trainer state, config.yaml
    for (const auto& f : files) {
      if (f == "config.yaml") continue;  // the run's config: its output_dir differs
      EXPECT_TRUE(anvil::testing::read_text(a / f) == anvil::testing::read_text(b / f))
          << ckpt << "/" << f.string() << " differs";
    }
  }

  // The stall of each save is on the line after its step's, and a write's
  // time on the first line after it was seen finished.
  const auto lines = anvil::testing::metrics_by_step(dir_ / "async" / "metrics.jsonl");
  for (const int64_t step : {3, 5}) {
    ASSERT_TRUE(lines.at(step).contains("time/checkpoint_stall_s")) << lines.at(step).dump();
    // The step's update waited for the copy (most of the 0.3 s).
    EXPECT_GE(lines.at(step)["time/checkpoint_stall_s"].get<double>(), 0.05) << lines.at(step).dump();
  }
  EXPECT_FALSE(lines.at(4).contains("time/checkpoint_stall_s"));
  // checkpoint-2's write is collected by step 5 at the latest (save 4 waits
  // for it); checkpoint-4's is joined by save 6, after the last line.
  int writes = 0;
  for (const int64_t step : {3, 4, 5}) writes += lines.at(step).contains("time/checkpoint_write_s");
  EXPECT_EQ(writes, 1);
  EXPECT_NE(log.find("saved " + (dir_ / "async" / "checkpoint-6").string() + " in the background: "), std::string::npos)
      << log;
}

// A file-size limit (ulimit -f, SIGXFSZ ignored) makes the first background
// write fail: the run stops at the next step or save with the checkpoint's
// name and the cause, and leaves no folder behind.
TEST_F(CheckpointAsync, AFailedBackgroundWriteStopsTheRunNamingTheCheckpoint) {
  std::string log;
  EXPECT_NE(anvil::testing::train_in(dir_, kRun, "", &log, "trap '' XFSZ; ulimit -f 48; "), 0) << log;
  EXPECT_NE(log.find("saving checkpoint-2 in " + (dir_ / "out").string() + " failed ("), std::string::npos) << log;
  EXPECT_NE(log.find("write failed: File too large"), std::string::npos) << log;
  EXPECT_FALSE(stdfs::exists(dir_ / "out" / "checkpoint-2"));
  EXPECT_FALSE(stdfs::exists(dir_ / "out" / "checkpoint-4"));
  for (const auto& e : stdfs::directory_iterator(dir_ / "out"))
    EXPECT_NE(e.path().filename().string().rfind(".checkpoint-", 0), 0u) << "left behind: " << e.path();
}

// A one-process mixed-precision run (dist.param_dtype: bfloat16: the sharded
// engine on one rank) saves its float32 masters and moments in the
// single-process layout, in the background; killed mid-write it resumes from
// the previous checkpoint bit for bit.
TEST_F(CheckpointAsync, OneRankMixedPrecisionRunsSaveInTheBackgroundAndResumeBitIdentically) {
  anvil::testing::write_text(dir_ / "run.yaml", std::string(kRun) + "dist: {param_dtype: bfloat16}\n");
  const auto reference = run_to_end(dir_ / "ref");
  ASSERT_EQ(reference.size(), 6u);
  const auto ref_log = anvil::testing::read_text(dir_ / "log.txt");
  EXPECT_NE(ref_log.find("writing " + (dir_ / "ref" / "checkpoint-2").string() + " in the background"),
            std::string::npos)
      << ref_log;
  const auto ckpt = dir_ / "ref" / "checkpoint-2";
  EXPECT_FALSE(stdfs::exists(ckpt / "sharding.json"));
  EXPECT_EQ(io::SafetensorsFile(ckpt / "model.safetensors").get("transformer.wte.weight").scalar_type(), at::kFloat);
  EXPECT_TRUE(
      io::SafetensorsFile(ckpt / "optimizer.safetensors").contains("transformer.h.1.mlp.c_fc.weight.exp_avg_sq"));

  const auto out = dir_ / "killed";
  const auto tmp = kill_while_writing_checkpoint_4(out);
  ASSERT_TRUE(tmp) << "no write of checkpoint-4 was seen; log:\n" << anvil::testing::read_text(dir_ / "log.txt");
  EXPECT_FALSE(stdfs::exists(out / "checkpoint-4"));
  expect_resumes_from_checkpoint_2(out, reference);
}

}  // namespace
}  // namespace anvil::train
