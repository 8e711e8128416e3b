// Pretraining end to end: `anvil prepare` writes token shards, `trainer`
// streams them packed (algorithm: pretrain) and learns: held-out loss per
// token falls well below what the token frequencies alone give.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/token_shards.h"
#include "test_util.h"
#include "data/datasets.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;

/// Entropy (nats) of the unigram token distribution: the loss of a model
/// that learned only token frequencies.
double unigram_entropy(const data::TokenShards& shards) {
  std::map<int64_t, double> count;
  for (const auto& s : shards.shards())
    for (int64_t i = 0; i < s.tokens; ++i) count[shards.token(s, i)] += 1;
  double h = 0;
  for (auto [id, c] : count) {
    const double p = c / static_cast<double>(shards.num_tokens());
    h -= p * std::log(p);
  }
  return h;
}

TEST(Pretrain, PrepareThenTrainPackedOnShardsLearns) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto shards = (dir / "shards").string();
  ASSERT_EQ(
      anvil::testing::run(anvil::testing::cli_bin() + " prepare --tokenizer " + src + "/data/tokenizer.model --input " +
                              src + "/data/sft_train.jsonl --text-field prompt --text-field response --output " +
                              shards + " --shard-tokens 200000 2>&1",
                          &out),
      0)
      << out;
  EXPECT_NE(out.find("prepared " + shards + ": 20000 documents"), std::string::npos) << out;
  auto ts = data::TokenShards::open(shards);
  EXPECT_GT(ts->shards().size(), 1u);
  const double h1 = unigram_entropy(*ts);

  const auto run_dir = (dir / "run").string();
  ASSERT_EQ(anvil::testing::run(anvil::testing::trainer_bin() + " --config " + src + "/configs/pretrain_tiny.yaml" +
                                    " output_dir=" + run_dir + " 'data.train=[{path: " + shards +
                                    ", eval_fraction: 0.02}]' train.max_steps=150 train.eval_every=150"
                                    " train.save_every=150 train.threads=1 2>&1",
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("windows of 64 tokens"), std::string::npos) << out;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  std::string line, last_eval;
  while (std::getline(metrics, line))
    if (line.find("eval/loss") != std::string::npos) last_eval = line;
  ASSERT_FALSE(last_eval.empty()) << out;
  const double eval_loss = nlohmann::json::parse(last_eval)["eval/loss"].get<double>();
  std::cout << "held-out loss " << eval_loss << " nats/token vs unigram entropy " << h1 << "\n";
  EXPECT_LT(eval_loss, 0.55 * h1);
}

TEST(Pretrain, PrepareReportsBadLinesOrSkipsThem) {
  TempDir dir;
  anvil::testing::write_text(dir / "in.jsonl",
                             "{\"text\": \"add: 1+1\"}\n{\"txt\": \"oops\"}\n{\"text\": \"sort: ba\"}\n");
  const auto base = anvil::testing::cli_bin() + " prepare --tokenizer " + anvil::testing::source_dir() +
                    "/data/tokenizer.model --input " + (dir / "in.jsonl").string() + " --output ";
  std::string out;
  EXPECT_EQ(anvil::testing::run(base + (dir / "a").string() + " 2>&1", &out), 2);
  EXPECT_NE(out.find("in.jsonl:2: missing field \"text\""), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));  // nothing half-written
  ASSERT_EQ(anvil::testing::run(base + (dir / "b").string() + " --on-error skip 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("2 documents"), std::string::npos) << out;
  EXPECT_NE(out.find("1 malformed lines skipped"), std::string::npos) << out;
  EXPECT_EQ(data::TokenShards::open(dir / "b")->num_docs(), 2);
}

// The trainer saves the global sample position and restores it: a packed
// mixture resumed from a checkpoint continues with exactly the batches (and
// so the losses) of an uninterrupted run.
TEST(DataResume, PackedMixtureResumesWithTheUninterruptedLosses) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  const auto base = anvil::testing::trainer_bin() + " --config " + src + "/configs/quickstart.yaml" +
                    " 'data.train=[{path: " + src + "/data/sft_train.jsonl, size: 150}, {path: " + src +
                    "/data/sft_eval.jsonl, fraction: 0.5}]' data.packing=true train.micro_batch_size=8"
                    " schedule.warmup_steps=0 schedule.decay=constant train.save_every=4 train.eval_every=0"
                    " eval.generate_samples=0 train.threads=1 train.log_every=100 train.keep_checkpoints=0";
  std::string out;
  ASSERT_EQ(anvil::testing::run(base + " output_dir=" + (dir / "straight").string() + " train.max_steps=45 2>&1", &out),
            0)
      << out;
  EXPECT_NE(out.find("mixture: an epoch is 350 samples"), std::string::npos) << out;
  // Stop mid-epoch (step 13), again just after the first epoch ended (about 10 samples a step), then run on.
  auto epoch_at = [&](const std::string& run, int step) {
    const auto st = nlohmann::json::parse(
        anvil::testing::read_text(dir / run / ("checkpoint-" + std::to_string(step)) / "trainer_state.json"));
    return st["data"]["epoch"].get<int64_t>();
  };
  for (int stop : {13, 37, 45})
    ASSERT_EQ(anvil::testing::run(base + " output_dir=" + (dir / "resumed").string() +
                                      " train.max_steps=" + std::to_string(stop) + " 2>&1",
                                  &out),
              0)
        << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_EQ(epoch_at("resumed", 13), 0);
  EXPECT_EQ(epoch_at("resumed", 37), 1);
  const auto a = anvil::testing::read_losses(dir / "straight" / "metrics.jsonl");
  const auto b = anvil::testing::read_losses(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 45u);
  ASSERT_EQ(b.size(), 45u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace anvil::train
