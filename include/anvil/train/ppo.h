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

/// DAPO's soft overlong punishment of a response's score.
struct OverlongPenaltyConfig {
  int64_t buffer = 0;
  double factor = 1.0;
  int64_t length = 0;

  template <class V>
  void visit(V& v) {
    v.field("buffer", buffer,
            "Tokens before the longest allowed response over which the penalty grows from 0 to -factor; 0 = off.",
            config::non_negative());
    v.field("factor", factor, "The penalty at the longest allowed response.", config::non_negative());
    v.field("length", length, "The longest allowed response, in tokens; 0 = ppo.max_new_tokens.",
            config::non_negative());
  }
};

/// A multi-turn environment for PPO's rollouts (tool calls, users, games):
/// a long-lived program speaking JSON lines, like a reward program.
struct EnvironmentConfig {
  std::string command;
  double timeout_s = 30;

  template <class V>
  void visit(V& v) {
    v.field("command", command,
            "Environment program: a shell command started once. After each assistant turn it reads one JSON object "
            "per line on stdin (the prompt record as written, plus episode: {messages, turn, final, ended}; "
            "docs/algorithms.md) and answers one line: {\"role\": \"tool\" or \"user\", \"content\": ...} to "
            "append a message and let the policy take another turn, or {\"done\": true, \"reward\": x}. The "
            "appended tokens take no part in the loss or the KL. Empty = single-turn rollouts.");
    v.field("timeout_s", timeout_s, "Seconds the environment program may take to answer one line.",
            config::changeable_on_resume(config::positive()));
  }
};

/// ppo.advantage: how a sample's advantage is computed.
enum class Advantage { kGae, kGrpo, kRloo, kReinforcePp, kReinforcePpBaseline };
inline const config::Choices<Advantage> kAdvantages{{"gae", Advantage::kGae},
                                                    {"grpo", Advantage::kGrpo},
                                                    {"rloo", Advantage::kRloo},
                                                    {"reinforce_pp", Advantage::kReinforcePp},
                                                    {"reinforce_pp_baseline", Advantage::kReinforcePpBaseline}};
/// ppo.loss_aggregation: how per-token losses become the step's loss.
enum class LossAggregation { kTokenMean, kSequenceMean, kConstant };
inline const config::Choices<LossAggregation> kLossAggregations{{"token_mean", LossAggregation::kTokenMean},
                                                                {"sequence_mean", LossAggregation::kSequenceMean},
                                                                {"constant", LossAggregation::kConstant}};

/// ppo.kl_estimator: the per-token KL estimator.
enum class KlEstimator { kK1, kK3 };
inline const config::Choices<KlEstimator> kKlEstimators{{"k1", KlEstimator::kK1}, {"k3", KlEstimator::kK3}};
/// ppo.scale_rewards: what GRPO divides a score's distance from its group's mean by.
enum class ScaleRewards { kGroup, kBatch, kNone };
inline const config::Choices<ScaleRewards> kScaleRewards{
    {"group", ScaleRewards::kGroup}, {"batch", ScaleRewards::kBatch}, {"none", ScaleRewards::kNone}};
/// ppo.importance_sampling_level: one ratio per token or per response.
enum class ImportanceSampling { kToken, kSequence };
inline const config::Choices<ImportanceSampling> kImportanceSampling{{"token", ImportanceSampling::kToken},
                                                                     {"sequence", ImportanceSampling::kSequence}};

/// Options of the `ppo` algorithm (online RL: PPO, GRPO, RLOO, REINFORCE++).
/// How a one-step-off batch, sampled by the weights before the last update
/// (the behaviour policy), is corrected toward the weights it trains
/// (ppo.async.correction).
enum class OffPolicyCorrection { kTruncatedIs, kBypass };
inline const config::Choices<OffPolicyCorrection> kOffPolicyCorrections{
    {"truncated_is", OffPolicyCorrection::kTruncatedIs}, {"bypass", OffPolicyCorrection::kBypass}};

/// One-step-off-policy RL (ppo.async): batch i + 1 is sampled with the
/// weights before update i while update i trains on batch i, as verl's
/// one-step-off schedule runs it. rollout_ranks > 0 gives the sampling to the
/// launch's last ranks, which overlap it with training; emulate runs the
/// same schedule colocated, on the ranks that train (its exact oracle).
struct AsyncConfig {
  int64_t rollout_ranks = 0;
  bool emulate = false;
  OffPolicyCorrection correction = OffPolicyCorrection::kTruncatedIs;
  double is_cap = 2.0;
  bool check_weights = false;

