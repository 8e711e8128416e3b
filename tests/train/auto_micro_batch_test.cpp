// train.micro_batch_size: auto (docs/config.md), on one process and on two ranks: a step whose
// micro-batch runs out of device memory is run again with micro-batches of
// half the rows and twice the accumulation, the same samples and the same
// math; the value reached is logged, written to metrics.jsonl and kept in
// checkpoints, which resume with it. Out-of-memory errors come from the
// trainer's testing hook ANVIL_TEST_OOM_ROWS=N (a micro-batch of N rows or
// more raises torch's c10::OutOfMemoryError after its forward).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distributed/dist_runs.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
using anvil::testing::tiny_sft_run;
using anvil::testing::train_in;
namespace stdfs = std::filesystem;

const auto metrics = anvil::distributed::read_metrics;  // metrics.jsonl by step

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

nlohmann::json trainer_state(const stdfs::path& checkpoint) {
  return nlohmann::json::parse(anvil::testing::read_text(checkpoint / "trainer_state.json"));
}

/// Each step's loss and gradient norm within 1e-5 (relative) of `want`'s.
void expect_same_steps(const std::map<int64_t, nlohmann::json>& got, const std::map<int64_t, nlohmann::json>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [s, w] : want)
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_NEAR(got.at(s)[key].get<double>(), w[key].get<double>(), 1e-5 * std::abs(w[key].get<double>()))
          << key << " at step " << s;
}

const std::string kAuto = "train.micro_batch_size=auto train.global_batch_size=8";

