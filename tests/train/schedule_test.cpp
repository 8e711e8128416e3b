#include "optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace anvil::optim {
namespace {

TEST(Schedule, WarmupThenCosineToTheFloor) {
  config::ScheduleConfig s;
  s.warmup_steps = 10;
  s.decay = "cosine";
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 0, 110), 0.0);  // as HF: the first warmup step has lr 0
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 5, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 110), 1.0);
  EXPECT_NEAR(lr_at(s, 1.0, 60, 110), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(lr_at(s, 1.0, 110, 110), 0.1, 1e-12);
}

TEST(Schedule, LinearAndConstant) {
  config::ScheduleConfig s;
  s.decay = "linear";
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 0, 100), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 50, 100), 1.0);
  s.decay = "constant";
  EXPECT_DOUBLE_EQ(lr_at(s, 2.0, 99, 100), 2.0);
}

TEST(Schedule, AWarmupLongerThanTheRunIsClampedToIt) {
  config::ScheduleConfig s;
  s.warmup_steps = 100;
  s.decay = "cosine";
  // 40 steps: the warmup ends with the run, reaching the peak at its last step instead of 40 % of it.
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 40), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 40, 40), 1.0);
  // Within the run, unchanged.
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10, 400), 0.1);
}

}  // namespace
}  // namespace anvil::optim
