// PPO's metrics (train/ppo_metrics.h). The per-step metrics against the
// loss the trainer takes from the same micro-batch: the loss/ metrics are on
// the loss's scale under every ppo.loss_aggregation (under sequence_mean and
// constant, loss/policy_avg was once the loss times the mean response
// length, issue 59). GRPOTrainer's and RLOOTrainer's names: their
// definitions on hand-made rows, every name TRL logs in a tiny GRPO and RLOO
// run, and the reward and KL on the console line. No checkpoint: tiny random
// GPT-2 models.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/config/config.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/ppo.h"
#include "test_util.h"
#include "train/objectives/ppo/ppo_metrics.h"
#include "train/objectives/ppo/ppo_rollout.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;

/// configs/grpo_tiny.yaml on a fresh tiny model, without the KL term (so the
/// loss is the policy loss alone), under `aggregation`.
config::RunConfig grpo_config(const TempDir& dir, const std::string& aggregation) {
  const auto src = anvil::testing::source_dir();
  return config::load_config(
      {src + "/configs/grpo_tiny.yaml"},
      {"output_dir=" + (dir / "out").string(), "model.from=null", "model.hidden_size=32", "model.num_hidden_layers=1",
       "model.num_attention_heads=2", "model.max_position_embeddings=32",
       "tokenizer.path=" + src + "/data/tokenizer.model", "data.train[0].path=" + src + "/data/sft_add_train.jsonl",
       "data.eval=null", "ppo.kl_coef=0", "ppo.loss_aggregation=" + aggregation});
}

TEST(PpoMetrics, PolicyLossAverageIsTheLossUnderEveryAggregation) {
  TempDir dir;
  // Responses of 2 and 5 generated tokens: a mean length of 3.5, the factor the metric was off by.
  RolloutRow a, b;
  a.prompt = {5, 6, 7};
  a.response = {8, 9};
  b.prompt = {5, 6};
  b.response = {10, 11, 12, 13, 14};
  for (auto* r : {&a, &b}) {
    r->ended = true;
    r->old_logp.assign(r->response.size(), -4.5f);  // about a random 97-token model's: ratios near 1
  }
  auto adv = at::ones({2, 5}, at::kFloat);
  adv[1].fill_(-0.5);
  const auto ret = at::zeros({2, 5}, at::kFloat);
  for (const std::string aggregation : {"token_mean", "sequence_mean", "constant"}) {
    SCOPED_TRACE(aggregation);
    const auto cfg = grpo_config(dir, aggregation);
    const auto tok = tokenizer::load_tokenizer("auto", cfg.tokenizer.path);
    PpoObjective ppo(cfg, *tok, chat::ChatTemplate::get("plain"));
    auto mc = cfg.model;
    mc.vocab_size = 97;
    at::manual_seed(3);
    const auto model = models::family_by_name(mc.family).from_config(mc);
    // As the objective weighs a rollout: constant divides by max_new_tokens (8 in grpo_tiny.yaml).
    LossWeighting w;
    w.aggregation = *kLossAggregations.find(aggregation);
    w.constant = 8;
    const auto batch = collate_rollout({&a, &b}, 0, adv, ret, {0, 1}, w);
    EXPECT_EQ(batch.num_targets, aggregation == "token_mean" ? 7 : 2);
    Sums sums;
    // The trainer's loss of a one-micro-batch step: the summed loss over the step's targets.
    const double loss = ppo.loss_sum(*model, batch, sums).item<double>() / static_cast<double>(batch.num_targets);
    ASSERT_GT(std::abs(loss), 1e-6);
    const auto m = ppo.step_metrics(sums);
    EXPECT_NEAR(m.at("loss/policy_avg"), loss, 1e-6 * std::abs(loss));
    // The per-token statistics stay means over the response tokens.
    EXPECT_GT(m.at("val/ratio"), 0.0);
    EXPECT_LT(std::abs(m.at("val/ratio") - 1), 0.5) << m.at("val/ratio");
  }
}

