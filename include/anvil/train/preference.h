#pragma once
// Preference learning on the shared loop: reward models (algorithm: reward;
// pairwise loss with margin and centering, Open-Assistant's K-wise ranking
// loss) and DPO (algorithm: dpo; sigmoid, ipo, hinge, robust, cDPO label
// smoothing; in-process or precomputed reference). Formulas and metrics:
// docs/algorithms.md.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anvil/train/objective.h"

namespace anvil::train {

/// Options of the `reward` algorithm (reward-model training).
struct RewardConfig {
  double center_rewards_coefficient = 0;
  bool disable_dropout = true;

  template <class V>
  void visit(V& v) {
    v.field("center_rewards_coefficient", center_rewards_coefficient,
            "Adds c * mean((r_i + r_j)^2) over each example's pairs, keeping rewards centred on 0 (TRL's "
            "center_rewards_coefficient; 0 = off).",
            config::non_negative());
    v.field("disable_dropout", disable_dropout, "Run the model without dropout while training (as TRL does).");
  }
};

/// dpo.loss_type: which preference loss.
enum class DpoLoss { kSigmoid, kIpo, kHinge, kRobust, kOrpo, kSimpo, kCpo };
inline const config::Choices<DpoLoss> kDpoLosses{{"sigmoid", DpoLoss::kSigmoid}, {"ipo", DpoLoss::kIpo},
                                                 {"hinge", DpoLoss::kHinge},     {"robust", DpoLoss::kRobust},
                                                 {"orpo", DpoLoss::kOrpo},       {"simpo", DpoLoss::kSimpo},
                                                 {"cpo", DpoLoss::kCpo}};
/// dpo.orpo_nll: the tokens of ORPO's NLL term.
enum class OrpoNll { kPromptAndReply, kReply };
inline const config::Choices<OrpoNll> kOrpoNlls{{"prompt_and_reply", OrpoNll::kPromptAndReply},
                                                {"reply", OrpoNll::kReply}};

/// Options of the `dpo` algorithm (direct preference optimisation).
struct DpoConfig {
  double beta = 0.1;
  DpoLoss loss_type = DpoLoss::kSigmoid;
  double label_smoothing = 0;
  double rpo_alpha = 0;
  double simpo_gamma = 0.5;
  double cpo_alpha = 1.0;
  OrpoNll orpo_nll = OrpoNll::kPromptAndReply;
  std::string reference;
  bool precompute_reference = false;
  bool disable_dropout = true;

  template <class V>
  void visit(V& v) {
    v.field("beta", beta,
            "Strength of the implicit KL penalty to the reference (IPO: the regulariser tau; ORPO: the odds-ratio "
            "weight lambda; SimPO / CPO: the reward scale).",
            config::positive());
    config::enum_field(
        v, "loss_type", loss_type,
        "sigmoid (DPO), ipo (IPO, on length-normalised log-probs), hinge (SLiC), robust (robust DPO for "
        "noisy labels), or without a reference model: orpo (ORPO: the chosen reply's NLL plus the odds-ratio "
        "term, on length-normalised log-probs), simpo (SimPO: length-normalised log-probs, target margin "
        "simpo_gamma) or cpo (CPO: summed log-probs plus cpo_alpha x the chosen reply's NLL).",
        kDpoLosses, kDpoLosses.rule());
    v.field("label_smoothing", label_smoothing,
            "Probability that a pair's preference is flipped (cDPO for sigmoid, robust DPO for robust); "
            "0 = clean labels.",
            config::Rule{"a number in [0, 0.5)", [](double x) { return x >= 0 && x < 0.5; }, {}});
    v.field("rpo_alpha", rpo_alpha,
            "Adds alpha * the chosen reply's mean token NLL to each pair's loss (RPO; TRL's rpo_alpha). It keeps "
            "DPO from lowering the chosen replies' likelihood; 0 = plain DPO.",
            config::non_negative());
    v.field("simpo_gamma", simpo_gamma, "loss_type simpo: the target reward margin gamma (TRL's simpo_gamma).",
            config::non_negative());
    v.field("cpo_alpha", cpo_alpha,
            "loss_type cpo and simpo: weight of the chosen reply's mean token NLL (TRL's cpo_alpha; 0 gives the "
            "SimPO paper's loss).",
            config::non_negative());
    config::enum_field(v, "orpo_nll", orpo_nll,
                       "loss_type orpo: the tokens of ORPO's NLL term. prompt_and_reply (TRL's ORPOTrainer: the mean "
                       "token NLL over the chosen row's prompt and reply) or reply (the chosen reply's tokens only, "
                       "the ORPO paper's text). The odds ratio is over the replies either way.",
                       kOrpoNlls, kOrpoNlls.rule());
    v.field("reference", reference,
            "Reference model folder (HF layout). Empty = model.from, or a frozen copy of the initial weights "
            "when model.from is empty. orpo, simpo and cpo load none.");
    v.field("precompute_reference", precompute_reference,
            "Compute the reference log-probs of every pair once before training, cache them in "
            "output_dir/reference_logps.safetensors and free the reference model.");
    v.field("disable_dropout", disable_dropout, "Run the policy without dropout while training (as TRL does).");
  }
};

/// The run's reward and dpo sections (their defaults when the config sets none).
inline const RewardConfig& reward_config(const config::RunConfig& cfg) {
  return cfg.extensions.get<RewardConfig>("reward");
}
inline const DpoConfig& dpo_config(const config::RunConfig& cfg) { return cfg.extensions.get<DpoConfig>("dpo"); }
/// The keys dpo reads of those only the objectives that declare them read
/// (config::read_if_declared): an objective built on dpo's data and eval
/// (kto) declares the same.
std::vector<std::string> dpo_reads();

// ---- formulas (parity-tested against tests/parity/preference_reference.py) ----

/// Per-row sum of the log-probabilities of the tokens whose label is not
/// ignored, and their count: logits (B, T, V), labels (B, T) aligned with the
/// inputs (position t's label is predicted from position t - 1).
/// Returns ((B) float32 sums, (B) int64 counts).
std::pair<at::Tensor, at::Tensor> sequence_logps(const at::Tensor& logits, const at::Tensor& labels);

struct DpoLossOptions {
  DpoLoss loss_type = DpoLoss::kSigmoid;
  double beta = 0.1;
  double label_smoothing = 0;  // cDPO (sigmoid) / robust DPO / simpo / cpo
  double simpo_gamma = 0.5;    // simpo's target margin
};

/// Whether a loss type compares the policy with no reference model (orpo,
/// simpo, cpo).
bool reference_free(DpoLoss loss_type);

/// Per-pair losses and the implicit rewards beta * (pi - ref) (beta * pi
/// without a reference), (P) each; for orpo also each pair's log odds ratio.
/// The NLL term of orpo and cpo is the caller's (DpoObjective adds it).
struct DpoLossOutput {
  at::Tensor losses, chosen_rewards, rejected_rewards;
  at::Tensor log_odds;  // orpo only
};

/// TRL's DPO losses on per-sequence log-probs (P) (for ipo, orpo and simpo,
/// pass length-normalised log-probs: dpo_logps does that). A reference-free
/// loss type ignores ref_chosen and ref_rejected (they may be undefined):
///   orpo   -beta * logsigmoid(log odds(pi_c) - log odds(pi_r)), odds p / (1 - p)
///   simpo  -logsigmoid(beta * (pi_c - pi_r) - gamma)  (label smoothing as cDPO)
///   cpo    -logsigmoid(beta * (pi_c - pi_r))          (label smoothing as cDPO)
DpoLossOutput dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                       const at::Tensor& ref_rejected, const DpoLossOptions& opt);

