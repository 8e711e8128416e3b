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

// Issue 59, defect 5: keys that say how a run executes, not what it computes
// (a program's timeout, how many sequences are generated or scored
// together), may change on resume, a registered section's as the built-in
// ones: their rule says so (config::changeable_on_resume).
TEST(ResumeConfig, TimeoutsAndWorkBatchesMayChangeAndTrainingKeysMayNot) {
  for (const char* key : {"ppo.environment.timeout_s", "ppo.reward.timeout_s", "ppo.generation_batch_size",
                          "ppo.reward.batch_size", "ppo.rewards[1].timeout_s", "ppo.rewards[0].batch_size",
                          "train.num_train_epochs", "dist.timeout_s", "logging.level"})
    EXPECT_TRUE(config::may_change_on_resume(key)) << key;
  // The keys that could always change, now by their rules.
  for (const char* key : {"train.max_steps",
                          "train.save_every",
                          "train.eval_every",
                          "train.log_every",
                          "train.keep_checkpoints",
                          "train.threads",
                          "train.tf32",
                          "train.resume",
                          "train.resume_from",
                          "train.allow_config_change",
                          "dist.timeout_s",
                          "output_dir",
                          "train.profile_steps",
                          "train.overlap_step_reads",
                          "train.cuda_graphs",
                          "train.unverified_cuda",
                          "train.device",
                          "dist.sharding",
                          "dist.backend",
                          "dist.consolidated_checkpoints",
                          "eval.batch_size",
                          "eval.max_batches",
                          "eval.generate_samples",
                          "eval.max_new_tokens",
                          "eval.table_rows",
                          "logging.level",
                          "logging.tensorboard",
                          "logging.tensorboard_dir"})
    EXPECT_TRUE(config::may_change_on_resume(key)) << key;
  for (const char* key : {"ppo.kl_coef", "ppo.reward.command", "ppo.rewards[1].weight", "ppo.max_new_tokens",
                          "schedule.warmup_ratio", "data.train[0].path", "no.such.key", "ppo.rewards["})
    EXPECT_FALSE(config::may_change_on_resume(key)) << key;
  // A list of maps compares item by item, so each changed key is judged on its own.
  const auto changes =
      config::config_changes("algorithm: ppo\nppo: {rewards: [{command: a, timeout_s: 5}, {command: b}]}\n",
                             "algorithm: ppo\nppo: {rewards: [{command: a, timeout_s: 50}, {command: c}]}\n");
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].key, "ppo.rewards[0].timeout_s");
  EXPECT_EQ(changes[1].key, "ppo.rewards[1].command");
  // A list that changes length is one change.
  const auto longer = config::config_changes("data: {train: [{path: a}]}\n", "data: {train: [{path: a}, {path: b}]}\n");
  ASSERT_EQ(longer.size(), 1u);
  EXPECT_EQ(longer[0].key, "data.train");
}

/// configs/ppo_tiny.yaml on a fresh one-layer model, with an environment
/// program that ends each episode at once and a reward program.
int tiny_ppo(const TempDir& dir, int64_t max_steps, const std::string& extra, std::string* log) {
  const auto program = [&](const std::string& name, const std::string& answer) {
    anvil::testing::write_text(dir / name,
                               "import sys\nfor line in sys.stdin:\n  print('" + answer + "', flush=True)\n");
    return anvil::testing::python_bin() + " -u " + (dir / name).string();
  };
  const auto env = program("env.py", R"({\"done\": true, \"reward\": 1.0})");
  const auto reward = program("reward.py", R"({\"reward\": 0.5})");
  return anvil::testing::run(
      "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
          " --config configs/ppo_tiny.yaml output_dir=" + (dir / "out").string() +
          " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 model.num_attention_heads=2"
          " model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model train.threads=1 data.eval=null"
          " ppo.reward.exact_match= 'ppo.reward.command=" +
          reward + "' 'ppo.environment.command=" + env + "' train.max_steps=" + std::to_string(max_steps) + " " +
          extra + " 2>&1",
      log);
}

TEST(ResumeConfig, APpoRunResumesWithLongerTimeoutsAndOtherWorkBatches) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(tiny_ppo(dir, 4, "", &log), 0) << log;  // one rollout of 4 steps
  const std::string changed =
      "ppo.environment.timeout_s=60 ppo.reward.timeout_s=120 ppo.generation_batch_size=16 ppo.reward.batch_size=8";
  ASSERT_EQ(tiny_ppo(dir, 8, changed, &log), 0) << log;
  for (const char* change :
       {"resume: ppo.environment.timeout_s changes from 30.0 to 60.0",
        "resume: ppo.reward.timeout_s changes from 60.0 "
        "to 120.0",
        "resume: ppo.generation_batch_size changes from 0 to 16", "resume: ppo.reward.batch_size changes from 64 to 8"})
    EXPECT_NE(log.find(change), std::string::npos) << change << "\n" << log;
  EXPECT_NE(log.find("resumed from " + (dir / "out" / "checkpoint-4").string() + " at step 4"), std::string::npos)
      << log;
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-8"));
  // A key that changes what the run computes still stops it.
  EXPECT_EQ(tiny_ppo(dir, 12, changed + " ppo.kl_coef=0.2", &log), 2) << log;
  EXPECT_NE(log.find("in keys that change training:\n  ppo.kl_coef: 0.05 -> 0.2\n"), std::string::npos) << log;
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-12"));
}

}  // namespace
}  // namespace anvil::train
