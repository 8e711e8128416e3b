#pragma once
// Building blocks shared by the families: RMSNorm, rotary embeddings (with
// partial rotary and LLaMA-3 frequency scaling), activations and attention
// over a KV cache with grouped-query heads. Numerics follow Hugging Face's
// implementations so logits match transformers to float32 round-off.

#include <torch/nn/module.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/options/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>

#include <vector>

#include "anvil/models/causal_lm.h"
#include "models/lora.h"
#include "models/tensor_parallel.h"

namespace anvil::models::layers {

struct RMSNormOptions {
  RMSNormOptions(int64_t dim) : dim_(dim) {}  // NOLINT: implicit like torch's options
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(double, eps) = 1e-6;
};

/// y = w * x / sqrt(mean(x^2) + eps), computed in float32 (LlamaRMSNorm).
class RMSNormImpl : public torch::nn::Module, public ParallelPartialGradient {
 public:
  explicit RMSNormImpl(const RMSNormOptions& o);
  at::Tensor forward(const at::Tensor& x);
  RMSNormOptions options;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

/// A parameter tensor of `shape` (float32): inside a DeferredInitGuard
/// (models/init.h) one without storage on the guard's device, else
/// uninitialised CPU memory.
at::Tensor new_parameter(at::IntArrayRef shape);

/// torch::nn::Linear's parameters, options, initialisation (the same draws,
/// so the same weights from the same seed) and forward, but built without
/// storage inside a DeferredInitGuard. No LoRA adapter: LM heads, routers.
class DenseImpl : public torch::nn::Module {
 public:
  explicit DenseImpl(const torch::nn::LinearOptions& o);
  DenseImpl(int64_t in, int64_t out) : DenseImpl(torch::nn::LinearOptions(in, out)) {}
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }
  torch::nn::LinearOptions options;
  at::Tensor weight, bias;
};
TORCH_MODULE(Dense);

/// Dense that can carry a LoRA adapter (models/lora.h) and be split by
/// tensor parallelism (models/tensor_parallel.h).
class LinearImpl : public DenseImpl, public LoraLayer, public ParallelLinear {
 public:
  using DenseImpl::DenseImpl;
  at::Tensor forward(const at::Tensor& x) {
    auto y = parallel_forward(x, weight, bias,
                              [&](const at::Tensor& in, const at::Tensor& b) { return at::linear(in, weight, b); });
    return with_adapter(x, y, is_training());
  }
  int64_t in_features() const override { return options.in_features(); }
  int64_t out_features() const override { return options.out_features(); }
  int64_t output_dim() const override { return 0; }
  void add_to_weight(const at::Tensor& delta_out_in) override;
};
TORCH_MODULE(Linear);

/// torch::nn::Embedding (N(0, 1) rows, a zero padding row), deferrable as Dense.
class EmbeddingImpl : public torch::nn::Module {
 public:
  explicit EmbeddingImpl(const torch::nn::EmbeddingOptions& o);
  EmbeddingImpl(int64_t n, int64_t dim) : EmbeddingImpl(torch::nn::EmbeddingOptions(n, dim)) {}
  at::Tensor forward(const at::Tensor& ids);
  /// Vocabulary parallelism (installed by distributed::apply_tensor_parallel
  /// once the weight holds rows [first, first + rows)): an id of another
  /// rank's rows looks up zeros, and the rows are summed over the group
  /// (Megatron's VocabParallelEmbedding).
  void set_vocab_parallel(std::shared_ptr<const TensorParallelGroup> group, int64_t first) {
    vocab_group_ = std::move(group);
    first_row_ = first;
  }
  torch::nn::EmbeddingOptions options;
  at::Tensor weight;

