#pragma once
// The config sections of the built-in algorithms (sft, reward, dpo, ppo,
// ilql): their keys, defaults, rules and reference docs. RunConfig
// (config.h) holds one of each; only the run's algorithm reads its own.

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/config/schema.h"

namespace anvil::config {

/// Options of the `sft` algorithm.
struct SftConfig {
  bool train_on_prompt = false;
  bool add_eos = true;

  template <class V>
  void visit(V& v) {
    v.field("train_on_prompt", train_on_prompt, "Also compute the loss on prompt tokens.");
    v.field("add_eos", add_eos, "Append EOS to every response (and train on it) so the model learns to stop.");
  }
};

/// Options of the `reward` algorithm (reward-model training).
struct RewardConfig {
  double center_rewards_coefficient = 0;
  bool disable_dropout = true;

  template <class V>
  void visit(V& v) {
    v.field("center_rewards_coefficient", center_rewards_coefficient,
            "Adds c * mean((r_i + r_j)^2) over each example's pairs, keeping rewards centred on 0 (TRL's "
            "center_rewards_coefficient; 0 = off).",
            non_negative());
    v.field("disable_dropout", disable_dropout, "Run the model without dropout while training (as TRL does).");
  }
};

/// Options of the `dpo` algorithm (direct preference optimisation).
struct DpoConfig {
  double beta = 0.1;
  std::string loss_type = "sigmoid";
  double label_smoothing = 0;
  double rpo_alpha = 0;
  double simpo_gamma = 0.5;
  double cpo_alpha = 1.0;
  std::string reference;
  bool precompute_reference = false;
  bool disable_dropout = true;

  template <class V>
  void visit(V& v) {
    v.field("beta", beta,
            "Strength of the implicit KL penalty to the reference (IPO: the regulariser tau; ORPO: the odds-ratio "
            "weight lambda; SimPO / CPO: the reward scale).",
            positive());
    v.field("loss_type", loss_type,
            "sigmoid (DPO), ipo (IPO, on length-normalised log-probs), hinge (SLiC), robust (robust DPO for "
            "noisy labels), or without a reference model: orpo (ORPO: the chosen reply's NLL plus the odds-ratio "
            "term, on length-normalised log-probs), simpo (SimPO: length-normalised log-probs, target margin "
            "simpo_gamma) or cpo (CPO: summed log-probs plus cpo_alpha x the chosen reply's NLL).",
            one_of({"sigmoid", "ipo", "hinge", "robust", "orpo", "simpo", "cpo"}));
    v.field("label_smoothing", label_smoothing,
            "Probability that a pair's preference is flipped (cDPO for sigmoid, robust DPO for robust); "
            "0 = clean labels.",
            Rule{"a number in [0, 0.5)", [](double x) { return x >= 0 && x < 0.5; }, {}});
    v.field("rpo_alpha", rpo_alpha,
            "Adds alpha * the chosen reply's mean token NLL to each pair's loss (RPO; TRL's rpo_alpha). It keeps "
            "DPO from lowering the chosen replies' likelihood; 0 = plain DPO.",
            non_negative());
    v.field("simpo_gamma", simpo_gamma, "loss_type simpo: the target reward margin gamma (TRL's simpo_gamma).",
            non_negative());
    v.field("cpo_alpha", cpo_alpha,
            "loss_type cpo and simpo: weight of the chosen reply's mean token NLL (TRL's cpo_alpha; 0 gives the "
            "SimPO paper's loss).",
            non_negative());
    v.field("reference", reference,
            "Reference model folder (HF layout). Empty = model.from, or a frozen copy of the initial weights "
            "when model.from is empty. orpo, simpo and cpo load none.");
    v.field("precompute_reference", precompute_reference,
            "Compute the reference log-probs of every pair once before training, cache them in "
            "output_dir/reference_logps.safetensors and free the reference model.");
    v.field("disable_dropout", disable_dropout, "Run the policy without dropout while training (as TRL does).");
  }
};

/// Where PPO's rewards come from (exactly one source).
struct PpoRewardConfig {
  std::string model;
  std::string command;
  double timeout_s = 60;
  std::string exact_match;
  std::string regex;
  std::string function;
  std::string scale = "none";
  double clip = 0;
  int64_t batch_size = 64;

