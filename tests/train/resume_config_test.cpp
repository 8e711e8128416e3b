// Resume never drifts silently: a re-run in the same output_dir compares its
// config with the checkpoint's. Length, cadence and where-it-runs keys may
// change (each change logged); any other difference stops the run unless
// train.allow_config_change is set. Every start's config is kept in
// config-history/. train.resume and train.resume_from choose what to continue.
#include <gtest/gtest.h>

#include <sstream>

#include "anvil/config/config.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

int train(const TempDir& dir, int64_t max_steps, const std::string& extra, std::string* log) {
  return anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(max_steps, 2), extra, log, "");
}

TEST(ResumeConfig, LengthAndCadenceMayChangeAndAreLogged) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, 2, "", &log), 0) << log;
  ASSERT_EQ(train(dir, 4, "train.log_every=1 eval.max_batches=1", &log), 0) << log;
  EXPECT_NE(log.find("resume: train.max_steps changes from 2 to 4"), std::string::npos) << log;
  EXPECT_NE(log.find("resume: train.log_every changes from 1000 to 1"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  // Each start's config is kept, by the step it started from.
  EXPECT_NE(anvil::testing::read_text(dir / "out" / "config-history" / "step-0.yaml").find("max_steps: 2"),
            std::string::npos);
  EXPECT_NE(anvil::testing::read_text(dir / "out" / "config-history" / "step-2.yaml").find("max_steps: 4"),
            std::string::npos);
}

TEST(ResumeConfig, ATrainingChangeStopsTheRunWithTheKeysAndTheWaysOn) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, 2, "", &log), 0) << log;
  EXPECT_EQ(train(dir, 4, "optimizer.lr=0.01 train.seed=7", &log), 2) << log;
  EXPECT_NE(log.find("this config differs from the run's (" + (dir / "out" / "checkpoint-2" / "config.yaml").string() +
                     ") in keys that change training:\n  optimizer.lr: 0.001 -> 0.01\n  train.seed: 1234 -> 7\n"
                     "Start a new run with another output_dir, or set train.allow_config_change=true"),
            std::string::npos)
      << log;
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-4"));
  // Allowed explicitly: it goes on, says so, and records the new config.
  ASSERT_EQ(train(dir, 4, "optimizer.lr=0.01 train.allow_config_change=true", &log), 0) << log;
  EXPECT_NE(log.find("resume: optimizer.lr changes from 0.001 to 0.01 (train.allow_config_change)"), std::string::npos)
      << log;
  EXPECT_NE(anvil::testing::read_text(dir / "out" / "config-history" / "step-2.yaml").find("lr: 0.01"),
            std::string::npos);
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-4"));
}

TEST(ResumeConfig, ResumeNeverAndResumeFrom) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, 2, "", &log), 0) << log;
  EXPECT_EQ(train(dir, 4, "train.resume=never", &log), 2) << log;
  EXPECT_NE(log.find("train.resume: never, but " + (dir / "out").string() +
                     " holds checkpoint-2; use another output_dir, or train.resume: auto to continue that run"),
            std::string::npos)
      << log;
  // resume_from: continue a chosen checkpoint into another folder.
  const auto ckpt = (dir / "out" / "checkpoint-2").string();
  ASSERT_EQ(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                    " --config " + (dir / "run.yaml").string() + " output_dir=" +
                                    (dir / "branch").string() + " train.max_steps=4 train.resume_from=" + ckpt,
                                &log),
            0)
      << log;
  EXPECT_NE(log.find("resumed from " + ckpt + " at step 2"), std::string::npos) << log;
  EXPECT_TRUE(stdfs::exists(dir / "branch" / "checkpoint-4"));
  EXPECT_FALSE(stdfs::exists(dir / "branch" / "checkpoint-2"));
  EXPECT_NE(train(dir, 4, "train.resume_from=" + (dir / "out").string(), &log), 0);
  EXPECT_NE(log.find("train.resume_from: " + (dir / "out").string() + " is not a complete checkpoint"),
            std::string::npos)
      << log;
}

TEST(ResumeConfig, ChangesAreListedKeyByKey) {
  const auto a = config::to_yaml(config::RunConfig{});
  auto cfg = config::RunConfig{};
  cfg.optimizer.lr = 0.5;
  cfg.train.max_steps = 9;
  const auto changes = config::config_changes(a, config::to_yaml(cfg));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].key, "optimizer.lr");
  EXPECT_EQ(changes[1].key, "train.max_steps");
  EXPECT_FALSE(config::may_change_on_resume("optimizer.lr"));
  EXPECT_TRUE(config::may_change_on_resume("train.max_steps"));
  EXPECT_TRUE(config::may_change_on_resume("eval.batch_size"));
  // A key missing from an older checkpoint's config.yaml had its default.
  EXPECT_TRUE(config::config_changes("output_dir: \"\"\n", a).empty());
  EXPECT_EQ(config::config_changes("train: {seed: 1}\n", a).size(), 1u);
  // Except where the default changed what such a run did: a checkpoint from
  // before optimizer.decay_biases_and_norms decayed biases and norms.
  auto decayed = config::RunConfig{};
  decayed.optimizer.weight_decay = 0.1;
  const auto old = std::string("optimizer: {weight_decay: 0.1}\n");
  const auto c = config::config_changes(old, config::to_yaml(decayed));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].key, "optimizer.decay_biases_and_norms");
  EXPECT_EQ(c[0].before, "true");
  decayed.optimizer.decay_biases_and_norms = true;
  EXPECT_TRUE(config::config_changes(old, config::to_yaml(decayed)).empty());
  // Without weight decay the rule changed nothing: no change to report.
  std::string undecayed;
  std::istringstream lines(a);
  for (std::string line; std::getline(lines, line);)
    if (line.find("decay_biases_and_norms") == std::string::npos) undecayed += line + "\n";
  EXPECT_TRUE(config::config_changes(undecayed, a).empty());
}

}  // namespace
}  // namespace anvil::train