 private:
  std::shared_ptr<const TensorParallelGroup> vocab_group_;
  int64_t first_row_ = 0;
};
TORCH_MODULE(Embedding);

/// torch::nn::LayerNorm (unit weight, zero bias), deferrable as Dense.
class LayerNormImpl : public torch::nn::Module, public ParallelPartialGradient {
 public:
  explicit LayerNormImpl(const torch::nn::LayerNormOptions& o);
  at::Tensor forward(const at::Tensor& x);
  /// weight and bias as the forward reads them (models/tensor_parallel.h).
  at::Tensor weight_for_forward() const { return parallel_weight(weight); }
  at::Tensor bias_for_forward() const { return parallel_weight(bias); }
  torch::nn::LayerNormOptions options;
  at::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm);

/// Rotary position embedding parameters, as HF's `rope_parameters`.
struct RopeOptions {
  TORCH_ARG(int64_t, head_dim) = 64;
  /// Leading dims of each head that rotate (GPT-NeoX rotary_pct * head_dim).
  TORCH_ARG(int64_t, rotary_dim) = 64;
  TORCH_ARG(double, theta) = 10000.0;
  /// "default", "linear" (inverse frequencies / factor; Gemma 3's global
  /// layers), "llama3" or "longrope" (Phi-3).
  TORCH_ARG(std::string, type) = "default";
  // llama3 scaling.
  TORCH_ARG(double, factor) = 8.0;
  TORCH_ARG(double, low_freq_factor) = 1.0;
  TORCH_ARG(double, high_freq_factor) = 4.0;
  /// llama3, longrope: the context length of pretraining.
  TORCH_ARG(int64_t, original_max_positions) = 8192;
  /// longrope: per-frequency divisors (rotary_dim / 2 each) of sequences up to
  /// original_max_positions (short) and longer ones (long), and the factor
  /// cos and sin are multiplied by (HF attention_factor).
  TORCH_ARG(std::vector<double>, short_factor) = {};
  TORCH_ARG(std::vector<double>, long_factor) = {};
  TORCH_ARG(double, attention_factor) = 1.0;
};

/// Inverse frequencies (rotary_dim / 2), float32, scaled per the rope type;
/// for longrope, those of sequences longer than original_max_positions when
/// `long_context`.
at::Tensor rope_inv_freq(const RopeOptions& o, bool long_context = false);

/// cos, sin of shape (B, 1, T, rotary_dim) for (B, T) positions (B may be 1),
/// multiplied by `scale` (longrope's attention factor); inv_freq must be on the
/// positions' device.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                                               at::ScalarType dtype, double scale = 1.0);

/// Rotates the first rotary_dim features of x (B, H, T, D) in place of HF's
/// apply_rotary_pos_emb (rotate_half convention): kernels::rope while
/// kernels::fused_ops() (train.fused_kernels), else ATen's composition.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// The LM head's product hidden (..., C) x weight (V, C)^T (+ bias) -> (..., V).
/// With `pad_to` > 1 and V not a multiple of it, the weight is zero-padded to
/// the next multiple for the GEMM and the result narrowed back to V columns:
/// an odd vocabulary (GPT-2's 50,257) otherwise leaves the logits' rows
/// unaligned, and cuBLAS then runs its slow unaligned kernels for the forward
/// and both backward products. Nothing outside the call sees the padding.
at::Tensor vocab_projection(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias = {},
                            int64_t pad_to = 1);
/// vocab_projection with the padding where it pays: 64 on CUDA while
/// gradients are recorded (training steps), none elsewhere (the CPU, decoding).
at::Tensor lm_head(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias = {});

/// HF activation by its config name: gelu, gelu_new, gelu_pytorch_tanh, silu, relu.
at::Tensor activation(const at::Tensor& x, const std::string& name);
bool is_supported_activation(const std::string& name);
/// ln(x): kernels::layer_norm (Anvil's backward kernel on CUDA) while
/// kernels::fused_ops() and the module has a weight, else the module's own
/// forward.
at::Tensor layer_norm(const LayerNorm& ln, const at::Tensor& x);
/// activation(gate, name) * up, the gated MLP of LLaMA-style families:
/// kernels::glu for silu and GELU's tanh approximation while
/// kernels::fused_ops(), else ATen's composition.
at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, const std::string& name);

/// (B, T, H * d) -> (B, T, H, d), H read from the tensor (under tensor
/// parallelism a rank holds a share of a layer's heads).
inline at::Tensor split_heads(const at::Tensor& x, int64_t d) {
  return x.view({x.size(0), x.size(1), x.size(-1) / d, d});
}

/// Positions for `args`: args.position_ids (B, T), or past .. past + T - 1 as
/// (1, T), which broadcasts over the batch.
at::Tensor positions(const ForwardArgs& args, int64_t batch, int64_t seq, const at::Device& device);

/// How attention() attends, beyond causal attention over every cached slot.
struct AttentionOptions {
  double dropout = 0.0;
  /// W > 0: a query sees only the W latest slots up to its own (Mistral's
  /// window: key slot j with i - W < j <= i for query slot i, as
  /// transformers' sliding-window mask), on top of args.attention_mask.
  int64_t sliding_window = 0;
  /// Scores are q . k times this; 0 = 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar^-1/2).
  double scale = 0.0;
  /// cap > 0: scores become cap * tanh(scores / cap) before the mask (Gemma 2);
  /// computed by matmul and softmax in float32, as transformers' eager attention.
  double softcap = 0.0;
};

/// The block-diagonal causal mask of packed rows: doc_ids (B, T) int64 ->
/// (B, 1, T, T) bool, true where query i may attend key j (same document,
/// j <= i). With `query_slots` (T_q) the rows of those positions only,
/// (B, 1, T_q, T): a context-parallel share's queries over the whole row.
at::Tensor document_causal_mask(const at::Tensor& doc_ids, const at::Tensor& query_slots = {});

/// Scaled dot-product attention of new queries q (B, Hq, T, D) over the
/// cached and new keys/values k, v (B, Hkv, T, D) with Hkv dividing Hq; stores
/// k, v in args.cache (layer `layer`). Returns (B, T, Hq * D). Packed rows
/// (args.documents) without a cache go through flash attention with their
/// cumulative lengths when it can take them (CUDA, 16-bit, head size a
/// multiple of 8 up to 256, no soft-capping), else through their mask.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ForwardArgs& args,
                     size_t layer, const AttentionOptions& o);
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ForwardArgs& args,
                            size_t layer, double dropout_p, int64_t sliding_window = 0) {
  AttentionOptions o;
  o.dropout = dropout_p;
  o.sliding_window = sliding_window;
  return attention(q, k, v, args, layer, o);
}

/// Calls `block(x)` through the runner installed in `args`, if any.
/// Under ForwardArgs::sequence, block 0's input is cut to this rank's
/// positions first, the block runs inside a SequenceScope, and the last
/// block's output is gathered whole again.
at::Tensor run_block(const ForwardArgs& args, size_t layer, const at::Tensor& x, const BlockFn& block);

}  // namespace anvil::models::layers