  /// Whether a one-step-off schedule runs (on rollout ranks or emulated).
  bool one_step_off() const { return rollout_ranks > 0 || emulate; }

  template <class V>
  void visit(V& v) {
    v.field("rollout_ranks", rollout_ranks,
            "Ranks of the launch that only generate (the last ones; 0: every rank generates its share, then "
            "trains). They sample batch i + 1 with the weights before update i while the others train on batch "
            "i; the trainers send them the weights each iteration (the trained parameters only, after the "
            "first: a LoRA run's adapters) and get the rows back. The same tokens, losses and checkpoints as "
            "ppo.async.emulate on the training ranks alone.",
            config::non_negative());
    v.field("emulate", emulate,
            "Run the one-step-off schedule on the training ranks: each iteration samples the next batch with the "
            "current weights and trains on the batch the previous iteration sampled (the first iteration "
            "samples two batches). The batch in flight is saved with each checkpoint, so a resume continues the "
            "schedule exactly. Generation and training do not overlap in this mode; it is the schedule's oracle.");
    config::enum_field(v, "correction", correction,
                       "truncated_is: the PPO ratio is taken against log-probs recomputed with the current weights "
                       "(proximal, as AReaL's decoupled PPO) and each token's policy loss is weighed by "
                       "min(pi_prox / pi_behaviour, is_cap), as verl's truncated importance sampling; bypass: the "
                       "behaviour log-probs are the old log-probs (no recompute, no weight).",
                       kOffPolicyCorrections, kOffPolicyCorrections.rule());
    v.field("is_cap", is_cap, "truncated_is: the largest importance weight (C).", config::positive());
    v.field("check_weights", check_weights,
            "rollout_ranks: each rollout rank hashes the weights it sampled with and the trainers compare the "
            "hash with that of what they sent (cast to dist.param_dtype); a mismatch ends the run. Reads every "
            "weight byte once per iteration on both sides.");
  }
};

struct PpoConfig {
  int64_t prompts_per_rollout = 16;
  int64_t samples_per_prompt = 1;
  int64_t ppo_epochs = 4;
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t generation_batch_size = 0;
  bool keep_decoder = false;
  std::string reference;
  Advantage advantage = Advantage::kGae;
  double kl_coef = 0.05;
  KlEstimator kl_estimator = KlEstimator::kK1;
  double target_kl = 0;
  double kl_horizon = 10000;
  double gamma = 1.0;
  double lam = 0.95;
  double cliprange = 0.2;
  double cliprange_high = 0;
  double cliprange_value = 0.2;
  double vf_coef = 0.1;
  bool whiten_advantages = true;
  LossAggregation loss_aggregation = LossAggregation::kTokenMean;
  double loss_constant = 0;
  ScaleRewards scale_rewards = ScaleRewards::kGroup;
  ImportanceSampling importance_sampling_level = ImportanceSampling::kToken;
  bool mask_truncated_completions = false;
  OverlongPenaltyConfig overlong_penalty;
  bool dynamic_sampling = false;
  int64_t dynamic_sampling_max_rounds = 4;
  std::string critic_from;
  double critic_learning_rate = 0;
  rewards::SourceConfig reward;
  std::vector<rewards::WeightedSourceConfig> rewards;
  EnvironmentConfig environment;
  int64_t max_turns = 4;
  AsyncConfig async;

