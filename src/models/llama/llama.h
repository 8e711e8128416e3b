#pragma once
// LLaMA (Touvron et al. 2023) and its descendants (LLaMA 2/3, TinyLlama):
// RMSNorm, rotary positions (optionally LLaMA-3 scaled), SwiGLU MLP,
// grouped-query attention. Qwen2 / Qwen2.5, Qwen3, Mistral, Phi-3 and the
// mixture-of-experts Mixtral and Qwen3-MoE are options of the same code, a
// row each of LlamaVariant. Parameter names are HF's (LlamaForCausalLM,
// Qwen2ForCausalLM, ..., MixtralForCausalLM, Qwen3MoeForCausalLM).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "anvil/models/causal_lm.h"
#include "models/hf_keys.h"
#include "models/layers.h"
#include "models/moe.h"

namespace anvil::models::llama {

struct LlamaVariant;

struct LlamaOptions {
  TORCH_ARG(int64_t, vocab_size) = 32000;
  TORCH_ARG(int64_t, hidden_size) = 4096;
  TORCH_ARG(int64_t, intermediate_size) = 11008;
  TORCH_ARG(int64_t, num_hidden_layers) = 32;
  TORCH_ARG(int64_t, num_attention_heads) = 32;
  /// Key/value heads (grouped-query attention); must divide num_attention_heads.
  TORCH_ARG(int64_t, num_key_value_heads) = 32;
  /// 0 = hidden_size / num_attention_heads.
  TORCH_ARG(int64_t, head_dim) = 0;
  TORCH_ARG(int64_t, max_position_embeddings) = 2048;
  TORCH_ARG(double, rms_norm_eps) = 1e-6;
  /// theta, type (default | llama3 | longrope) and scaling; head and rotary
  /// dims are filled in from head_dim and partial_rotary_factor.
  TORCH_ARG(layers::RopeOptions, rope) = {};
  TORCH_ARG(bool, attention_bias) = false;
  TORCH_ARG(bool, mlp_bias) = false;
  TORCH_ARG(bool, tie_word_embeddings) = false;
  TORCH_ARG(std::string, hidden_act) = "silu";
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, initializer_range) = 0.02;
  /// The HF model_type this model is saved as, a row of variants() (llama,
  /// qwen2, qwen3, mistral, phi3, mixtral, qwen3_moe), which sets the options
  /// below that tell the variants apart.
  TORCH_ARG(std::string, model_type) = "llama";
  /// Biases on q_proj, k_proj and v_proj only (Qwen2's); attention_bias puts
  /// them on o_proj too.
  TORCH_ARG(bool, qkv_bias) = false;
  /// q_norm / k_norm: RMSNorm(head_dim) of each query and key head (Qwen3's).
  TORCH_ARG(bool, qk_norm) = false;
  /// Sliding-window attention: a query sees the `sliding_window` latest
  /// positions up to its own (Mistral, Phi-3, Qwen with use_sliding_window);
  /// 0 = full attention.
  TORCH_ARG(int64_t, sliding_window) = 0;
  /// Per layer, "sliding_attention" or "full_attention" (HF layer_types);
  /// empty = every layer slides when sliding_window > 0.
  TORCH_ARG(std::vector<std::string>, layer_types) = {};
  /// Phi-3's fused projections: qkv_proj (q, k, v rows in that order) in place
  /// of q/k/v_proj and gate_up_proj (gate rows, then up rows) in place of
  /// gate_proj / up_proj.
  TORCH_ARG(bool, fused_projections) = false;
  /// Fraction of each head's leading dims that rotate (Phi-3 / Phi-4-mini's
  /// partial_rotary_factor); the rest pass through.
  TORCH_ARG(double, partial_rotary_factor) = 1.0;
  /// The embedding row of pad_token_id, which gets no gradient (HF's
  /// nn.Embedding padding_idx, set from an HF config's pad_token_id); -1 = none.
  TORCH_ARG(int64_t, padding_idx) = -1;
  /// Dropout on the attention and MLP outputs before each residual add (Phi-3 resid_pdrop).
  TORCH_ARG(double, residual_dropout) = 0.0;
  /// Mixture of experts (mixtral, qwen3_moe): experts per sparse layer; 0 = dense.
  TORCH_ARG(int64_t, num_experts) = 0;
  TORCH_ARG(int64_t, num_experts_per_tok) = 2;
  /// Each expert's width; 0 = intermediate_size (Mixtral). Qwen3-MoE's dense
  /// layers keep intermediate_size.
  TORCH_ARG(int64_t, moe_intermediate_size) = 0;
  TORCH_ARG(bool, norm_topk_prob) = true;
  TORCH_ARG(double, router_jitter_noise) = 0.0;
  /// Qwen3-MoE: layers with a dense MLP, and every decoder_sparse_step-th layer sparse.
  TORCH_ARG(std::vector<int64_t>, mlp_only_layers) = {};
  TORCH_ARG(int64_t, decoder_sparse_step) = 1;
  /// config.json's load-balancing loss settings, written back on export.
  TORCH_ARG(double, router_aux_loss_coef) = 0.001;
  TORCH_ARG(bool, output_router_logits) = false;

