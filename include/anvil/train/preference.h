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

#include "anvil/data/datasets.h"
#include "anvil/data/mixture.h"
#include "anvil/train/objective.h"
#include "anvil/train/sft.h"

namespace anvil::train {

// ---- formulas (parity-tested against tests/parity/preference_reference.py) ----

/// Per-row sum of the log-probabilities of the tokens whose label is not
/// ignored, and their count: logits (B, T, V), labels (B, T) aligned with the
/// inputs (position t's label is predicted from position t - 1).
/// Returns ((B) float32 sums, (B) int64 counts).
std::pair<at::Tensor, at::Tensor> sequence_logps(const at::Tensor& logits, const at::Tensor& labels);

struct DpoLossOptions {
  std::string loss_type = "sigmoid";  // sigmoid | ipo | hinge | robust
  double beta = 0.1;
  double label_smoothing = 0;  // cDPO (sigmoid) / robust DPO
};

/// Per-pair losses and the implicit rewards beta * (pi - ref), (P) each.
struct DpoLossOutput {
  at::Tensor losses, chosen_rewards, rejected_rewards;
};

/// TRL's DPO losses on per-sequence log-probs (P) (for ipo, pass
/// length-normalised log-probs: dpo_logps does that).
DpoLossOutput dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected,
                       const at::Tensor& ref_chosen, const at::Tensor& ref_rejected, const DpoLossOptions& opt);

/// The log-probs a loss type compares: sums, or per-token means for ipo.
at::Tensor dpo_logps(const at::Tensor& sums, const at::Tensor& counts, const std::string& loss_type);

/// DPO statistics of a micro-batch into `sums` and the TRL-named metrics
/// (rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
/// logps/chosen, logps/rejected) from a step's totals.
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

// ---- data ----------------------------------------------------------------------

/// A preference batch: each example's replies are consecutive rows of
/// prompt + reply (right-padded with pad_id).
/// Tensors: input_ids, labels (reply tokens; prompt and padding ignored),
/// replies (E) per example, better / worse / margin / weight (the pairs),
/// dataset / index (E) where each example came from. num_targets = examples.
Batch collate_preferences(const std::vector<const data::PreferenceSample*>& examples,
                          const std::vector<data::SampleRef>& refs, int64_t pad_id);

/// Preference datasets of data.train / data.eval, with eval_fraction splits.
using PreferenceData = MixtureData<data::PreferenceDataset>;
PreferenceData load_preference_data(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);

/// Micro-batches of `micro_batch_size` examples; like LmBatchSource, every
/// rank walks the same global stream and takes its slice.
class PreferenceBatchSource final : public BatchSource {
 public:
  PreferenceBatchSource(std::vector<std::shared_ptr<const data::PreferenceDataset>> datasets,
                        data::MixtureSampler sampler, int64_t micro_batch_size, int64_t pad_id, int64_t rank = 0,
                        int64_t world = 1);
  Batch next() override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;
  int64_t samples_per_epoch() const override { return sampler_.epoch_length(); }

 private:
  std::vector<std::shared_ptr<const data::PreferenceDataset>> datasets_;
  data::MixtureSampler sampler_;
  int64_t micro_batch_size_, pad_id_, rank_, world_;
};

// ---- objectives ----------------------------------------------------------------

/// algorithm: reward. Adds a score head to the model (unless it has one) and
/// reads each row's score at its last non-pad token, as HF does.
class RewardObjective final : public Objective {
 public:
  RewardObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  std::string name() const override { return "reward"; }
  std::string target_unit() const override { return "preference examples"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override { return ranking_metrics(sums); }
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override { return *source_; }

  /// (rows) float32 scores of a collated batch.
  at::Tensor rewards(models::CausalLM& model, const Batch& batch) const;

 private:
  config::RunConfig cfg_;
  int64_t pad_id_;
  PreferenceData data_;
  std::unique_ptr<PreferenceBatchSource> source_;
};

/// algorithm: dpo.
class DpoObjective final : public Objective {
 public:
  DpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  std::string name() const override { return "dpo"; }
  std::string target_unit() const override { return "preference examples"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  Metrics step_metrics(const Sums& sums) const override { return dpo_metrics(sums); }
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override { return *source_; }

 private:
  /// Reference log-prob sums of a batch's rows (R): from the cache or the model.
  at::Tensor reference_sums(const Batch& batch, bool eval);
  void precompute(const RunContext& ctx);
  std::string fingerprint() const;

  config::RunConfig cfg_;
  const tokenizer::Tokenizer& tok_;
  int64_t pad_id_, stop_id_;
  DpoLossOptions loss_opt_;
  PreferenceData data_;
  std::unique_ptr<PreferenceBatchSource> source_;
  std::shared_ptr<models::CausalLM> reference_;  // null once precomputed
  std::string reference_desc_;
  /// Precomputed reference sums per (train set) and (eval set): (N, K) float64.
  std::vector<at::Tensor> cached_train_, cached_eval_;
};

}  // namespace anvil::train
