#pragma once
// Internal (not installed): KTO (Ethayarajh et al. 2024, "KTO: Model
// Alignment as Prospect Theoretic Optimization"; TRL's KTOTrainer), the
// `kto` algorithm, with TRL's loss types kto and apo_zero_unpaired (APO-zero,
// D'Oosterlinck et al. 2024, unpaired). It is registered through the same
// calls a linking program uses (config::register_section,
// train::register_objective), so config/ and the built-in registry name it
// nowhere.
//
// Data: unpaired records {prompt, completion, label: true | false} (TRL's
// unpaired preference format; prompt and completion may be conversational),
// or preference pairs {prompt, chosen, rejected}, each unpaired into a
// desirable and an undesirable example as TRL does (kto_data.h reads them).

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "anvil/train/objective.h"

namespace anvil::train {

/// One unpaired example: a completion (with the end of turn) to its prompt.
struct KtoSample {
  std::vector<int64_t> prompt_ids, completion_ids;
  /// The completion before max_length cut it to fit this example's prompt:
  /// another example's KL row takes it whole and cuts the joined row once,
  /// as TRL's KTOTrainer does. Empty = completion_ids.
  std::vector<int64_t> uncut_completion_ids;
  bool desirable = true;
  std::string prompt, completion;
};

/// A KTO micro-batch of n examples: rows 0..n-1 are prompt_i + completion_i;
/// with `kl_rows`, rows n..2n-1 prompt_i + the uncut completion_(i-1 mod n)
/// (TRL's mismatched KL rows), the joined row cut to `max_length` when set.
/// Tensors: input_ids, labels (completion tokens), attention_mask (R, T) bool
/// (false = padding), R = 2n (n without KL rows); desirable (n) bool.
/// num_targets = n.
Batch collate_kto(const std::vector<const KtoSample*>& ex, int64_t pad_id, int64_t max_length, bool kl_rows = true);

/// kto.loss_type: kto, or apo_zero_unpaired (TRL's unpaired APO-zero: no reference point z0).
enum class KtoLoss { kKto, kApoZeroUnpaired };
inline const config::Choices<KtoLoss> kKtoLosses{{"kto", KtoLoss::kKto},
                                                 {"apo_zero_unpaired", KtoLoss::kApoZeroUnpaired}};

struct KtoLossOptions {
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
  KtoLoss loss_type = KtoLoss::kKto;
};

/// Whether a loss type compares each example with the micro-batch's KL
/// reference point z0 (kto), and so needs the KL rows.
bool kto_uses_kl(KtoLoss loss_type);

/// Per-example losses (n) and implicit rewards beta * (pi - ref) (n).
struct KtoLossOutput {
  at::Tensor losses, rewards;
};

/// The KL reference point z0 of a micro-batch: max(0, mean(pi_kl - ref_kl))
/// over its mismatched (prompt, another example's completion) rows, detached.
at::Tensor kto_kl(const at::Tensor& policy_kl_logps, const at::Tensor& ref_kl_logps);

/// TRL's KTO loss on summed completion log-probs (n), `desirable` (n) bool:
///   kto                desirable    w_d (1 - sigmoid(beta (pi - ref - z0)))
///                      undesirable  w_u (1 - sigmoid(beta (z0 - (pi - ref))))
///   apo_zero_unpaired  desirable    w_d (1 - sigmoid(beta (pi - ref)))
///                      undesirable  w_u sigmoid(beta (pi - ref))
/// (apo_zero_unpaired reads no `kl`; it may be undefined).
KtoLossOutput kto_loss(const at::Tensor& policy_logps, const at::Tensor& ref_logps, const at::Tensor& desirable,
                       const at::Tensor& kl, const KtoLossOptions& opt);

/// A micro-batch's statistics into `sums`, and TRL 1.16's metrics from a
/// step's totals as KTOTrainer averages them: rewards/chosen and logps/chosen
/// (rejected alike) over the micro-batches with such examples of the
/// micro-batch means, rewards/margins over those with both, kl over all.
/// `kl` is z0 (0 for apo_zero_unpaired, which TRL logs as kl 0).
void add_kto_sums(const KtoLossOutput& out, const at::Tensor& policy_logps, const at::Tensor& desirable,
                  const at::Tensor& kl, Sums& sums);
/// TRL's logits/chosen and logits/rejected of a micro-batch into `sums`: the
/// sum over its desirable (undesirable) completions' tokens of the mean over
/// the vocabulary of the logits that predict them (`mean_logit_sums` (n), per
/// example) over those tokens' count (`token_counts` (n)), when it has any;
/// kto_metrics averages them over the micro-batches that had such tokens.
void add_kto_logit_sums(const at::Tensor& mean_logit_sums, const at::Tensor& token_counts, const at::Tensor& desirable,
                        Sums& sums);
/// TRL's entropy of a micro-batch into `sums`: the sum over every
/// completion's tokens of the entropy of the distribution that predicts them
/// (`entropy_sums` (n), per example) over those tokens' count (0 without
/// tokens, as TRL logs it); kto_metrics averages it over the micro-batches.
void add_kto_entropy_sums(const at::Tensor& entropy_sums, const at::Tensor& token_counts, Sums& sums);
Metrics kto_metrics(const Sums& sums, const std::string& prefix = "");

/// TRL's advice on the loss weights when a training epoch holds `desirable`
/// and `undesirable` examples (the KTO paper's eq. 8: w_d n_d / (w_u n_u)
/// should lie in [1, 4/3]): an empty string when either weight is in TRL's
/// range, else the ranges for kto.desirable_weight and kto.undesirable_weight.
std::string kto_balance_advice(int64_t desirable, int64_t undesirable, double desirable_weight,
                               double undesirable_weight);

}  // namespace anvil::train
