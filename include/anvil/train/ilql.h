#pragma once
// ILQL: implicit language Q-learning (Snell et al. 2022) as trlx defines it,
// on the shared engine: offline RL from responses with rewards
// (`algorithm: ilql`, offline_rl data). Heads on the policy's trunk (the head
// API), the target-Q Polyak update in the after-step hook, and
// advantage-shaped sampling through generation's score function.
// docs/algorithms.md.

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/rewards/rewards.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/objective.h"

namespace anvil::train {

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
  rewards::SourceConfig reward;

  template <class V>
  void visit(V& v) {
    v.field("tau", tau, "Expectile of the V regression toward min(target Qs).",
            config::Rule{"a number in (0, 1)", [](double x) { return x > 0 && x < 1; }, {}});
    v.field("gamma", gamma, "Discount.",
            config::Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("cql_scale", cql_scale, "Weight of the CQL term (cross-entropy of the Q values on the taken tokens).",
            config::non_negative());
    v.field("awac_scale", awac_scale, "Weight of the AWAC term (cross-entropy of the LM logits on the data).",
            config::non_negative());
    v.field("awac_beta", awac_beta,
            "AWAC weight exp(awac_beta (min target Q - V)) on the LM cross-entropy (trlx's ILQLConfig.beta); 0 = "
            "weight 1.",
            config::non_negative());
    v.field("alpha", alpha, "Polyak rate of the target Q heads: target <- alpha q + (1 - alpha) target.",
            config::Rule{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }, {}});
    v.field("steps_for_target_q_sync", steps_for_target_q_sync, "Optimizer steps between target Q updates.",
            config::positive());
    v.field("two_qs", two_qs, "Two Q heads (and targets), taking their minimum; false = one.");
    v.field("normalize_rewards", normalize_rewards,
            "Standardise the dataset's rewards (mean 0, std 1 over the responses' total rewards), as trlx does.");
    v.field("beta", beta,
            "Advantage shaping of the eval's sampling: scores = log-softmax + beta (min target Q - V); 0 = plain "
            "sampling.",
            config::non_negative());
    v.field("top_k", top_k, "Eval sampling among the k likeliest shaped scores (0 = all).", config::non_negative());
    v.field("temperature", temperature, "Eval sampling temperature.", config::positive());
    v.field("max_new_tokens", max_new_tokens, "Most tokens an eval response may have.", config::positive());
    v.section("reward", reward,
              "How the eval scores its sampled responses (optional): at most one of model, command, exact_match, "
              "regex, function, as ppo.reward.");
  }
};

/// The run's ilql section (its defaults when the config sets none).
inline const IlqlConfig& ilql_config(const config::RunConfig& cfg) { return cfg.extensions.get<IlqlConfig>("ilql"); }

// ---- formulas (tested against an independent Python reference) -------------------

struct IlqlLossOptions {
  double tau = 0.7;
  double gamma = 0.99;
  double cql_scale = 0.1;
  double awac_scale = 1.0;
  double awac_beta = 0.0;  // trlx's ILQLConfig.beta: AWAC weight exp(awac_beta (tQ - V))
};

/// trlx's ILQLConfig.loss as sums over the batch's nonterminal action tokens
/// (m = dones[:, :-1]); dividing each by `count` gives trlx's means. Inputs,
/// response-aligned and right-padded (B rows, A action slots, V vocabulary):
///   logits (B, A, V)  LM logits at the state before each action
///   qs, target_qs     one or two (B, A, V) Q-head outputs there (targets are detached)
///   vs (B, A + 1)     V-head values at states 0..A (state n_i follows the last action)
///   actions (B, A)    token ids; rewards (B, A); dones (B, A + 1): 1 for states
///                     0..n_i-1, 0 for state n_i and padding
/// Terms: Q regression toward r + γ V(next)·done (summed over the Q heads),
/// expectile regression (tau) of V toward min(target Qs), CQL (cross-entropy
/// of each Q head on the taken tokens) and AWAC (the LM's cross-entropy,
/// weighted by exp(awac_beta (tQ - V))).
/// loss = q + v + cql_scale · cql + awac_scale · awac.
struct IlqlTerms {
  at::Tensor loss, q, v, cql, awac;
  at::Tensor count;  // nonterminal action tokens
  /// Sums of x and x² over them, for means and (population) stds: "v", "q0",
  /// "q1" (two Q heads), "advantage" (tQ - V), "awac_weight".
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> stats;
};
IlqlTerms ilql_loss_sums(const at::Tensor& logits, const std::vector<at::Tensor>& qs,
                         const std::vector<at::Tensor>& target_qs, const at::Tensor& vs, const at::Tensor& actions,
                         const at::Tensor& rewards, const at::Tensor& dones, const IlqlLossOptions& options);

/// Polyak averaging of a target parameter: alpha · source + (1 - alpha) · target.
at::Tensor polyak(const at::Tensor& target, const at::Tensor& source, double alpha);

/// Advantage-shaped next-token scores (trlx's ILQL generate, before top-k and
/// temperature): log_softmax(logits) + beta · (min(target Qs) - v).
/// logits and target Qs (B, V), v (B).
at::Tensor ilql_shaped_scores(const at::Tensor& logits, const std::vector<at::Tensor>& target_qs, const at::Tensor& v,
                              double beta);

// ---- heads ---------------------------------------------------------------------

/// The heads ILQL adds to the policy, MLPs as trlx's make_head
/// (Linear(C, 2C) -> ReLU -> Linear(2C, out)): "q1" and "q2" over the
/// vocabulary ("q2" only with two Q heads), their targets "target_q1" and
/// "target_q2" (copies at the start, then Polyak-averaged; never trained),
/// and "v" (out 1). Saved in heads.safetensors beside the HF folder.
bool has_ilql_heads(const models::CausalLM& model);
/// Adds the heads the model lacks (two_qs: both Q heads); targets start as copies.
void add_ilql_heads(models::CausalLM& model, bool two_qs);

/// A generation::SamplingOptions::score_fn that samples an ILQL checkpoint
/// with advantage shaping (`anvil generate --ilql-beta`). Throws
/// std::invalid_argument when the model has no ILQL heads.
std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& logits)> ilql_score_fn(models::CausalLM& model,
                                                                                            double beta);

// ---- the objective ---------------------------------------------------------------

/// algorithm: ilql. Train data are offline_rl records ({prompt, response,
/// reward} or per-token "rewards"); data.eval holds prompts records, which
/// the eval answers with advantage-shaped sampling (ilql.beta) and scores
/// with ilql.reward when set.
class IlqlObjective final : public Objective {
 public:
  IlqlObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat);
  ~IlqlObjective() override;
  std::string name() const override { return "ilql"; }
  std::string target_unit() const override { return "response tokens"; }
  std::vector<std::string> check_programs() override;
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  bool prepare_reads_weights() const override { return false; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  void after_step(Engine& engine, int64_t step) override;
  bool trains(const std::string& name) const override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
