// ppo.async.rollout_ranks: the one-step-off schedule with its sampling on
// ranks of their own (mpirun, 3 and 4 ranks), against its oracle,
// ppo.async.emulate on one process: the same tokens, losses and checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace {

namespace stdfs = std::filesystem;
using anvil::testing::fixture_checkpoint;
using anvil::testing::run;
using anvil::testing::TempDir;

/// The trainer on `config` from the quickstart fixture, 12 steps logged one by one, checkpoints every 4;
/// `launch`: mpirun's prefix or "", `env`: variables before it.
int trainer(const stdfs::path& out, const std::string& config, const std::string& extra, const std::string& launch,
            std::string* log, const std::string& env = "") {
  return run("cd " + anvil::testing::source_dir() + " && " + env + " " + launch + anvil::testing::trainer_bin() +
                 " --config " + config + " output_dir=" + out.string() +
                 " model.from=" + fixture_checkpoint().string() +
                 " train.threads=1 train.max_steps=12 train.save_every=4 train.keep_checkpoints=0 train.eval_every=0"
                 " data.eval=null train.log_every=1 train.micro_batch_size=16 " +
                 extra + " 2>&1",
             log);
}

/// Keys whose values differ between any two runs (timings, speeds, memory), and the async launch's own.
bool measured(const std::string& key) {
  return key.find("time") != std::string::npos || key.find("_per_s") != std::string::npos ||
         key.find("memory") != std::string::npos || key == "rollout/weights_sent_bytes";
}

/// Every value `oracle` logs, logged by `run` within `tol` (relative; 0: bit for bit); returns how many.
int expect_same_metrics(const stdfs::path& oracle, const stdfs::path& other, double tol, const std::string& what) {
  const auto a = anvil::testing::metrics_by_step(oracle / "metrics.jsonl");
  const auto b = anvil::testing::metrics_by_step(other / "metrics.jsonl");
  EXPECT_EQ(a.size(), b.size()) << what;
  int compared = 0;
  for (const auto& [step, m] : a) {
    if (!b.count(step)) continue;
    for (const auto& [key, v] : m.items()) {
      if (measured(key) || !v.is_number()) continue;
      if (!b.at(step).contains(key)) {
        ADD_FAILURE() << what << ": step " << step << " has no " << key;
        continue;
      }
      const double x = v.get<double>(), y = b.at(step)[key].get<double>();
      if (tol == 0)
        EXPECT_EQ(x, y) << what << ", step " << step << " " << key;
      else
        EXPECT_LE(std::abs(x - y), tol * std::max(1.0, std::abs(x))) << what << ", step " << step << " " << key;
      ++compared;
    }
  }
  return compared;
}

/// The batches in flight of two runs' checkpoint-`step`: the same tokens, log-probs within `tol` (relative; 0:
/// bit for bit).
void expect_same_in_flight(const stdfs::path& a, const stdfs::path& b, int step, double tol) {
  const auto load = [&](const stdfs::path& run_dir) {
    const auto file = run_dir / ("checkpoint-" + std::to_string(step)) / "trainer_state.json";
    return nlohmann::json::parse(anvil::testing::read_text(file))["objective"]["in_flight"];
  };
  const auto x = load(a), y = load(b);
  EXPECT_EQ(x["sampled_by_iteration"], y["sampled_by_iteration"]);
  ASSERT_EQ(x["rows"].size(), y["rows"].size());
  ASSERT_GT(x["rows"].size(), 0u);
  double worst = 0;
  for (size_t i = 0; i < x["rows"].size(); ++i) {
    const auto &r = x["rows"][i], &s = y["rows"][i];
    ASSERT_EQ(r["prompt"], s["prompt"]) << "row " << i;
    ASSERT_EQ(r["response"], s["response"]) << "row " << i;
    EXPECT_EQ(r["score"], s["score"]) << "row " << i;
    const auto p = r["old_logp"].get<std::vector<double>>(), q = s["old_logp"].get<std::vector<double>>();
    for (size_t j = 0; j < p.size(); ++j)
      worst = std::max(worst, std::abs(p[j] - q[j]) / std::max(1.0, std::abs(p[j])));
  }
  EXPECT_LE(worst, tol) << "behaviour log-probs (relative), checkpoint-" << step;
}

}  // namespace