  template <class V>
  void visit(V& v) {
    visit_rollout(v);
    visit_advantage(v);
    visit_loss(v);
    visit_models(v);
  }
  /// The rollout: prompts, samples, sampling.
  template <class V>
  void visit_rollout(V& v) {
    v.field("prompts_per_rollout", prompts_per_rollout,
            "Prompts each rollout draws from data.train (over all ranks; a multiple of the world size).",
            config::positive());
    v.field("samples_per_prompt", samples_per_prompt,
            "Responses sampled per prompt (at least 2 for advantage grpo, rloo and reinforce_pp_baseline).",
            config::positive());
    v.field("ppo_epochs", ppo_epochs, "Passes over each rollout, in minibatches of train.global_batch_size sequences.",
            config::positive());
    v.field("max_new_tokens", max_new_tokens, "Most tokens a rollout response may have.", config::positive());
    v.field("temperature", temperature, "Sampling temperature; log-probs are taken at the same temperature.",
            config::positive());
    v.field("top_k", top_k, "Sample among the k likeliest tokens (0 = all).", config::non_negative());
    v.field("top_p", top_p, "Nucleus sampling mass (1 = off).",
            config::Rule{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }, {}});
    v.field("generation_batch_size", generation_batch_size,
            "Sequences generated together (0 = a rank's whole share of the rollout).",
            config::changeable_on_resume(config::non_negative()));
    v.field("keep_decoder", keep_decoder,
            "Keep each generation batch shape's KV cache and, on CUDA, its recorded decode step from one rollout "
            "to the next (generation::DecoderOptions::keep_buckets): later rollouts of that shape replay the graph "
            "instead of recording it again, and the cache holds its memory during training. Off until checked on a "
            "GPU.",
            config::changeable_on_resume());
  }
  /// The reference, the advantage, the KL penalty and the clipping.
  template <class V>
  void visit_advantage(V& v) {
    v.field("reference", reference,
            "Reference model folder for the KL penalty. Empty = model.from, or a frozen copy of the initial weights.");
    config::enum_field(
        v, "advantage", advantage,
        "gae (PPO with a value head), grpo (group-normalised scores, KL in the loss, no critic), rloo "
        "(leave-one-out baseline, no critic), reinforce_pp (REINFORCE++: the KL-penalised token rewards summed "
        "to the end, whitened over the rollout, no critic) or reinforce_pp_baseline (the same on each score "
        "minus its group's mean).",
        kAdvantages, kAdvantages.rule());
    v.field("kl_coef", kl_coef, "KL penalty coefficient (initial value when target_kl is set; GRPO's beta).",
            config::non_negative());
    config::enum_field(v, "kl_estimator", kl_estimator, "Per-token KL estimator: k1 (logp - ref) or k3.", kKlEstimators,
                       kKlEstimators.rule());
    v.field("target_kl", target_kl,
            "Adaptive KL controller target (Ziegler et al.): the summed KL per sequence to aim for; 0 = fixed "
            "kl_coef.",
            config::non_negative());
    v.field("kl_horizon", kl_horizon, "Adaptive KL controller horizon, in sequences.", config::positive());
    v.field("gamma", gamma, "GAE discount.",
            config::Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("lam", lam, "GAE lambda.",
            config::Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("cliprange", cliprange,
            "Policy ratio clip epsilon: the ratio is clipped to [1 - cliprange, 1 + "
            "cliprange_high].",
            config::positive());
    v.field("cliprange_high", cliprange_high,
            "Upper clip epsilon (DAPO's clip-higher, TRL's epsilon_high); 0 = cliprange.", config::non_negative());
    v.field("cliprange_value", cliprange_value, "Value clip range around the rollout's values.", config::positive());
    v.field("vf_coef", vf_coef, "Weight of the value loss.", config::non_negative());
    v.field("whiten_advantages", whiten_advantages,
            "Whiten advantages over the rollout (gae, rloo, reinforce_pp and reinforce_pp_baseline).");
  }
  /// How the loss is aggregated and which samples count.
  template <class V>
  void visit_loss(V& v) {
    config::enum_field(
        v, "loss_aggregation", loss_aggregation,
        "How per-token losses become the step's loss: token_mean (over every response token of the step: DAPO, "
        "TRL's loss_type dapo), sequence_mean (each response's token mean, averaged over responses: GRPO's "
        "paper, TRL's grpo) or constant (summed, divided by loss_constant x responses: Dr. GRPO, TRL's "
        "dr_grpo).",
        kLossAggregations, kLossAggregations.rule());
    v.field("loss_constant", loss_constant, "loss_aggregation constant: the divisor per response; 0 = max_new_tokens.",
            config::non_negative());
    config::enum_field(
        v, "scale_rewards", scale_rewards,
        "advantage grpo: divide each score's distance from its group's mean by the group's std (group), by the "
        "std of the whole rollout (batch), or by nothing (none: Dr. GRPO).",
        kScaleRewards, kScaleRewards.rule());
    config::enum_field(
        v, "importance_sampling_level", importance_sampling_level,
        "token: one ratio per token (PPO, GRPO); sequence: one ratio per response, exp of the mean log-ratio "
        "over its tokens (GSPO), clipped with cliprange / cliprange_high.",
        kImportanceSampling, kImportanceSampling.rule());
    v.field("mask_truncated_completions", mask_truncated_completions,
            "Responses cut by max_new_tokens (no end of turn) take no part in the loss or its statistics (DAPO; "
            "TRL's mask_truncated_completions).");
    v.field("dynamic_sampling", dynamic_sampling,
            "DAPO's dynamic sampling: groups whose samples all got the same score (no advantage to learn from) "
            "are dropped and more prompts are drawn and sampled until prompts_per_rollout groups differ, at most "
            "dynamic_sampling_max_rounds times; a rollout still short after that keeps some dropped groups "
            "(logged as dynamic_sampling/short_groups).");
    v.field("dynamic_sampling_max_rounds", dynamic_sampling_max_rounds,
            "Most rounds of prompts_per_rollout prompts one rollout may draw with dynamic_sampling (the first "
            "included).",
            config::positive());
    v.section("overlong_penalty", overlong_penalty,
              "DAPO's soft overlong punishment, added to each score: 0 up to length - buffer tokens, then falling "
              "linearly to -factor at length.");
  }
  /// The critic, the rewards and the environment.
  template <class V>
  void visit_models(V& v) {
    v.field("critic_from", critic_from,
            "advantage gae: a separate critic model trained beside the policy, initialised from this folder (a "
            "reward model, whose score head becomes the value head, or any model of the policy's tokenizer). "
            "Empty = a value head on the policy's trunk.");
    v.field("critic_learning_rate", critic_learning_rate,
            "The critic's peak learning rate (it follows the policy's schedule); 0 = optimizer.lr.",
            config::non_negative());
    v.section("reward", reward,
              "Where rewards come from: exactly one of model, command, exact_match, regex, function (or none, "
              "with ppo.rewards). Its scale and clip apply to the score, whichever sources it sums.");
    v.list("rewards", rewards,
           "Several reward sources summed with weights (TRL's reward_funcs and reward_weights): each item takes "
           "one source's keys as ppo.reward does, plus weight and name; each source's scores are logged as "
           "rewards/<name>/mean and /std. Leave ppo.reward's sources empty when using it.");
    v.section("environment", environment,
              "Multi-turn rollouts: a program that answers each assistant turn with a tool or user message (rendered "
              "by the chat template and appended) or ends the episode with a reward. max_new_tokens then bounds all "
              "of a rollout's tokens after the prompt, every turn and appended message included (verl's "
              "response_length).");
    v.field("max_turns", max_turns,
            "With ppo.environment: the most assistant turns in one rollout; the last is sent with final: true and "
            "must be answered with done.",
            config::positive());
    v.section("async", async, "One-step-off-policy training (verl's one-step-off schedule).");
  }
};

/// The run's ppo section (its defaults when the config sets none).
inline const PpoConfig& ppo_config(const config::RunConfig& cfg) { return cfg.extensions.get<PpoConfig>("ppo"); }

// ---- formulas (parity-tested against tests/parity/ppo_reference.py) ------------
// Per-token tensors are response-aligned (B, R): row i's response tokens in
// columns [0, len_i), `mask` 1 there and 0 after.

/// The per-token KL estimate between policy and reference from their
/// log-probs: "k1" logp - ref, or "k3" exp(ref - logp) - (ref - logp) - 1.
at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator);

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
/// `is_weights` (B, R), when given, weigh each token's policy loss alone
/// (truncated_is_weights: the one-step-off correction), not its value loss.
PpoLossSums ppo_loss_sums(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                          const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                          const at::Tensor& mask, const PpoClip& clip, const at::Tensor& weights = {},
                          const at::Tensor& is_weights = {});