// GRPOTrainer's and RLOOTrainer's rollout metrics as TRL 1.16 defines them
// (trl/trainer/grpo_trainer.py): two groups of two, one of them alike.
TEST(PpoMetrics, GroupRolloutMetricsAreTrlsDefinitions) {
  std::vector<RolloutRow> rows(4);
  rows[0].response = {5, 6, 2};
  rows[1].response = {5, 6, 7, 8};  // cut by max_new_tokens
  rows[2].response = {9, 2};
  // An episode: two of its four tokens an environment appended, which TRL's completion lengths leave out.
  rows[3].response = {9, 3, 4, 2};
  rows[3].appended = {0, 1, 1, 0};
  const std::vector<double> raw{1.0, 0.0, 0.5, 0.5};
  for (size_t i = 0; i < rows.size(); ++i) {
    auto& r = rows[i];
    r.ended = i != 1;
    r.score = raw[i];
    r.prompt = {1, 2};
    r.old_logp.assign(r.response.size(), -1.0f);
    r.ref_logp.assign(r.response.size(), -1.0f);
  }
  const auto g = generated_tokens(rows);
  const auto scores = at::tensor(raw, at::kDouble);
  const auto kl = at::full({4, g.mask.size(1)}, 0.1, at::kDouble) * g.mask;
  auto m = group_rollout_metrics(rows, g, scores, 2, /*batch_std=*/false, kl);
  EXPECT_DOUBLE_EQ(m.at("reward"), 0.5);
  EXPECT_NEAR(m.at("reward_std"), std::sqrt(0.5 / 3), 1e-12);  // unbiased, over the rollout
  EXPECT_DOUBLE_EQ(m.at("frac_reward_zero_std"), 0.5);         // the second group scored alike
  EXPECT_DOUBLE_EQ(m.at("completions/mean_length"), (3 + 4 + 2 + 2) / 4.0);
  EXPECT_DOUBLE_EQ(m.at("completions/min_length"), 2);
  EXPECT_DOUBLE_EQ(m.at("completions/max_length"), 4);
  EXPECT_DOUBLE_EQ(m.at("completions/clipped_ratio"), 0.25);
  EXPECT_DOUBLE_EQ(m.at("completions/mean_terminated_length"), 7 / 3.0);
  EXPECT_DOUBLE_EQ(m.at("completions/min_terminated_length"), 2);
  EXPECT_DOUBLE_EQ(m.at("completions/max_terminated_length"), 3);
  EXPECT_NEAR(m.at("kl"), 0.1, 1e-12);  // a mean over generated tokens
  // scale_rewards batch: whether the whole rollout's std is 0; no KL penalty, no kl.
  m = group_rollout_metrics(rows, g, scores, 2, /*batch_std=*/true);
  EXPECT_DOUBLE_EQ(m.at("frac_reward_zero_std"), 0.0);
  EXPECT_EQ(m.count("kl"), 0u);
  m = group_rollout_metrics(rows, g, at::full({4}, 0.5, at::kDouble), 2, /*batch_std=*/true);
  EXPECT_DOUBLE_EQ(m.at("frac_reward_zero_std"), 1.0);
  // No row ended: TRL's terminated lengths are 0.
  for (auto& r : rows) r.ended = false;
  m = group_rollout_metrics(rows, g, scores, 2, false);
  EXPECT_DOUBLE_EQ(m.at("completions/clipped_ratio"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("completions/max_terminated_length"), 0.0);
}

// A step's entropy and kl under GRPOTrainer's names are the per-token means
// PPOTrainer's policy/entropy_avg and policy/kl_avg hold; gae runs keep
// PPOTrainer's names alone.
TEST(PpoMetrics, StepMetricsAddGrpoTrainersEntropyAndKl) {
  Sums sums;
  add_sum(sums, "tokens", at::scalar_tensor(4.0, at::kDouble));
  add_sum(sums, "targets", at::scalar_tensor(4.0, at::kDouble));
  add_sum(sums, "entropy", at::scalar_tensor(2.0, at::kDouble));
  add_sum(sums, "kl", at::scalar_tensor(0.4, at::kDouble));
  const auto group = ppo_step_metrics(sums, true), plain = ppo_step_metrics(sums, false);
  EXPECT_DOUBLE_EQ(group.at("entropy"), 0.5);
  EXPECT_DOUBLE_EQ(group.at("kl"), 0.1);
  EXPECT_DOUBLE_EQ(group.at("policy/entropy_avg"), 0.5);
  EXPECT_DOUBLE_EQ(plain.at("policy/kl_avg"), 0.1);
  EXPECT_EQ(plain.count("entropy") + plain.count("kl"), 0u);
  EXPECT_TRUE(logs_group_metrics(Advantage::kGrpo) && logs_group_metrics(Advantage::kRloo));
  EXPECT_FALSE(logs_group_metrics(Advantage::kGae));
}

namespace stdfs = std::filesystem;

struct TinyRun {
  stdfs::path out;
  std::string log;  // the trainer's output, console lines included
};

/// configs/grpo_tiny.yaml on a fresh tiny model with ppo.advantage
/// `advantage`: one rollout of 16 prompts x 4 samples and its 4 steps, every
/// second on the console, scored by two named sources (exact match, and a
/// program giving each completion's length mod 3, at weight 0.5: varied
/// rewards from a random model). Run once per advantage per test program.
const TinyRun& tiny_group_run(const std::string& advantage) {
  static auto* dir = new TempDir();  // kept for the whole test program
  static std::map<std::string, TinyRun> runs;
  if (const auto it = runs.find(advantage); it != runs.end()) return it->second;
  auto& r = runs[advantage];
  r.out = *dir / advantage;
  const auto program = *dir / "length_reward.py";
  anvil::testing::write_text(program,
                             "import json, sys\n"
                             "for line in sys.stdin:\n"
                             "    c = json.loads(line)[\"sample\"][\"completion\"]\n"
                             "    print(json.dumps({\"reward\": float(len(c) % 3)}), flush=True)\n");
  const auto cmd =
      "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
      " --config configs/grpo_tiny.yaml output_dir=" + r.out.string() +
      " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 model.num_attention_heads=2"
      " model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model data.eval=null train.threads=1"
      " train.max_steps=4 train.log_every=2 train.save_every=0 ppo.advantage=" +
      advantage + " ppo.reward.exact_match=null 'ppo.rewards=[{exact_match: response, name: exact}, {command: \"" +
      anvil::testing::python_bin() + " -u " + program.string() + "\", name: length, weight: 0.5}]' 2>&1";
  EXPECT_EQ(anvil::testing::run(cmd, &r.log), 0) << cmd << "\n" << r.log;
  return r;
}

// Every name TRL 1.16's GRPOTrainer and RLOOTrainer log for this config
// (beta > 0, two reward functions; trl/trainer/grpo_trainer.py and
// rloo_trainer.py) is in metrics.jsonl. Not logged: the Trainer's
// learning_rate (lr here), num_tokens and step_time, and clip_ratio/low_min
// and high_max (minima and maxima over sequences, which the step's summed
// statistics cannot give).
TEST(PpoMetrics, GrpoAndRlooRunsLogTrlsMetricNames) {
  const std::vector<std::string> trl{"loss",
                                     "grad_norm",
                                     "reward",
                                     "reward_std",
                                     "frac_reward_zero_std",
                                     "rewards/exact/mean",
                                     "rewards/exact/std",
                                     "rewards/length/mean",
                                     "rewards/length/std",
                                     "completions/mean_length",
                                     "completions/min_length",
                                     "completions/max_length",
                                     "completions/clipped_ratio",
                                     "completions/mean_terminated_length",
                                     "completions/min_terminated_length",
                                     "completions/max_terminated_length",
                                     "kl",
                                     "entropy",
                                     "clip_ratio/low_mean",
                                     "clip_ratio/high_mean",
                                     "clip_ratio/region_mean"};
  for (const std::string advantage : {"grpo", "rloo"}) {
    SCOPED_TRACE(advantage);
    const auto& run = tiny_group_run(advantage);
    const auto lines = anvil::testing::metric_lines(run.out / "metrics.jsonl");
    std::set<std::string> logged;
    for (const auto& m : lines)
      for (auto it = m.begin(); it != m.end(); ++it) logged.insert(it.key());
    std::string all;
    for (const auto& k : logged) all += " " + k;
    for (const auto& name : trl) EXPECT_TRUE(logged.count(name)) << name << " is not logged; logged:" << all;
    // The rollout's line: TRL's reward is the sources' weighted sum; lengths count generated tokens.
    int rollouts = 0;
    for (const auto& m : lines) {
      if (!m.contains("reward")) continue;
      ++rollouts;
      const auto get = [&](const char* k) { return m.value(k, std::nan("")); };  // NaN fails every check below
      EXPECT_NEAR(get("reward"), get("rewards/exact/mean") + 0.5 * get("rewards/length/mean"),
                  1e-9 * std::max(1.0, std::abs(get("reward"))))
          << m.dump();
      EXPECT_GT(get("reward_std"), 0.0) << m.dump();
      for (const char* fraction : {"frac_reward_zero_std", "completions/clipped_ratio"}) {
        EXPECT_GE(get(fraction), 0.0) << fraction;
        EXPECT_LE(get(fraction), 1.0) << fraction;
      }
      EXPECT_LE(get("completions/min_length"), get("completions/mean_length"));
      EXPECT_LE(get("completions/mean_length"), get("completions/max_length"));
      EXPECT_LE(get("completions/max_length"), 8.0);  // grpo_tiny's max_new_tokens
    }
    EXPECT_EQ(rollouts, 1);
  }
}

// The console line of a GRPO run shows the reward and the KL between evals:
// step 2's line holds the rollout's reward (logged with step 1, the
// iteration's first step) and step 2's own KL, as metrics.jsonl has them.
TEST(PpoMetrics, ConsoleLineShowsTheRewardAndKl) {
  const auto& run = tiny_group_run("grpo");
  std::smatch line;
  ASSERT_TRUE(
      std::regex_search(run.log, line, std::regex(R"(step 2/4 \[[#.]+\] loss \S+ \| reward (\S+) \| kl (\S+) \| lr )")))
      << run.log;
  const auto by_step = anvil::testing::metrics_by_step(run.out / "metrics.jsonl");
  std::ostringstream reward, kl;
  reward << std::setprecision(4) << by_step.at(1).value("reward", std::nan(""));
  kl << std::setprecision(4) << by_step.at(2).value("kl", std::nan(""));
  EXPECT_EQ(line[1].str(), reward.str()) << line[0];
  EXPECT_EQ(line[2].str(), kl.str()) << line[0];
  EXPECT_EQ(by_step.at(2).count("reward"), 0u) << "step 2's own line has no rollout; the console kept the latest";
}

}  // namespace
}  // namespace anvil::train