// GRPO (configs/grpo_tiny.yaml): 2 training ranks (full_shard) and 1 rollout
// rank log every value the emulation on the 2 training ranks alone logs and
// hold the same batch in flight at every checkpoint, bit for bit; so do 2 + 2
// ranks. Against the one-process emulation: the same tokens, every value
// within 1e-5 (the weights differ by the reductions' round-off). The rollout
// rank's weights hash to what the trainers sent, every iteration. A run whose
// trainers are killed (kill -9) and resumed logs what the uninterrupted one
// logs, bit for bit. A LoRA run sends the adapters alone after the first
// iteration. A rollout rank that hangs ends the run with the watchdog naming
// it; one whose weights differ ends it too.
TEST(PpoRuns, RolloutRanksMatchTheEmulationAndResumeAfterAKill) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string grpo = "configs/grpo_tiny.yaml";
  const std::string async = "ppo.async.rollout_ranks=1 ppo.async.check_weights=true dist.sharding=full_shard";
  std::string log;
  ASSERT_EQ(trainer(dir / "emulated", grpo, "ppo.async.emulate=true", "", &log), 0) << log;
  ASSERT_EQ(trainer(dir / "emulated2", grpo, "ppo.async.emulate=true dist.sharding=full_shard",
                    anvil::testing::mpirun(2), &log),
            0)
      << log;
  ASSERT_EQ(trainer(dir / "three", grpo, async, anvil::testing::mpirun(3), &log), 0) << log;
  EXPECT_NE(log.find("ppo.async.rollout_ranks: ranks 2-2 sample each rollout while ranks 0-1 train"), std::string::npos)
      << log;
  EXPECT_GE(expect_same_metrics(dir / "emulated2", dir / "three", 0, "2 trainers + 1 rollout rank"), 12 * 10);
  EXPECT_GE(expect_same_metrics(dir / "emulated", dir / "three", 1e-5, "against one process"), 12 * 10);
  for (const int step : {4, 8, 12}) {
    expect_same_in_flight(dir / "emulated2", dir / "three", step, 0);
    expect_same_in_flight(dir / "emulated", dir / "three", step, 1e-4);
  }
  const auto three = anvil::testing::metrics_by_step(dir / "three" / "metrics.jsonl");
  for (const int64_t step : {1, 5, 9}) {
    const auto& m = three.at(step);
    EXPECT_EQ(m["rollout/staleness"].get<double>(), step == 1 ? 0.0 : 1.0) << m.dump();
    for (const char* key : {"time/wait_rollout_s", "time/wait_train_s", "time/rollout_s", "rollout/weights_sent_bytes"})
      EXPECT_TRUE(m.contains(key)) << key << " " << m.dump();
  }
  // A full run sends every parameter each iteration.
  EXPECT_EQ(three.at(5)["rollout/weights_sent_bytes"], three.at(1)["rollout/weights_sent_bytes"]);

  ASSERT_EQ(trainer(dir / "four", grpo, "ppo.async.rollout_ranks=2 dist.sharding=full_shard", anvil::testing::mpirun(4),
                    &log),
            0)
      << log;
  EXPECT_GE(expect_same_metrics(dir / "emulated2", dir / "four", 0, "2 trainers + 2 rollout ranks"), 12 * 10);
  expect_same_in_flight(dir / "emulated2", dir / "four", 12, 0);

  // kill -9 of the trainers once step 6 is done (the rollout rank is sampling the third batch), then resume
  // from checkpoint-4.
  EXPECT_NE(trainer(dir / "killed", grpo, async, anvil::testing::mpirun(3), &log, "ANVIL_TEST_SIGNALS_AT_STEP=6:KILL"),
            0)
      << log;
  ASSERT_TRUE(stdfs::exists(dir / "killed" / "checkpoint-4" / "trainer_state.json")) << log;
  ASSERT_FALSE(stdfs::exists(dir / "killed" / "checkpoint-8")) << log;
  ASSERT_EQ(trainer(dir / "killed", grpo, async, anvil::testing::mpirun(3), &log), 0) << log;
  EXPECT_NE(log.find("at step 4"), std::string::npos) << log;
  EXPECT_GE(expect_same_metrics(dir / "three", dir / "killed", 0, "killed and resumed"), 12 * 10);
  expect_same_in_flight(dir / "three", dir / "killed", 12, 0);

  // kill -9 of the rollout rank as it would send the third batch (while the second iteration trains): the last
  // checkpoint is 4 (checkpoint-8 waits for that batch); resumed, the same run again.
  EXPECT_NE(
      trainer(dir / "rollout_killed", grpo, async, anvil::testing::mpirun(3), &log, "ANVIL_TEST_ROLLOUT_FAULT=2:kill"),
      0)
      << log;
  ASSERT_TRUE(stdfs::exists(dir / "rollout_killed" / "checkpoint-4" / "trainer_state.json")) << log;
  ASSERT_FALSE(stdfs::exists(dir / "rollout_killed" / "checkpoint-8")) << log;
  ASSERT_EQ(trainer(dir / "rollout_killed", grpo, async, anvil::testing::mpirun(3), &log), 0) << log;
  EXPECT_GE(expect_same_metrics(dir / "three", dir / "rollout_killed", 0, "rollout rank killed, resumed"), 12 * 10);
  // SIGTERM: the trainers finish the iteration, save and tell the rollout rank to stop; the rerun continues.
  ASSERT_EQ(trainer(dir / "stopped", grpo, async, anvil::testing::mpirun(3), &log, "ANVIL_TEST_SIGNALS_AT_STEP=5:TERM"),
            0)
      << log;
  EXPECT_NE(log.find("stop requested: saved step 8 and exiting"), std::string::npos) << log;
  ASSERT_EQ(trainer(dir / "stopped", grpo, async, anvil::testing::mpirun(3), &log), 0) << log;
  EXPECT_GE(expect_same_metrics(dir / "three", dir / "stopped", 0, "stopped and resumed"), 12 * 10);

  // LoRA: the first weights are the whole model, later ones the adapters alone; the hashes still agree.
  const std::string lora = " lora.r=4 'lora.target_modules=[all-linear]' optimizer.lr=1e-3";
  ASSERT_EQ(trainer(dir / "lora", grpo, async + lora + " train.max_steps=8", anvil::testing::mpirun(3), &log), 0)
      << log;
  const auto l = anvil::testing::metrics_by_step(dir / "lora" / "metrics.jsonl");
  ASSERT_TRUE(l.at(5).contains("rollout/weights_sent_bytes")) << l.at(5).dump();
  EXPECT_LT(l.at(5)["rollout/weights_sent_bytes"].get<double>() * 4,
            l.at(1)["rollout/weights_sent_bytes"].get<double>())
      << l.at(1).dump() << l.at(5).dump();

  // A rollout rank that hangs: the trainers' watchdog names the rank they wait for.
  EXPECT_NE(trainer(dir / "hung", grpo, async + " dist.timeout_s=8", anvil::testing::mpirun(3), &log,
                    "ANVIL_TEST_ROLLOUT_FAULT=2:hang"),
            0);
  EXPECT_NE(log.find("broadcast (the rows of rollout rank 2"), std::string::npos) << log;
  // Weights that are not what the trainers sent.
  EXPECT_NE(trainer(dir / "perturbed", grpo, async, anvil::testing::mpirun(3), &log, "ANVIL_TEST_ROLLOUT_PERTURB=1"),
            0);
  EXPECT_NE(log.find("ppo.async.check_weights: rollout rank 2 sampled with weights of version"), std::string::npos)
      << log;
}