TEST(AutoMicroBatch, HalvesOnOutOfMemoryAndTrainsAsTheSmallerMicroBatchDoes) {
  // 8 samples a step: one micro-batch of 8 first; 3 rows or more run out of memory, so 8 -> 4 -> 2, at step 1.
  TempDir a, b, c;
  std::string log;
  ASSERT_EQ(train_in(a, tiny_sft_run(6, 3), kAuto, &log, "ANVIL_TEST_OOM_ROWS=3 "), 0) << log;
  EXPECT_EQ(count(log, "ran out of device memory"), 2u) << log;
  EXPECT_NE(log.find("step 1 ran out of device memory with micro-batches of 8 rows; running it again with 4 (2 "
                     "micro-batches per step, the same samples)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("step 1 ran out of device memory with micro-batches of 4 rows; running it again with 2 (4 "),
            std::string::npos)
      << log;
  const auto got = metrics(a / "out" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 6u);
  for (const auto& [step, m] : got) EXPECT_EQ(m["micro_batch_size"].get<double>(), 2) << "step " << step;
  for (const auto* ckpt : {"checkpoint-3", "checkpoint-6"})
    EXPECT_EQ(trainer_state(a / "out" / ckpt)["micro_batch_size"].get<int64_t>(), 2) << ckpt;
  EXPECT_NE(anvil::testing::read_text(a / "out" / "checkpoint-6" / "config.yaml").find("micro_batch_size: auto"),
            std::string::npos);

  // The same samples in micro-batches of 2 from the start: the same losses and gradient norms (the rows are
  // padded per micro-batch, so only round-off differs).
  ASSERT_EQ(train_in(b, tiny_sft_run(6, 3), "train.micro_batch_size=2 train.global_batch_size=8", &log), 0) << log;
  const auto want = metrics(b / "out" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  expect_same_steps(got, want);

  // A resume takes the recorded micro-batch: no out-of-memory error again, and steps 4-6 bit for bit.
  stdfs::create_directories(c / "out");
  stdfs::copy(a / "out" / "checkpoint-3", c / "out" / "checkpoint-3", stdfs::copy_options::recursive);
  ASSERT_EQ(train_in(c, tiny_sft_run(6, 3), kAuto, &log, "ANVIL_TEST_OOM_ROWS=3 "), 0) << log;
  EXPECT_NE(log.find("train.micro_batch_size: auto: micro-batches of 2 rows, as the checkpoint recorded"),
            std::string::npos)
      << log;
  EXPECT_EQ(count(log, "ran out of device memory"), 0u) << log;
  const auto resumed = metrics(c / "out" / "metrics.jsonl");
  for (int64_t s = 4; s <= 6; ++s) EXPECT_EQ(resumed.at(s)["loss"], got.at(s)["loss"]) << "step " << s;
}

TEST(AutoMicroBatch, SaysWhereItCannotRun) {
  TempDir dir;
  std::string log;
  // One row that does not fit: the error names the step.
  EXPECT_NE(train_in(dir, tiny_sft_run(2, 0), kAuto, &log, "ANVIL_TEST_OOM_ROWS=1 "), 0);
  EXPECT_NE(log.find("train.micro_batch_size: auto: step 1 runs out of device memory with micro-batches of 1 row: "
                     "ANVIL_TEST_OOM_ROWS"),
            std::string::npos)
      << log;
  // Without a global batch to start from, or with an accumulation of its own.
  EXPECT_NE(train_in(dir, tiny_sft_run(2, 0), "train.micro_batch_size=auto", &log), 0);
  EXPECT_NE(log.find("train.micro_batch_size: auto starts from the step's whole batch: set train.global_batch_size"),
            std::string::npos)
      << log;
  EXPECT_NE(train_in(dir, tiny_sft_run(2, 0), std::string(kAuto) + " train.grad_accum_steps=2", &log), 0);
  EXPECT_NE(log.find("train.grad_accum_steps: cannot be set with train.micro_batch_size: auto"), std::string::npos)
      << log;
  // An objective whose rows depend on each other (DPO's pairs are split by its own source).
  EXPECT_NE(anvil::testing::run(
                "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                    " --config configs/dpo_tiny.yaml --config configs/models/gpt2-debug.yaml 'model.from=\"\"' "
                    "tokenizer.path=data/tokenizer.model output_dir=" +
                    (dir / "dpo").string() + " " + kAuto + " --dry-run",
                &log),
            0);
  EXPECT_NE(log.find("train.micro_batch_size: auto: algorithm dpo cannot split its micro-batches"), std::string::npos)
      << log;
  // Several ranks: it starts from one micro-batch per rank, so the step's samples must divide among them.
  EXPECT_NE(train_in(dir, tiny_sft_run(2, 0), kAuto, &log, anvil::testing::mpirun(3)), 0);
  EXPECT_NE(log.find("train.global_batch_size: 8 samples per step do not divide among 3 ranks"), std::string::npos)
      << log;
}

// On several ranks the ranks agree before each collective of a step's forwards and backwards that none ran out
// of memory (distributed::ShardingOptions::agree_on_out_of_memory): when one rank does, every rank leaves the
// step at the same point and runs it again, split. Rank 1 alone runs out here, in the forward of its first
// micro-batch, while rank 0 goes on to its backward's first collective.
TEST(AutoMicroBatch, OnTwoFullShardRanksEveryRankHalvesWhenOneRunsOutOfMemory) {
  TempDir a, b;
  std::string log;
  const std::string sharded = " dist.sharding=full_shard dist.timeout_s=60";  // ranks that disagree fail, not hang
  // 8 samples a step: one micro-batch of 4 per rank first; 3 rows or more run out of memory on rank 1.
  ASSERT_EQ(train_in(a, tiny_sft_run(4, 2), kAuto + sharded, &log,
                     "ANVIL_TEST_OOM_ROWS=3 ANVIL_TEST_OOM_RANK=1 " + anvil::testing::mpirun(2)),
            0)
      << log;
  EXPECT_EQ(count(log, "ran out of device memory"), 2u) << log;
  EXPECT_NE(log.find("step 1 ran out of device memory on this rank with micro-batches of 4 rows; running it again "
                     "with 2 (4 micro-batches per step, the same samples)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("step 1 ran out of device memory on another rank with micro-batches of 4 rows; running it "
                     "again with 2"),
            std::string::npos)
      << log;
  const auto got = metrics(a / "out" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [step, m] : got) EXPECT_EQ(m["micro_batch_size"].get<double>(), 2) << "step " << step;
  EXPECT_EQ(trainer_state(a / "out" / "checkpoint-4")["micro_batch_size"].get<int64_t>(), 2);

  // The same ranks with micro-batches of 2 from the start: the same steps, up to round-off (on AVX-512 Intel
  // CPUs MKL picks its float32 GEMM kernels by the operands' alignment, which the abandoned attempt moves:
  // docs/reliability.md).
  ASSERT_EQ(train_in(b, tiny_sft_run(4, 2), "train.micro_batch_size=2 train.global_batch_size=8" + sharded, &log,
                     anvil::testing::mpirun(2)),
            0)
      << log;
  const auto want = metrics(b / "out" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  expect_same_steps(got, want);
}

}  // namespace
}  // namespace anvil::train