  template <class V>
  void visit(V& v) {
    v.field("model", model,
            "Reward-model folder: an algorithm: reward checkpoint or export, or an HF ...ForSequenceClassification "
            "folder. Frozen, and sharded like the policy.");
    v.field("command", command,
            "Reward program: a shell command started once; it reads one JSON object per line on stdin (the prompt "
            "record as written, plus the sample: {completion, prompt_text, ended}; docs/algorithms.md) and answers one "
            "line "
            "{\"reward\": x} each.");
    v.field("timeout_s", timeout_s, "Seconds the reward program may take to answer one record.", positive());
    v.field("exact_match", exact_match,
            "Verifiable reward: 1 when the response, trimmed, equals this field of the prompt record, else 0.");
    v.field("regex", regex,
            "Verifiable reward: 1 when the response contains a match of the regular expression (ECMAScript) held "
            "in this field of the prompt record, else 0.");
    v.field("function", function,
            "A reward function a linking program registered (anvil::train::register_reward_function).");
    v.field("scale", scale, "none, or running: divide scores by the running std of every score so far (trlx).",
            one_of({"none", "running"}));
    v.field("clip", clip, "Clip (scaled) scores to [-clip, clip] (trlx's cliprange_reward); 0 = off.", non_negative());
    v.field("batch_size", batch_size, "Rows the reward model scores at once.", positive());
  }
};

/// One of several reward sources (ppo.rewards): a source as in ppo.reward,
/// its weight in the summed score and the name its metrics take.
struct WeightedRewardConfig : PpoRewardConfig {
  double weight = 1.0;
  std::string name;

  template <class V>
  void visit(V& v) {
    PpoRewardConfig::visit(v);
    v.field("weight", weight, "The source's weight in the score (TRL's reward_weights).");
    v.field("name", name,
            "The name its metrics take (rewards/<name>/mean, /std); empty = the source's key and position "
            "(exact_match_0, ...).");
  }
};

/// DAPO's soft overlong punishment of a response's score.
struct OverlongPenaltyConfig {
  int64_t buffer = 0;
  double factor = 1.0;
  int64_t length = 0;

  template <class V>
  void visit(V& v) {
    v.field("buffer", buffer,
            "Tokens before the longest allowed response over which the penalty grows from 0 to -factor; 0 = off.",
            non_negative());
    v.field("factor", factor, "The penalty at the longest allowed response.", non_negative());
    v.field("length", length, "The longest allowed response, in tokens; 0 = ppo.max_new_tokens.", non_negative());
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
    v.field("timeout_s", timeout_s, "Seconds the environment program may take to answer one line.", positive());
  }
};

/// Options of the `ppo` algorithm (online RL: PPO, GRPO, RLOO, REINFORCE++).
struct PpoConfig {
  int64_t prompts_per_rollout = 16;
  int64_t samples_per_prompt = 1;
  int64_t ppo_epochs = 4;
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t generation_batch_size = 0;
  std::string reference;
  std::string advantage = "gae";
  double kl_coef = 0.05;
  std::string kl_estimator = "k1";
  double target_kl = 0;
  double kl_horizon = 10000;
  double gamma = 1.0;
  double lam = 0.95;
  double cliprange = 0.2;
  double cliprange_high = 0;
  double cliprange_value = 0.2;
  double vf_coef = 0.1;
  bool whiten_advantages = true;
  std::string loss_aggregation = "token_mean";
  double loss_constant = 0;
  std::string scale_rewards = "group";
  std::string importance_sampling_level = "token";
  bool mask_truncated_completions = false;
  OverlongPenaltyConfig overlong_penalty;
  bool dynamic_sampling = false;
  int64_t dynamic_sampling_max_rounds = 4;
  std::string critic_from;
  double critic_learning_rate = 0;
  PpoRewardConfig reward;
  std::vector<WeightedRewardConfig> rewards;
  EnvironmentConfig environment;
  int64_t max_turns = 4;