// PPO with a separate critic (ppo.critic_from: it stays on the training ranks,
// which recompute the values), PPO with the value head under bypass (the
// rollout rank's values are used), and multi-turn tool rollouts (the
// environment program runs on the rollout rank): 2 + 1 ranks log what the
// one-process emulation logs. Launches and keys that cannot work are refused by name.
TEST(PpoRuns, RolloutRanksRunACriticAndToolEpisodesAsTheEmulation) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string log;
  const std::string ppo = "configs/ppo_tiny.yaml", critic = " ppo.critic_from=" + fixture_checkpoint().string();
  ASSERT_EQ(trainer(dir / "ppo_emulated", ppo, "ppo.async.emulate=true" + critic, "", &log), 0) << log;
  ASSERT_EQ(trainer(dir / "ppo_three", ppo, "ppo.async.rollout_ranks=1 ppo.async.check_weights=true" + critic,
                    anvil::testing::mpirun(3), &log),
            0)
      << log;
  EXPECT_GE(expect_same_metrics(dir / "ppo_emulated", dir / "ppo_three", 1e-5, "ppo with a critic"), 12 * 10);
  expect_same_in_flight(dir / "ppo_emulated", dir / "ppo_three", 12, 1e-4);

  // The value head (no critic) under bypass: the rollout rank's values are the behaviour's, used as they are.
  const std::string bypass = " ppo.async.correction=bypass train.max_steps=8";
  ASSERT_EQ(trainer(dir / "head_emulated", ppo, "ppo.async.emulate=true" + bypass, "", &log), 0) << log;
  ASSERT_EQ(trainer(dir / "head_three", ppo, "ppo.async.rollout_ranks=1" + bypass, anvil::testing::mpirun(3), &log), 0)
      << log;
  EXPECT_GE(expect_same_metrics(dir / "head_emulated", dir / "head_three", 1e-5, "value head, bypass"), 8 * 10);

  // Two-turn episodes: a tool message after the first turn, the reward at the second.
  anvil::testing::write_text(dir / "env.py",
                             "import json,sys\nfor l in sys.stdin:\n"
                             "  r = json.loads(l); e = r['episode']\n"
                             "  said = e['messages'][-1]['content'].strip()\n"
                             "  print(json.dumps({'done': True, 'reward': float(said == r['response'])} if e['final']"
                             " else {'role': 'tool', 'content': 'ok'}), flush=True)\n");
  const std::string tool =
      " 'data.train=[{path: data/sft_add_train.jsonl}]' ppo.max_new_tokens=12 "
      "'ppo.environment.command=" +
      anvil::testing::python_bin() + " -u " + (dir / "env.py").string() + "'";
  const std::string tool_config = "configs/grpo_tool_tiny.yaml";
  ASSERT_EQ(trainer(dir / "tool_emulated", tool_config, "ppo.async.emulate=true" + tool, "", &log), 0) << log;
  ASSERT_EQ(
      trainer(dir / "tool_three", tool_config, "ppo.async.rollout_ranks=1" + tool, anvil::testing::mpirun(3), &log), 0)
      << log;
  EXPECT_GE(expect_same_metrics(dir / "tool_emulated", dir / "tool_three", 1e-5, "tool episodes"), 12 * 10);
  expect_same_in_flight(dir / "tool_emulated", dir / "tool_three", 12, 1e-4);
  const auto m = anvil::testing::metrics_by_step(dir / "tool_three" / "metrics.jsonl");
  EXPECT_EQ(m.at(5)["env/turns"].get<double>(), 2.0) << m.at(5).dump();

  // Refused: no rank left to train; the oracle and the real schedule at once; rounds of dynamic sampling.
  EXPECT_NE(trainer(dir / "alone", ppo, "ppo.async.rollout_ranks=1", "", &log), 0);
  EXPECT_NE(log.find("ppo.async.rollout_ranks: 1 rank apart from training leave none of the launch's 1 rank to "
                     "train; launch at least 2"),
            std::string::npos)
      << log;
  EXPECT_NE(trainer(dir / "both", ppo, "ppo.async.rollout_ranks=1 ppo.async.emulate=true", "", &log), 0);
  EXPECT_NE(log.find("ppo.async.emulate: runs the one-step-off schedule without rollout ranks"), std::string::npos)
      << log;
  EXPECT_NE(trainer(dir / "check", ppo, "ppo.async.check_weights=true", "", &log), 0);
  EXPECT_NE(log.find("ppo.async.check_weights: compares the weights rollout ranks sample with"), std::string::npos)
      << log;
}
