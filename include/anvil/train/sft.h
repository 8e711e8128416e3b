#pragma once
// Causal language modelling: supervised fine-tuning (loss on responses, +EOS)
// and pretraining (loss on every token), over a mixture of datasets, packed
// or not.

#include <memory>
#include <string>

#include "anvil/train/objective.h"

namespace anvil::train {

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

/// The run's sft section (its defaults when the config sets none).
inline const SftConfig& sft_config(const config::RunConfig& cfg) { return cfg.extensions.get<SftConfig>("sft"); }

/// Cross-entropy of next-token prediction summed over labels != ignore.
/// logits (B, T, V), labels (B, T) aligned with the inputs.
at::Tensor causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

/// The same sum from the final hidden states (B, T, C), with the LM head and
/// the loss fused (train.fused_loss): only positions with a target are
/// projected, `chunk` rows at a time (0 = automatic), and the gradients of the
/// hidden states and of the head are taken in the same pass, so no chunk's
/// logits outlive it. Pass `labels` where the batch has them (on the host):
/// the target positions are found there, with no device sync.
at::Tensor fused_lm_loss_sum(models::CausalLM& model, const at::Tensor& hidden, const at::Tensor& labels,
                             int64_t chunk = 0);

/// How an LM batch's loss is computed (train.fused_loss, train.loss_chunk_size).
struct LmLossOptions {
  bool fused = true;
  int64_t chunk = 0;
  /// dist.context_parallel (RunContext::context_comm): each rank of the group
  /// runs its share of every row's positions and returns its share of the sum.
  std::shared_ptr<distributed::Communicator> context;
  /// dist.context_parallel_mode: ring: attention passes the group's keys and
  /// values around it instead of gathering them (same result).
  bool context_ring = false;
};

/// The summed loss of an LM batch (input_ids, labels and, when packed,
/// position_ids + doc_ids for the block-diagonal mask). Under context
/// parallelism (o.context) this rank's share of it: rows are padded to a
/// multiple of 2 x the group's size and cut (distributed/context_parallel.h).
at::Tensor lm_batch_loss_sum(models::CausalLM& model, const Batch& batch, const LmLossOptions& o = {});

/// What an LmObjective trains on. sft: prompt + response samples (JSONL, or
/// token shards), greedy generations stopping at the chat format's end of
/// turn; pretrain: token shards only (prepared, Megatron or MDS).
enum class LmTask { sft, pretrain };

/// algorithm: sft and algorithm: pretrain: data.train / data.eval as a
/// mixture (packed or not), eval loss and greedy exact match on held-out SFT
/// prompts. The task comes from the registration, not from cfg.algorithm, so
/// a custom objective may hold one under its own algorithm name and delegate
/// to it (examples/custom_objective).
class LmObjective final : public Objective {
 public:
  /// `chat`: the run's chat format (ObjectiveFactory), which renders the
  /// SFT data and whose end of turn stops greedy evaluation.
  LmObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat,
              LmTask task = LmTask::sft);
  ~LmObjective() override;
  std::string name() const override;
  void prepare(models::CausalLM& model, const RunContext& ctx) override;
  bool prepare_reads_weights() const override { return false; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override;
  /// Read late (no after_step), and replayable: its batches' tensors on the
  /// device take no host decision (packed rows attend through their mask there).
  StepNeeds step_needs() const override { return {StepReads::late, /*replayable=*/true}; }
  /// Yes: a row's loss is its own target tokens' (packed documents stay within their row).
  bool splits_rows() const override { return true; }
  std::vector<Batch> split_rows(const Batch& batch, int64_t parts) const override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace anvil::train