  template <class V>
  void visit(V& v) {
    v.field("prompts_per_rollout", prompts_per_rollout,
            "Prompts each rollout draws from data.train (over all ranks; a multiple of the world size).", positive());
    v.field("samples_per_prompt", samples_per_prompt,
            "Responses sampled per prompt (at least 2 for advantage grpo, rloo and reinforce_pp_baseline).",
            positive());
    v.field("ppo_epochs", ppo_epochs, "Passes over each rollout, in minibatches of train.global_batch_size sequences.",
            positive());
    v.field("max_new_tokens", max_new_tokens, "Most tokens a rollout response may have.", positive());
    v.field("temperature", temperature, "Sampling temperature; log-probs are taken at the same temperature.",
            positive());
    v.field("top_k", top_k, "Sample among the k likeliest tokens (0 = all).", non_negative());
    v.field("top_p", top_p, "Nucleus sampling mass (1 = off).",
            Rule{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }, {}});
    v.field("generation_batch_size", generation_batch_size,
            "Sequences generated together (0 = a rank's whole share of the rollout).", non_negative());
    v.field("reference", reference,
            "Reference model folder for the KL penalty. Empty = model.from, or a frozen copy of the initial weights.");
    v.field("advantage", advantage,
            "gae (PPO with a value head), grpo (group-normalised scores, KL in the loss, no critic), rloo "
            "(leave-one-out baseline, no critic), reinforce_pp (REINFORCE++: the KL-penalised token rewards summed "
            "to the end, whitened over the rollout, no critic) or reinforce_pp_baseline (the same on each score "
            "minus its group's mean).",
            one_of({"gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"}));
    v.field("kl_coef", kl_coef, "KL penalty coefficient (initial value when target_kl is set; GRPO's beta).",
            non_negative());
    v.field("kl_estimator", kl_estimator, "Per-token KL estimator: k1 (logp - ref) or k3.", one_of({"k1", "k3"}));
    v.field("target_kl", target_kl,
            "Adaptive KL controller target (Ziegler et al.): the summed KL per sequence to aim for; 0 = fixed "
            "kl_coef.",
            non_negative());
    v.field("kl_horizon", kl_horizon, "Adaptive KL controller horizon, in sequences.", positive());
    v.field("gamma", gamma, "GAE discount.", Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("lam", lam, "GAE lambda.", Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("cliprange", cliprange,
            "Policy ratio clip epsilon: the ratio is clipped to [1 - cliprange, 1 + "
            "cliprange_high].",
            positive());
    v.field("cliprange_high", cliprange_high,
            "Upper clip epsilon (DAPO's clip-higher, TRL's epsilon_high); 0 = cliprange.", non_negative());
    v.field("cliprange_value", cliprange_value, "Value clip range around the rollout's values.", positive());
    v.field("vf_coef", vf_coef, "Weight of the value loss.", non_negative());
    v.field("whiten_advantages", whiten_advantages,
            "Whiten advantages over the rollout (gae, rloo, reinforce_pp and reinforce_pp_baseline).");
    v.field("loss_aggregation", loss_aggregation,
            "How per-token losses become the step's loss: token_mean (over every response token of the step: DAPO, "
            "TRL's loss_type dapo), sequence_mean (each response's token mean, averaged over responses: GRPO's "
            "paper, TRL's grpo) or constant (summed, divided by loss_constant x responses: Dr. GRPO, TRL's "
            "dr_grpo).",
            one_of({"token_mean", "sequence_mean", "constant"}));
    v.field("loss_constant", loss_constant, "loss_aggregation constant: the divisor per response; 0 = max_new_tokens.",
            non_negative());
    v.field("scale_rewards", scale_rewards,
            "advantage grpo: divide each score's distance from its group's mean by the group's std (group), by the "
            "std of the whole rollout (batch), or by nothing (none: Dr. GRPO).",
            one_of({"group", "batch", "none"}));
    v.field("importance_sampling_level", importance_sampling_level,
            "token: one ratio per token (PPO, GRPO); sequence: one ratio per response, exp of the mean log-ratio "
            "over its tokens (GSPO), clipped with cliprange / cliprange_high.",
            one_of({"token", "sequence"}));
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
            positive());
    v.section("overlong_penalty", overlong_penalty,
              "DAPO's soft overlong punishment, added to each score: 0 up to length - buffer tokens, then falling "
              "linearly to -factor at length.");
    v.field("critic_from", critic_from,
            "advantage gae: a separate critic model trained beside the policy, initialised from this folder (a "
            "reward model, whose score head becomes the value head, or any model of the policy's tokenizer). "
            "Empty = a value head on the policy's trunk.");
    v.field("critic_learning_rate", critic_learning_rate,
            "The critic's peak learning rate (it follows the policy's schedule); 0 = optimizer.lr.", non_negative());
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
            positive());
  }
};

