#pragma once
// Online RL on the shared engine: PPO (Schulman et al. 2017, with the
// RLHF recipe of Ziegler et al. 2019 as TRL and trlx implement it), GRPO
// (Shao et al. 2024) and RLOO (Ahmadian et al. 2024) advantages. Each
// iteration generates a rollout from `ppo.prompts_per_rollout` prompts
// (before_iteration), scores it, and trains on it for `ppo.ppo_epochs`
// passes in minibatches of train.global_batch_size sequences. Formulas,
// options and metrics: docs/algorithms.md.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/rewards/rewards.h"
#include "anvil/train/objective.h"

namespace anvil::train {

// ---- formulas (parity-tested against tests/parity/ppo_reference.py) ------------
// Per-token tensors are response-aligned (B, R): row i's response tokens in
// columns [0, len_i), `mask` 1 there and 0 after.

/// The per-token KL estimate between policy and reference from their
/// log-probs: "k1" logp - ref, or "k3" exp(ref - logp) - (ref - logp) - 1.
at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, const std::string& estimator);

/// -kl_coef * kl per token, with each row's score added at its last response
/// token (Ziegler et al.). `scores` (B).
at::Tensor token_rewards(const at::Tensor& kl, const at::Tensor& scores, const at::Tensor& mask, double kl_coef);

/// Generalised advantage estimation over each row's response: values are
/// those of the state before each token, 0 past the end. Returns
/// (advantages, returns = advantages + values), both 0 outside the mask.
std::pair<at::Tensor, at::Tensor> gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                      double gamma, double lam);

/// (x - mean) / sqrt(var + 1e-8) over the masked entries (unbiased variance,
/// TRL's masked_whiten); 0 outside the mask. `moments` = {count, sum, sum of
/// squares} of the entries when they span several ranks (else computed here).
at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, const std::vector<double>& moments = {});

/// GRPO advantages: per group of `group` consecutive scores,
/// (s - mean) / (unbiased std + 1e-4).
at::Tensor grpo_advantages(const at::Tensor& scores, int64_t group);
/// RLOO advantages: s_i minus the mean of the other samples of its group.
at::Tensor rloo_advantages(const at::Tensor& scores, int64_t group);

/// The adaptive KL coefficient (Ziegler et al.; trlx): with
/// e = clip(current / target - 1, -0.2, 0.2), returns value * (1 + e * n_steps / horizon).
double adaptive_kl_update(double value, double current, double target, double horizon, double n_steps);

/// trlx's RunningMoments: the mean and variance of every score seen,
/// merged batch by batch; std = sqrt(var * n / (n - 1)).
struct RunningMoments {
  double mean = 0, var = 1, std = 1, count = 1e-24;
  void update(const std::vector<double>& xs);
  nlohmann::json to_json() const;
  static RunningMoments from_json(const nlohmann::json& j);
};

/// The clipped PPO losses of a micro-batch, summed over its masked tokens
/// (the loop divides by the step's tokens, making them masked means), and
/// their statistics.
struct PpoLossSums {
  at::Tensor policy;       // sum of max(-A r, -A clip(r))
  at::Tensor value;        // sum of 0.5 max((v - R)^2, (clip(v) - R)^2); undefined without values
  at::Tensor clipfrac;     // tokens whose ratio was clipped
  at::Tensor clip_low;     // tokens with A < 0 whose ratio fell below 1 - cliprange (TRL's clip_ratio/low)
  at::Tensor clip_high;    // tokens with A > 0 whose ratio rose above 1 + cliprange_high (clip_ratio/high)
  at::Tensor vf_clipfrac;  // tokens whose value was clipped
  at::Tensor approxkl;     // sum of 0.5 (logp - old)^2
  at::Tensor ratio;        // sum of the ratios
};
struct PpoClip {
  double cliprange = 0.2;
  double cliprange_value = 0.2;
  double cliprange_high = 0;    // the ratio's upper epsilon; 0 = cliprange
  bool sequence_ratio = false;  // GSPO: every token takes exp(mean over its response of logp - old_logp)
};
/// `values`, `old_values` and `returns` may be undefined (no critic).
/// `weights` (B, R), when given, weigh each token's policy and value loss in
/// the sums (loss aggregation); the statistics count the masked tokens.
PpoLossSums ppo_loss_sums(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                          const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                          const at::Tensor& mask, const PpoClip& clip, const at::Tensor& weights = {});

/// REINFORCE++ (Hu 2025; OpenRLHF's reinforce and reinforce_baseline):
/// the per-token rewards (token_rewards: -kl_coef kl, plus the score at the
/// last token) summed from each token to the response's end (gamma 1), over
/// `mask`. The baseline variant passes each score minus its group's mean;
/// whitening over the rollout follows (masked_whiten).
at::Tensor reinforce_pp_returns(const at::Tensor& rewards, const at::Tensor& mask);
/// The advantages of both: scores (B), per-token kl (B, R) and mask; `group`
/// > 0 takes each score's group mean away first (reinforce_pp_baseline).
at::Tensor reinforce_pp_advantages(const at::Tensor& scores, const at::Tensor& kl, const at::Tensor& mask,
                                   double kl_coef, int64_t group, bool whiten);

/// DAPO's soft overlong punishment of a response of `tokens` tokens: 0 up to
/// length - buffer, then (length - buffer - tokens) / buffer x factor, down
/// to -factor at `length` (and beyond).
double overlong_penalty(int64_t tokens, int64_t length, int64_t buffer, double factor);

/// GRPO's advantages with TRL's scale_rewards: each score minus its group's
/// mean, divided by the group's std (group), by the std of all scores
/// (batch), or not divided (none), the std unbiased, plus 1e-4.
at::Tensor grpo_advantages(const at::Tensor& scores, int64_t group, const std::string& scale_rewards);

// ---- rewards a program supplies ------------------------------------------------

/// Reward functions live in rewards/ (anvil/rewards/rewards.h); these names
/// keep programs written against train:: building.
using rewards::register_reward_function;
using rewards::RewardFn;
using rewards::RewardQuery;

// ---- the objective ---------------------------------------------------------------

/// algorithm: ppo (ppo.advantage: gae, grpo or rloo).
class PpoObjective final : public Objective {
 public:
  PpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  ~PpoObjective() override;
  std::string name() const override { return "ppo"; }
  std::string target_unit() const override { return "response tokens"; }
  std::string plan(int64_t max_steps) const override;
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  int64_t steps_per_iteration() const override;
  Metrics before_iteration(Engine& engine, int64_t iteration, int64_t step) override;
  void after_step(Engine& engine, int64_t step) override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
