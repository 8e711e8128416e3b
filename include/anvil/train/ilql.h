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
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/objective.h"

namespace anvil::train {

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
  IlqlObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  ~IlqlObjective() override;
  std::string name() const override { return "ilql"; }
  std::string target_unit() const override { return "response tokens"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
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