/// Options of the `ilql` algorithm (offline RL: implicit language Q-learning,
/// as trlx defines it; docs/algorithms.md).
struct IlqlConfig {
  double tau = 0.7;
  double gamma = 0.99;
  double cql_scale = 0.1;
  double awac_scale = 1.0;
  double awac_beta = 0;
  double alpha = 0.001;
  int64_t steps_for_target_q_sync = 5;
  bool two_qs = true;
  bool normalize_rewards = true;
  double beta = 1.0;
  int64_t top_k = 20;
  double temperature = 1.0;
  int64_t max_new_tokens = 32;
  PpoRewardConfig reward;

  template <class V>
  void visit(V& v) {
    v.field("tau", tau, "Expectile of the V regression toward min(target Qs).",
            Rule{"a number in (0, 1)", [](double x) { return x > 0 && x < 1; }, {}});
    v.field("gamma", gamma, "Discount.", Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("cql_scale", cql_scale, "Weight of the CQL term (cross-entropy of the Q values on the taken tokens).",
            non_negative());
    v.field("awac_scale", awac_scale, "Weight of the AWAC term (cross-entropy of the LM logits on the data).",
            non_negative());
    v.field("awac_beta", awac_beta,
            "AWAC weight exp(awac_beta (min target Q - V)) on the LM cross-entropy (trlx's ILQLConfig.beta); 0 = "
            "weight 1.",
            non_negative());
    v.field("alpha", alpha, "Polyak rate of the target Q heads: target <- alpha q + (1 - alpha) target.",
            Rule{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }, {}});
    v.field("steps_for_target_q_sync", steps_for_target_q_sync, "Optimizer steps between target Q updates.",
            positive());
    v.field("two_qs", two_qs, "Two Q heads (and targets), taking their minimum; false = one.");
    v.field("normalize_rewards", normalize_rewards,
            "Standardise the dataset's rewards (mean 0, std 1 over the responses' total rewards), as trlx does.");
    v.field("beta", beta,
            "Advantage shaping of the eval's sampling: scores = log-softmax + beta (min target Q - V); 0 = plain "
            "sampling.",
            non_negative());
    v.field("top_k", top_k, "Eval sampling among the k likeliest shaped scores (0 = all).", non_negative());
    v.field("temperature", temperature, "Eval sampling temperature.", positive());
    v.field("max_new_tokens", max_new_tokens, "Most tokens an eval response may have.", positive());
    v.section("reward", reward,
              "How the eval scores its sampled responses (optional): at most one of model, command, exact_match, "
              "regex, function, as ppo.reward.");
  }
};

}  // namespace anvil::config