 public:
  int64_t dim_per_head() const { return head_dim_ > 0 ? head_dim_ : hidden_size_ / num_attention_heads_; }
  /// The window of layer `i` (0 = full attention).
  int64_t window_of(int64_t i) const {
    if (sliding_window_ <= 0) return 0;
    if (layer_types_.empty()) return sliding_window_;
    return layer_types_.at(static_cast<size_t>(i)) == "sliding_attention" ? sliding_window_ : 0;
  }
  /// Whether layer `i` has a mixture of experts in place of its MLP (transformers' rule).
  bool sparse_layer(int64_t i) const {
    if (num_experts_ <= 0) return false;
    for (auto l : mlp_only_layers_)
      if (l == i) return false;
    return (i + 1) % decoder_sparse_step_ == 0;
  }
  /// The plain config.json keys of `row`'s HF config class (models/hf_keys.h), below LlamaVariant.
  template <class V>
  void visit_hf(V& v, const LlamaVariant& row);
};

/// What tells one LLaMA-like HF architecture from another: a row per
/// model_type (llama/variants.cpp). A new variant is a new row there and a
/// line in models/registry.cpp; nothing else compares model_type strings.
struct LlamaVariant {
  /// How config.json's sliding-window keys are read and written.
  enum class Windows {
    kNone,        // no window (LLaMA)
    kEveryLayer,  // sliding_window on every layer; null = none (Mistral, Mixtral, Phi-3)
    kQwenLayers,  // only with use_sliding_window, on the layers layer_types / max_window_layers name (Qwen)
  };
  /// Whose mixture-of-experts keys and parameter names.
  enum class Experts {
    kNone,
    kMixtral,   // num_local_experts, router_jitter_noise; block_sparse_moe.experts.N.w1/w2/w3
    kQwen3Moe,  // num_experts, moe_intermediate_size, mlp_only_layers, ...; mlp.experts.N.gate/up/down_proj
  };
  const char* model_type;           // "qwen2"
  const char* architecture;         // "Qwen2ForCausalLM"
  const char* display_name;         // "Qwen2", in messages
  bool qkv_bias = false;            // biases on q, k and v, none on o_proj (Qwen2)
  bool qk_norm = false;             // RMSNorm over each head of q and k (Qwen3)
  bool fused_projections = false;   // qkv_proj and gate_up_proj (Phi-3)
  bool partial_rotary = false;      // reads and writes partial_rotary_factor (Phi-3)
  bool residual_dropout = false;    // resid_pdrop (Phi-3)
  bool attention_bias_key = false;  // reads and writes attention_bias (LLaMA, Qwen3)
  bool mlp_bias_key = false;        // reads mlp_bias, writes it and pretraining_tp (LLaMA)
  bool head_dim_key = true;         // reads and writes head_dim (all but Qwen2)
  int64_t head_dim_default = 0;     // when head_dim is absent; 0 = hidden_size / heads (Qwen3Config: 128)
  double rms_norm_eps_default = 1e-6;
  Windows windows = Windows::kNone;
  int64_t window_default = 0;                  // sliding_window when the key is absent
  int64_t original_max_positions_default = 0;  // > 0: reads original_max_position_embeddings (Phi-3: 4096)
  Experts experts = Experts::kNone;
};
/// The row's keys: which of them its config.json holds, their defaults and
/// names come from the row; rotary settings, sliding windows (null = none),
/// original_max_position_embeddings, mlp_only_layers and special tokens are
/// read and written beside them (llama/register.cpp, LlamaForCausalLM::hf_config).
template <class V>
void LlamaOptions::visit_hf(V& v, const LlamaVariant& row) {
  v.required("vocab_size", vocab_size_);
  v.required("hidden_size", hidden_size_);
  v.required("intermediate_size", intermediate_size_);
  v.required("num_hidden_layers", num_hidden_layers_);
  v.required("num_attention_heads", num_attention_heads_);
  v.key("num_key_value_heads", num_key_value_heads_, num_attention_heads_);
  if (row.head_dim_key) v.key("head_dim", head_dim_, row.head_dim_default);
  v.key("max_position_embeddings", max_position_embeddings_, int64_t{2048});
  v.key("rms_norm_eps", rms_norm_eps_, row.rms_norm_eps_default, HfBound::positive);
  if (row.attention_bias_key) v.key("attention_bias", attention_bias_, false);
  if (row.mlp_bias_key) {
    v.key("mlp_bias", mlp_bias_, false);
    v.constant("pretraining_tp", 1);
  }
  v.key("tie_word_embeddings", tie_word_embeddings_, false);
  v.key("hidden_act", hidden_act_, "silu");
  v.key("attention_dropout", attention_dropout_, 0.0, HfBound::probability);
  v.key("initializer_range", initializer_range_, 0.02);
  if (row.residual_dropout) {
    v.key("resid_pdrop", residual_dropout_, 0.0, HfBound::probability);
    v.constant("embd_pdrop", 0.0);
  }
  if (row.experts == LlamaVariant::Experts::kNone) return;
  const bool mixtral = row.experts == LlamaVariant::Experts::kMixtral;
  // Qwen3MoeConfig writes num_local_experts since transformers 5; the Hub's folders say num_experts.
  if (mixtral)
    v.key("num_local_experts", num_experts_, int64_t{8});
  else
    v.key_or("num_experts", "num_local_experts", num_experts_, int64_t{128});
  v.key("num_experts_per_tok", num_experts_per_tok_, int64_t{mixtral ? 2 : 8});
  v.key("router_aux_loss_coef", router_aux_loss_coef_, 0.001);
  v.key("output_router_logits", output_router_logits_, false);
  if (mixtral) {
    v.key("router_jitter_noise", router_jitter_noise_, 0.0, HfBound::probability);
    return;
  }
  v.key("moe_intermediate_size", moe_intermediate_size_, int64_t{768});
  v.key("norm_topk_prob", norm_topk_prob_, false);
  v.key("decoder_sparse_step", decoder_sparse_step_, int64_t{1});
}

