#pragma once
// Tensor parallelism as the model's layers see it (Shoeybi et al. 2019,
// Megatron-LM): a block's linear layer may hold a share of its weight, cut
// from outside the model (distributed/tensor_parallel.h) as sharding is.
//
//   column-parallel  the layer's output features are split: rank t holds
//                    rows t*n/tp .. (t+1)*n/tp of each fused part of the
//                    weight (and bias); its input is the whole activation
//                    (identity forward, gradient summed over the group).
//   row-parallel     the input features are split: rank t holds those
//                    columns; the partial products are summed over the
//                    group (all-reduce forward, identity backward), then the
//                    whole bias is added once.
//
// A column-parallel projection feeding a row-parallel one (q/k/v -> o,
// gate/up -> down) needs no collective between them: a rank's heads or MLP
// features stay local, and the family's forward reads its head counts from
// the local tensor. What the plan does not name (norms, embeddings, the LM
// head, MoE experts) stays whole on every rank.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace anvil::models {

class CausalLM;

/// The collectives of a tensor-parallel group of ranks, as a layer calls them.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  /// A column-parallel layer's input: identity forward, gradient summed
  /// over the group backward (Megatron's copy_to_tensor_model_parallel_region).
  virtual at::Tensor enter(const at::Tensor& x) const = 0;
  /// A row-parallel layer's partial output: summed over the group forward,
  /// identity backward (reduce_from_tensor_model_parallel_region).
  virtual at::Tensor reduce(const at::Tensor& y) const = 0;
  /// A weight whole on every rank that sees only the rank's share of the
  /// activations: identity forward, gradient summed over the group.
  virtual at::Tensor sum_gradient(const at::Tensor& w) const = 0;

  // Sequence parallelism (Korthikanti et al. 2022): inside a SequenceScope
  // the activations between a row-parallel and the next column-parallel
  // layer are (B, P, C), this rank's P = ceil(T / size) positions of the
  // rows' T (the last rank's tail padded with zeros). enter() then
  // all-gathers them along the sequence (backward: reduce-scatter) and
  // reduce() reduce-scatters (backward: all-gather).

  /// Inside a SequenceScope, a column-parallel layer on (B, P, C) input
  /// `x`: linear(all-gather of x, w, b) (w (out, in) when `output_dim` is 0,
  /// Conv1D's (in, out) when 1), keeping only x for the backward, which
  /// gathers it again for w's gradient and reduce-scatters x's (Megatron's
  /// column-parallel linear under sequence_parallel).
  virtual at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                     int64_t output_dim) const = 0;
  /// Vocabulary parallelism: (..., V / size) logits of this rank's
  /// vocabulary rows -> (..., V) every rank's, in rank order; the backward
  /// keeps this rank's columns (what follows runs alike on every rank).
  virtual at::Tensor gather_columns(const at::Tensor& x) const = 0;
  /// The summed cross entropy of hidden states h (N, C) against `targets`
  /// (N, global ids; `ignore_index` counts 0) for an LM head whose rows w
  /// (V / size, C) and bias b (or undefined) are this rank's share of the
  /// vocabulary: a float32 scalar, the same on every rank. `chunk` rows at a
  /// time (<= 0: all), each chunk's row maxima, sums of exponentials and
  /// target logits reduced over the group; no logits are kept for the
  /// backward (recomputed there, a chunk at a time), and h's gradient is
  /// summed over the group.
  virtual at::Tensor vocab_parallel_loss_sum(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b,
                                             const at::Tensor& targets, int64_t chunk, int64_t ignore_index) const = 0;
  /// (B, T, C) the same on every rank -> (B, P, C) this rank's positions;
  /// backward all-gathers the gradient (Megatron's scatter_to_sequence_parallel_region).
  virtual at::Tensor scatter_sequence(const at::Tensor& x, int64_t length) const = 0;
  /// (B, P, C) -> (B, T, C) the whole rows; the backward keeps this rank's
  /// positions of the gradient, which must be the same on every rank (what
  /// follows runs alike on every rank of the group).
  virtual at::Tensor gather_sequence(const at::Tensor& x, int64_t length) const = 0;
};

/// While alive on a thread, the tensor-parallel layers' activations there are
/// split along the sequence (rows of `length` positions): the blocks of a
/// forward with ForwardArgs::sequence run inside one (layers::run_block,
/// and again when activation checkpointing recomputes them). It remembers
/// the last input gathered, so q, k and v (or gate and up) share one
/// gather in the forward.
class SequenceScope {
 public:
  explicit SequenceScope(int64_t length);
  ~SequenceScope();
  SequenceScope(const SequenceScope&) = delete;
  SequenceScope& operator=(const SequenceScope&) = delete;
  /// The innermost scope of this thread, or null.
  static SequenceScope* current();
  int64_t length() const { return length_; }
  /// `gathered` for `x` when x was the last input gathered, else undefined.
  at::Tensor remembered(const at::Tensor& x) const;
  void remember(const at::Tensor& x, const at::Tensor& gathered);

