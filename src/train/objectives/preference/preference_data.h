#pragma once
// Internal (not installed): preference data behind RewardObjective and
// DpoObjective: collation of ranked replies and a rank-sliced, resumable
// stream of micro-batches.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "data/mixture.h"
#include "anvil/train/objective.h"
#include "train/objectives/lm_data.h"

namespace anvil::train {

/// Runs the model without dropout for a scope (gradients still flow).
class NoDropout {
 public:
  NoDropout(models::CausalLM& m, bool active) : m_(m), restore_(active && m.is_training()) {
    if (restore_) m_.eval();
  }
  ~NoDropout() {
    if (restore_) m_.train();
  }
  NoDropout(const NoDropout&) = delete;
  NoDropout& operator=(const NoDropout&) = delete;

 private:
  models::CausalLM& m_;
  bool restore_;
};

/// A model's summed log-probs of each row's labelled tokens (labels aligned
/// with the inputs, kIgnoreIndex elsewhere) and their counts: ((B) float32,
/// (B) int64); through the fused head (lm_loss.h) when `fused`. `token_mask`
/// (B, T) bool on any device, true = a real token: a mixture of experts'
/// load-balancing statistics leave the rest out (models::ForwardArgs::token_mask;
/// a dense model does not read it, nor copy it to the device). With
/// `mean_logit_sums`, also each row's sum over its labelled tokens of the mean
/// over the vocabulary of the logits that predict them ((B) float32, no
/// gradient; TRL's mean_logits): through the fused head as hidden · mean(W
/// rows) + mean(b), which needs no (B, T, V) logits; soft-capped logits take
/// the plain head, so the mean is of the real (capped) logits.
/// What model_sequence_logps also measures, per row over the positions that
/// predict a labelled token ((B) float32, no gradient), as TRL's trainers log
/// them: the sum of the mean over the vocabulary of the logits (TRL's
/// mean_logits; through the fused head as hidden · mean(W rows) + mean(b),
/// with no (B, T, V) logits), of the entropy of the predicted distribution
/// (TRL's entropy; the fused head's chunks), and the count of positions whose
/// most likely token is the label (TRL's is_top1). Each is filled when asked.
struct TokenStats {
  bool want_mean_logits = false, want_entropy = false, want_top1 = false;
  at::Tensor mean_logit_sums, entropy_sums, top1_counts;
};
std::pair<at::Tensor, at::Tensor> model_sequence_logps(models::CausalLM& model, const at::Tensor& ids,
                                                       const at::Tensor& labels, bool fused,
                                                       const at::Tensor& token_mask = {}, TokenStats* stats = nullptr);

/// DPOTrainer's token statistics of a micro-batch of pairs (rows alternate
/// chosen, rejected; `token_counts` (2E) each row's labelled tokens) into
/// `sums`: logits/chosen and logits/rejected (the mean over that side's reply
/// tokens of the vocabulary-mean logit), entropy (over every reply token) and
/// mean_token_accuracy (the chosen reply tokens that are the most likely),
/// each 0 without tokens; dpo_metrics averages them over the micro-batches.
void add_dpo_token_sums(const TokenStats& stats, const at::Tensor& token_counts, Sums& sums);

/// The per-token form of model_sequence_logps: (B, T) float32 log-probs,
/// position t holding log p(labels[t + 1]) where that label is kept (0
/// elsewhere), and those shifted labels (B, T) (kIgnoreIndex where none).
std::pair<at::Tensor, at::Tensor> model_token_logps(models::CausalLM& model, const at::Tensor& ids,
                                                    const at::Tensor& labels, bool fused,
                                                    const at::Tensor& token_mask = {});

/// What identifies a reference model for a cache of its log-probs
/// (output_dir/reference_logps.safetensors): its folder and weight files
/// (name, size, time), or without a folder (`path` empty) the seed and config
/// of the initial weights it copies.
std::string reference_identity(const std::string& path, int64_t seed, const models::CausalLM& model);

/// FNV-1a over 64-bit words, byte by byte: a reference log-prob cache's
/// fingerprint of the reference and every token it scored.
class Fingerprint {
 public:
  void mix(uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h_ ^= (x >> (8 * i)) & 0xff;
      h_ *= 1099511628211ull;
    }
  }
  void mix(const std::string& s) {
    for (char c : s) mix(static_cast<uint64_t>(static_cast<uint8_t>(c)));
  }
  void mix(const std::vector<int64_t>& tokens) {
    for (auto t : tokens) mix(static_cast<uint64_t>(t));
  }
  /// 16 hex digits.
  std::string hex() const;

 private:
  uint64_t h_ = 1469598103934665603ull;
};

/// A preference batch: each example's replies are consecutive rows of
/// prompt + reply (right-padded with pad_id).
/// Tensors: input_ids, labels (reply tokens; prompt and padding ignored),
/// replies (E) per example, better / worse / margin / weight (the pairs),
/// dataset / index (E) where each example came from. num_targets = examples.
Batch collate_preferences(const std::vector<const data::PreferenceSample*>& examples,
                          const std::vector<data::SampleRef>& refs, int64_t pad_id);

/// Preference datasets of data.train / data.eval, with eval_fraction splits.
using PreferenceData = MixtureData<data::PreferenceDataset>;
PreferenceData load_preference_data(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                    const chat::ChatTemplate& chat);

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

}  // namespace anvil::train
