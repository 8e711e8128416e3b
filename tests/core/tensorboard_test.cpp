// TensorBoard event files written natively, read back by the `tensorboard`
// package itself (tests/parity/tensorboard_read.py): every scalar equals
// metrics.jsonl's (as float32, TensorBoard's simple_value), across a resume
// that redoes steps, and the eval samples and config are there as text.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <thread>

#include "core/tensorboard.h"
#include "test_util.h"

namespace anvil {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

nlohmann::json read_logs(const stdfs::path& dir) {
  std::string out;
  EXPECT_EQ(run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                    "/tests/parity/tensorboard_read.py " + dir.string() + " 2>/dev/null",
                &out),
            0)
      << out;
  return nlohmann::json::parse(out);
}

TEST(TensorBoard, Crc32cMatchesTheKnownCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // CRC-32C's published check value
}

TEST(TensorBoard, ScalarsAndTextReadBackInTensorBoard) {
  TempDir dir;
  {
    TensorBoardWriter w(dir / "tb", std::nullopt);
    w.scalars(1, {{"loss", 2.5}, {"lr", 1e-3}});
    w.scalars(2, {{"loss", 1.25}});
    w.text(2, "eval/samples", "| a | b |\n|---|---|\n| x | y |\n");
  }
  const auto logs = read_logs(dir / "tb");
  EXPECT_EQ(logs["scalars"]["loss"], nlohmann::json::parse("[[1, 2.5], [2, 1.25]]"));
  EXPECT_EQ(logs["scalars"]["lr"][0][1].get<double>(), static_cast<double>(1e-3f));
  EXPECT_EQ(logs["texts"]["eval/samples"][0][1], "| a | b |\n|---|---|\n| x | y |\n");
}

// A run of 20 steps with checkpoints at 10 and 20; checkpoint-20 is removed
// and the run is started again, so it resumes at 10 and logs steps 11..20 a
// second time (as a run killed after step 20's line but before its save
// would). TensorBoard then shows each step once, with the values of
// metrics.jsonl.
TEST(TensorBoard, TrainerLogsEqualMetricsJsonlAcrossAResume) {
  TempDir dir;
  anvil::testing::write_text(dir / "run.yaml", anvil::testing::tiny_sft_run(20, 10) + "output_dir: " +
                                                   (dir / "out").string() + "\nlogging: {tensorboard: true}\n");
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() + " --config " +
                   (dir / "run.yaml").string() +
                   " train.log_every=1 train.eval_every=10 'data.eval=[{path: data/sft_eval.jsonl}]' "
                   "eval.generate_samples=8 eval.table_rows=2 2>&1";
  std::string log;
  ASSERT_EQ(run(cmd, &log), 0) << log;
  stdfs::remove_all(dir / "out" / "checkpoint-20");
  ASSERT_EQ(run(cmd, &log), 0) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;

  std::map<int64_t, nlohmann::json> lines;
  std::ifstream in(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      lines[j["step"].get<int64_t>()] = j;
    }
  ASSERT_EQ(lines.size(), 20u);
  const auto logs = read_logs(dir / "out" / "tensorboard");
  std::map<std::string, size_t> seen;
  for (const auto& [step, m] : lines)
    for (const auto& [k, v] : m.items()) {
      if (k == "step") continue;
      ++seen[k];
      ASSERT_TRUE(logs["scalars"].contains(k)) << k;
      const auto& points = logs["scalars"][k];
      size_t found = 0;
      for (const auto& p : points)
        if (p[0].get<int64_t>() == step) {
          ++found;
          EXPECT_EQ(p[1].get<double>(), static_cast<double>(static_cast<float>(v.get<double>())))
              << k << " at step " << step;
        }
      EXPECT_EQ(found, 1u) << k << " at step " << step << ": each step once";
    }
  for (const auto& [k, points] : logs["scalars"].items()) EXPECT_EQ(points.size(), seen[k]) << k;
  EXPECT_TRUE(logs["texts"].contains("config"));
  ASSERT_TRUE(logs["texts"].contains("eval/samples"));
  EXPECT_NE(logs["texts"]["eval/samples"][0][1].get<std::string>().find("| prompt | generated | reference |"),
            std::string::npos);
}

// SIGKILL past a checkpoint, then a resume that redoes the steps after it:
// the loader `tensorboard --logdir` uses shows every scalar and text once
// per step (the resumed file's start marker drops the killed run's orphans).
TEST(TensorBoard, AKilledAndResumedRunShowsEachStepOnceInTensorBoardsLoader) {
  TempDir dir;
  const auto config = dir / "run.yaml";
  anvil::testing::write_text(
      config,
      "model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: "
      "4, dropout: 0.0}\n"
      "tokenizer: {path: data/tokenizer.model}\n"
      "data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}]}\n"
      "optimizer: {lr: 1.0e-3}\n"
      "schedule: {warmup_steps: 0}\n"
      "train: {max_steps: 60, micro_batch_size: 4, save_every: 10, keep_checkpoints: 0, log_every: 1, "
      "eval_every: 10, threads: 1}\n"
      "eval: {generate_samples: 8, table_rows: 2, max_batches: 2}\n"
      "logging: {tensorboard: true}\n");
  const auto out = dir / "out";
  const auto lines = [&] {
    std::ifstream in(out / "metrics.jsonl");
    size_t n = 0;
    for (std::string l; std::getline(in, l);) n += !l.empty();
    return n;
  };
  {
    anvil::testing::TrainerProcess p(config, out, dir / "log.txt");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    // Past step 13, and checkpoint-10 complete (it is written in the background).
    while (p.running() && (lines() < 14 || !stdfs::exists(out / "checkpoint-10" / "trainer_state.json")) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(p.running()) << anvil::testing::read_text(dir / "log.txt");
    p.signal(SIGKILL);
    EXPECT_EQ(p.wait(), 128 + SIGKILL);
  }
  const auto killed_at = lines();
  ASSERT_GE(killed_at, 14u);
  ASSERT_LT(killed_at, 60u) << "the run ended before it was killed";
  anvil::testing::TrainerProcess resumed(config, out, dir / "log.txt");
  ASSERT_EQ(resumed.wait(), 0) << anvil::testing::read_text(dir / "log.txt");
  const auto log = anvil::testing::read_text(dir / "log.txt");
  ASSERT_NE(log.find("resumed from"), std::string::npos) << log;

  const auto logs = read_logs(out / "tensorboard");
  ASSERT_TRUE(logs["scalars"].contains("loss"));
  for (const char* kind : {"scalars", "texts"})
    for (const auto& [tag, points] : logs[kind].items()) {
      std::map<int64_t, int> steps;
      for (const auto& p : points) ++steps[p[0].get<int64_t>()];
      for (const auto& [step, n] : steps) EXPECT_EQ(n, 1) << kind << " " << tag << " at step " << step;
    }
  std::set<int64_t> loss_steps;
  for (const auto& p : logs["scalars"]["loss"]) loss_steps.insert(p[0].get<int64_t>());
  EXPECT_EQ(loss_steps.size(), 60u);
  ASSERT_TRUE(logs["texts"].contains("eval/samples"));
  EXPECT_EQ(logs["texts"]["eval/samples"].size(), 6u);  // steps 10, 20, ..., 60
}

}  // namespace
}  // namespace anvil