 private:
  int64_t length_;
  SequenceScope* outer_;
  at::Tensor input_, gathered_;
  int64_t version_ = 0;
};

/// kPartialGradient: a weight that stays whole on every rank but sees only
/// the rank's share of the activations (Qwen3's and Gemma 3's per-head q/k
/// norms): its gradient is summed over the group.
enum class ParallelStyle { kReplicated, kColumn, kRow, kPartialGradient };

/// A linear layer of a transformer block that tensor parallelism can split
/// (layers::Linear, gpt2::Conv1D).
class ParallelLinear {
 public:
  virtual ~ParallelLinear() = default;
  /// The weight's dimension of output features: 0 for (out, in), 1 for
  /// Conv1D's (in, out).
  virtual int64_t output_dim() const = 0;

  ParallelStyle parallel_style() const { return tp_group_ ? style_ : ParallelStyle::kReplicated; }
  const TensorParallelGroup* parallel_group() const { return tp_group_.get(); }
  /// Installed by distributed::apply_tensor_parallel once the weight is cut.
  void set_parallel(std::shared_ptr<const TensorParallelGroup> group, ParallelStyle style) {
    tp_group_ = std::move(group);
    style_ = style;
  }

 protected:
  /// The layer's output from `linear(input, bias)` (the local product of
  /// `weight`, with the bias when given): the group's collectives around it
  /// as the style says; without a group, linear(x, bias).
  template <class Linear>
  at::Tensor parallel_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              Linear&& linear) const {
    switch (parallel_style()) {
      case ParallelStyle::kColumn:
        if (SequenceScope::current()) return tp_group_->gathered_linear(x, weight, bias, output_dim());
        return linear(tp_group_->enter(x), bias);
      case ParallelStyle::kRow: {
        auto y = tp_group_->reduce(linear(x, at::Tensor()));
        if (!bias.defined()) return y;
        // Under sequence parallelism the bias meets only this rank's positions.
        return y + (SequenceScope::current() ? tp_group_->sum_gradient(bias) : bias);
      }
      default:
        return linear(x, bias);
    }
  }

 private:
  std::shared_ptr<const TensorParallelGroup> tp_group_;
  ParallelStyle style_ = ParallelStyle::kReplicated;
};

/// A norm whose weights stay whole on every rank of a group while the rank
/// sees a share of the activations (layers::RMSNorm, layers::LayerNorm,
/// Gemma's RMSNorm): its weights pass through the group's sum_gradient().
/// Always for a kPartialGradient layer (a share of the heads); with
/// `sequence_only`, inside a SequenceScope only (a block's norms under
/// sequence parallelism: a share of the positions).
class ParallelPartialGradient {
 public:
  virtual ~ParallelPartialGradient() = default;
  void set_parallel(std::shared_ptr<const TensorParallelGroup> group, bool sequence_only = false) {
    tp_group_ = std::move(group);
    sequence_only_ = sequence_only;
  }
  bool has_parallel_group() const { return tp_group_ != nullptr; }

 protected:
  at::Tensor parallel_weight(const at::Tensor& w) const {
    if (!tp_group_ || !w.defined() || (sequence_only_ && !SequenceScope::current())) return w;
    return tp_group_->sum_gradient(w);
  }

 private:
  std::shared_ptr<const TensorParallelGroup> tp_group_;
  bool sequence_only_ = false;
};

/// Where a family's block layer splits: `name` below the block's prefix
/// ("self_attn.q_proj"), its style, and for a column-parallel layer the
/// sizes of its fused parts along the output features (each split on its
/// own: Phi-3's qkv_proj is q, k, v; GPT-2's c_attn three of n_embd; one
/// part otherwise) and the granule each part splits in (a head's width for
/// attention projections: whole heads per rank). A row-parallel layer's
/// input features split in `granule`s as one part.
struct ParallelRule {
  std::string name;
  ParallelStyle style = ParallelStyle::kReplicated;
  std::vector<int64_t> parts;
  int64_t granule = 1;
  /// What a granule is, for refusals ("key/value heads").
  std::string unit;
};

/// The rules of `model`'s family (every family Anvil has; MoE experts stay
/// whole). Throws ConfigError for a family without a plan.
std::vector<ParallelRule> tensor_parallel_plan(const CausalLM& model);

}  // namespace anvil::models