/// The row of `model_type`; throws for one that is not a LLaMA variant.
const LlamaVariant& variant(const std::string& model_type);
/// Every row, in registration order.
const std::vector<LlamaVariant>& variants();

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaOptions& o, int64_t layer);
  /// x (B, T, C); cos/sin (B, 1, T, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  layers::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  layers::Linear qkv_proj{nullptr};                  // fused_projections only (then q/k/v_proj are null)
  layers::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only
  int64_t n_heads, n_kv_heads, head_dim;
  double dropout;
  int64_t window;  // this layer's sliding window, 0 = full attention
};
TORCH_MODULE(LlamaAttention);

/// down(act(gate(x)) * up(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x);
  layers::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  layers::Linear gate_up_proj{nullptr};  // fused_projections only (then gate/up_proj are null)
  std::string act;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaOptions& o, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};             // null in a sparse layer
  moe::SparseMoeBlock moe{nullptr};  // sparse layers: "block_sparse_moe" (Mixtral) or "mlp" (Qwen3-MoE)
  layers::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  double residual_dropout;
};
TORCH_MODULE(LlamaDecoderLayer);

/// HF's `model` submodule.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args);  // (B, T, C)
  layers::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  layers::RMSNorm norm{nullptr};
  at::Tensor inv_freq;       // (rotary_dim / 2), not a parameter
  at::Tensor long_inv_freq;  // longrope: beyond original_max_positions; else undefined
  layers::RopeOptions rope;
  int64_t max_positions;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLM final : public CausalLM {
 public:
  explicit LlamaForCausalLM(const LlamaOptions& o);

  OutputHead output_head() override;
  std::string block_prefix(int64_t i) const override { return "model.layers." + std::to_string(i); }
  std::string family() const override { return options.model_type(); }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t hidden_size() const override { return options.hidden_size(); }
  int64_t max_positions() const override { return options.max_position_embeddings(); }
  int64_t num_layers() const override { return options.num_hidden_layers(); }
  int64_t num_experts() const override { return options.num_experts(); }
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;
  int64_t cache_recompute_length() const override {
    return options.rope().type() == "longrope" ? options.rope().original_max_positions() : 0;
  }
  /// HF's init: N(0, initializer_range) for linear and embedding weights
  /// (the padding row zero), zero biases, unit RMSNorm weights.
  std::optional<ParameterInit> parameter_init(const std::string& name) const override;
  std::vector<std::string> default_lora_targets() const override {
    if (options.fused_projections()) return {"qkv_proj"};
    return {"q_proj", "v_proj"};
  }
  std::vector<std::string> lm_head_parameters() const override {
    return options.tie_word_embeddings() ? std::vector<std::string>{} : std::vector<std::string>{"lm_head.weight"};
  }

  LlamaOptions options;
  LlamaModel model{nullptr};
  layers::Dense lm_head{nullptr};  // null when tied to model.embed_tokens
 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "model.embed_tokens.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }
};

}  // namespace anvil::models::llama
