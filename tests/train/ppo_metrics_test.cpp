// PPO's per-step metrics (PpoObjective::step_metrics) against the loss the
// trainer takes from the same micro-batch: the loss/ metrics are on the
// loss's scale under every ppo.loss_aggregation. Under sequence_mean and
// constant, loss/policy_avg was once the loss times the mean response
// length (issue 59). No run and no checkpoint: a tiny random GPT-2 and two
// hand-made rollout rows.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/config/config.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/ppo.h"
#include "test_util.h"
#include "train/ppo_rollout.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;

/// configs/grpo_tiny.yaml on a fresh tiny model, without the KL term (so the
/// loss is the policy loss alone), under `aggregation`.
config::RunConfig grpo_config(const TempDir& dir, const std::string& aggregation) {
  const auto src = anvil::testing::source_dir();
  return config::load_config(
      {src + "/configs/grpo_tiny.yaml"},
      {"output_dir=" + (dir / "out").string(), "model.from=null", "model.hidden_size=32", "model.num_layers=1",
       "model.num_heads=2", "model.max_position_embeddings=32", "tokenizer.path=" + src + "/data/tokenizer.model",
       "data.train[0].path=" + src + "/data/sft_add_train.jsonl", "data.eval=null", "ppo.kl_coef=0",
       "ppo.loss_aggregation=" + aggregation});
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
    w.aggregation = aggregation;
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

}  // namespace
}  // namespace anvil::train
