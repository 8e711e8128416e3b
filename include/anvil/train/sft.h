#pragma once
// Causal language modelling: supervised fine-tuning (loss on responses, +EOS)
// and pretraining (loss on every token), over a mixture of datasets, packed
// or not.

#include <memory>
#include <string>

#include "anvil/train/objective.h"

namespace anvil::train {

/// Cross-entropy of next-token prediction summed over labels != ignore.
/// logits (B, T, V), labels (B, T) aligned with the inputs.
at::Tensor causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

/// The same sum from the final hidden states (B, T, C): only positions with a
/// target are projected to logits, `chunk` of them at a time, each chunk's
/// logits recomputed in backward instead of kept, so at most (chunk, V)
/// logits exist at once (train.loss_chunk_size). Pass `labels` where the
/// batch has them (on the host): the target positions are found there, with
/// no device sync.
at::Tensor chunked_lm_loss_sum(models::CausalLM& model, const at::Tensor& hidden, const at::Tensor& labels,
                               int64_t chunk);

/// The summed loss of an LM batch (input_ids, labels and, when packed,
/// position_ids + doc_ids for the block-diagonal mask); `chunk` > 0 computes
/// it with chunked_lm_loss_sum.
at::Tensor lm_batch_loss_sum(models::CausalLM& model, const Batch& batch, int64_t chunk = 0);

/// algorithm: sft and algorithm: pretrain: data.train / data.eval as a
/// mixture (packed or not), eval loss and greedy exact match on held-out SFT
/// prompts. A custom objective may hold one and delegate to it
/// (examples/custom_objective).
class LmObjective final : public Objective {
 public:
  LmObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  ~LmObjective() override;
  std::string name() const override;
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