/// The log-probs a loss type compares: sums, or per-token means for ipo,
/// orpo and simpo.
at::Tensor dpo_logps(const at::Tensor& sums, const at::Tensor& counts, DpoLoss loss_type);

/// DPO statistics of a micro-batch into `sums` and the TRL-named metrics
/// (rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
/// logps/chosen, logps/rejected; orpo's log_odds_ratio and log_odds_chosen)
/// from a step's totals.
void add_dpo_sums(const DpoLossOutput& out, const at::Tensor& policy_chosen, const at::Tensor& policy_rejected,
                  Sums& sums);
Metrics dpo_metrics(const Sums& sums, const std::string& prefix = "");

/// The ranked pairs of a batch of examples: every (better, worse) pair of
/// rows inside an example, with the example's margin and 1 / its pair count.
struct RankingPairs {
  at::Tensor better, worse;  // (P) int64 row indices into the rewards
  at::Tensor margin;         // (P) float
  at::Tensor weight;         // (P) float, 1 / (pairs of the example)
};

/// Pairs of examples whose replies are rows [start_e, start_e + k_e), best
/// first; margins[e] (nullopt = 0) applies to each pair of example e.
RankingPairs ranking_pairs(const std::vector<int64_t>& replies_per_example,
                           const std::vector<std::optional<double>>& margins);

/// Sum over examples of: mean over the example's pairs of
/// -log sigmoid(r_better - r_worse - margin) + center * (r_better + r_worse)^2.
/// For K = 2 this is TRL's RewardTrainer loss; for K > 2, Open-Assistant's
/// K-wise ranking loss.
at::Tensor ranking_loss_sum(const at::Tensor& rewards, const RankingPairs& pairs, double center_coefficient);

/// Reward-model statistics into `sums`, and accuracy / margin (over pairs) and
/// rewards/mean / rewards/std (population, over replies) from the totals.
void add_ranking_sums(const at::Tensor& rewards, const RankingPairs& pairs, Sums& sums);
Metrics ranking_metrics(const Sums& sums, const std::string& prefix = "");

// ---- objectives ----------------------------------------------------------------

/// algorithm: reward. Adds a score head to the model (unless it has one) and
/// reads each row's score at its last non-pad token, as HF does.
class RewardObjective final : public Objective {
 public:
  RewardObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat);
  ~RewardObjective() override;
  std::string name() const override { return "reward"; }
  std::string target_unit() const override { return "preference examples"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  bool prepare_reads_weights() const override { return false; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override { return ranking_metrics(sums); }
  std::vector<std::string> console_metrics() const override { return {"accuracy", "margin"}; }
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  StepNeeds step_needs() const override { return {StepReads::late}; }  // no after_step

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// algorithm: dpo. The reference (dpo.reference, else the initial policy) is
/// a FrozenModel, sharded like the policy, or only its log-probs when
/// dpo.precompute_reference is set.
class DpoObjective final : public Objective {
 public:
  DpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat);
  ~DpoObjective() override;
  std::string name() const override { return "dpo"; }
  std::string target_unit() const override { return "preference examples"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  bool prepare_reads_weights() const override { return false; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override { return dpo_metrics(sums); }
  std::vector<std::string> console_metrics() const override { return {"rewards/accuracies", "rewards/margins"}; }
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  StepNeeds step_needs() const override { return {StepReads::late}; }  // no after_step

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
