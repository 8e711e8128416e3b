#include "optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "test_util.h"
#include "train/run_setup.h"

namespace anvil::optim {
namespace {

TEST(Schedule, WarmupThenCosineToTheFloor) {
  config::ScheduleConfig s;
  s.warmup_steps = 10;
  s.decay = config::Decay::kCosine;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 0, 110), 0.0);  // as HF: the first warmup step has lr 0
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 5, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 110), 1.0);
  EXPECT_NEAR(lr_at(s, 1.0, 60, 110), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(lr_at(s, 1.0, 110, 110), 0.1, 1e-12);
}

TEST(Schedule, LinearAndConstant) {
  config::ScheduleConfig s;
  s.decay = config::Decay::kLinear;
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 0, 100), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 50, 100), 1.0);
  s.decay = config::Decay::kConstant;
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 99, 100), 2.0);
}

TEST(Schedule, AWarmupLongerThanTheRunIsClampedToIt) {
  config::ScheduleConfig s;
  s.warmup_steps = 100;
  s.decay = config::Decay::kCosine;
  // 40 steps: the warmup ends with the run, reaching the peak at its last step instead of 40 % of it.
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 40), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 40, 40), 1.0);
  // Within the run, unchanged.
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 400), 0.1);
}

// schedule.warmup_ratio as transformers' get_warmup_steps takes it:
// ceil(ratio * steps), in doubles (Python's math.ceil(100 * 0.07) is 8), and
// warmup_steps when that is set.
TEST(Schedule, WarmupRatioIsAFractionOfTheRunRoundedUp) {
  config::ScheduleConfig s;
  s.warmup_ratio = 0.25;
  EXPECT_EQ(warmup_steps(s, 8), 2);
  EXPECT_EQ(warmup_steps(s, 9), 3);
  EXPECT_EQ(warmup_steps(s, 1), 1);
  s.warmup_ratio = 0.07;
  EXPECT_EQ(warmup_steps(s, 100), 8);
  s.warmup_ratio = 0;
  s.warmup_steps = 5;
  EXPECT_EQ(warmup_steps(s, 100), 5);
  EXPECT_EQ(warmup_steps(config::ScheduleConfig{}, 100), 0);
  // The schedule warms up over those steps.
  s.warmup_steps = 0;
  s.warmup_ratio = 0.25;
  s.decay = config::Decay::kConstant;
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 0, 8), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 1, 8), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 2, 8), 1.0);
}

// train.num_train_epochs as transformers' Trainer resolves it:
// max_steps = ceil(epochs * steps per epoch), an epoch ceil(rows / rows per step) steps.
TEST(Schedule, EpochsGiveTheStepsTransformersCounts) {
  EXPECT_EQ(train::steps_for_epochs(1.5, 40, 8), 8);    // 5 steps an epoch
  EXPECT_EQ(train::steps_for_epochs(1, 41, 8), 6);      // the last step of an epoch is partly the next one's
  EXPECT_EQ(train::steps_for_epochs(0.1, 40, 8), 1);    // ceil(0.5)
  EXPECT_EQ(train::steps_for_epochs(3, 3, 8), 3);       // an epoch smaller than a step is one step
  EXPECT_EQ(train::steps_for_epochs(0.07, 800, 8), 8);  // ceil(0.07 * 100) in doubles, as Python's math.ceil
  EXPECT_EQ(train::steps_for_epochs(2, 20000, 32), 1250);
}

std::vector<nlohmann::json> metric_lines(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A run of 1.5 epochs over 40 samples, 8 a step (4 x 2 micro-batches): 8
// steps, logged at the start; a warmup of 0.25 of them: 2 steps, which the
// lr of each step follows. Stopped after step 4 and resumed, it trains the same
// steps with the same lr and losses.
TEST(ScheduleRuns, EpochsAndWarmupRatioSetTheStepsAndTheLr) {
  anvil::testing::TempDir dir;
  const std::string keys =
      "train.max_steps=null train.num_train_epochs=1.5 data.train[0].size=40 train.grad_accum_steps=2 "
      "schedule.warmup_steps=null schedule.warmup_ratio=0.25 schedule.decay=constant";
  const auto yaml = anvil::testing::tiny_sft_run(1, 0);
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, keys, &log, ""), 0) << log;
  EXPECT_NE(log.find("train.num_train_epochs 1.5: 8 steps (an epoch of 40 samples is 5 steps of 8 samples)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("schedule.warmup_ratio 0.25: 2 warmup steps of 8"), std::string::npos) << log;
  const auto ref = metric_lines(dir / "out" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 8u);
  const double lr = 1e-3;  // tiny_sft_run's optimizer.lr
  EXPECT_EQ(ref[0]["lr"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(ref[1]["lr"].get<double>(), 0.5 * lr);
  for (size_t i = 2; i < ref.size(); ++i) EXPECT_DOUBLE_EQ(ref[i]["lr"].get<double>(), lr) << "step " << i + 1;
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "checkpoint-8"));

  anvil::testing::TempDir cut;
  ASSERT_EQ(anvil::testing::train_in(cut, yaml, keys, &log, "ANVIL_TEST_SIGNALS_AT_STEP=3:TERM "), 0) << log;
  ASSERT_TRUE(std::filesystem::exists(cut / "out" / "checkpoint-4")) << log;
  ASSERT_EQ(anvil::testing::train_in(cut, yaml, keys, &log, ""), 0) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  const auto resumed = metric_lines(cut / "out" / "metrics.jsonl");
  ASSERT_EQ(resumed.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(resumed[i]["lr"].get<double>(), ref[i]["lr"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(resumed[i]["loss"].get<double>(), ref[i]["loss"].get<double>()) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace anvil::optim