/// The truncated importance weights of one-step-off tokens (verl's truncated
/// importance sampling, TRL's vLLM importance-sampling correction; AReaL drops
/// the tokens above its cap instead): min(exp(prox_logp - behaviour_logp),
/// cap) per token, where prox_logp are the log-probs the
/// weights being trained give and behaviour_logp those of the weights that
/// sampled. No gradient; zero where `mask` is.
at::Tensor truncated_is_weights(const at::Tensor& prox_logp, const at::Tensor& behaviour_logp, const at::Tensor& mask,
                                double cap);

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
at::Tensor grpo_advantages(const at::Tensor& scores, int64_t group, ScaleRewards scale_rewards);

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
  PpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat);
  ~PpoObjective() override;
  std::string name() const override { return "ppo"; }
  std::string target_unit() const override { return "response tokens"; }
  std::string plan(int64_t max_steps) const override;
  std::vector<std::string> check_programs() override;
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  bool prepare_reads_weights() const override { return false; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override;
  /// reward and kl (GRPO, RLOO) or objective/scores and objective/kl; env/turns with an environment.
  std::vector<std::string> console_metrics() const override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  int64_t steps_per_iteration() const override;
  Metrics before_iteration(Engine& engine, int64_t iteration, int64_t step) override;
  void after_step(Engine& engine, int64_t step) override;
  /// The KL controller (after_step) runs before the next rollout.
  StepNeeds step_needs() const override { return {StepReads::within_iteration}; }
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;
  /// ppo.async.rollout_ranks: a rollout rank's loop (receive the weights and
  /// the prompts, sample, send the rows back) until the trainers say stop.
  void serve(models::CausalLM& model, const SideContext& ctx) override;
  void finish(Engine& engine) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
