#pragma once
// Gemma 2 (Gemma Team 2024) and Gemma 3's text model: RMSNorm with (1 + w)
// weights, embeddings scaled by sqrt(hidden), norms before and after both
// attention and the GELU-tanh gated MLP, attention scaled by
// query_pre_attn_scalar^-1/2 with optional tanh soft-capping of scores and of
// the final logits, sliding-window and global layers alternating
// (layer_types). Gemma 3 adds per-head q/k norms and a separate RoPE for its
// sliding layers. Parameter names are HF's Gemma2ForCausalLM /
// Gemma3ForCausalLM names.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "anvil/models/causal_lm.h"
#include "models/hf_keys.h"
#include "models/layers.h"

namespace anvil::models::gemma {

struct GemmaOptions {
  /// gemma2 or gemma3_text.
  TORCH_ARG(std::string, model_type) = "gemma2";
  TORCH_ARG(int64_t, vocab_size) = 256000;
  TORCH_ARG(int64_t, hidden_size) = 2304;
  TORCH_ARG(int64_t, intermediate_size) = 9216;
  TORCH_ARG(int64_t, num_hidden_layers) = 26;
  TORCH_ARG(int64_t, num_attention_heads) = 8;
  TORCH_ARG(int64_t, num_key_value_heads) = 4;
  TORCH_ARG(int64_t, head_dim) = 256;
  TORCH_ARG(int64_t, max_position_embeddings) = 8192;
  TORCH_ARG(double, rms_norm_eps) = 1e-6;
  /// RoPE of the global (full-attention) layers.
  TORCH_ARG(layers::RopeOptions, rope) = {};
  /// RoPE of the sliding layers (Gemma 3's rope_local_base_freq; Gemma 2: the same as `rope`).
  TORCH_ARG(layers::RopeOptions, local_rope) = {};
  TORCH_ARG(bool, attention_bias) = false;
  TORCH_ARG(std::string, hidden_act) = "gelu_pytorch_tanh";
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, initializer_range) = 0.02;
  /// Attention scores are scaled by query_pre_attn_scalar^-1/2 (not head_dim's).
  TORCH_ARG(double, query_pre_attn_scalar) = 256;
  /// cap * tanh(x / cap) of the attention scores / the final logits; 0 = none.
  TORCH_ARG(double, attn_logit_softcapping) = 0.0;
  TORCH_ARG(double, final_logit_softcapping) = 0.0;
  TORCH_ARG(int64_t, sliding_window) = 4096;
  /// Per layer, "sliding_attention" or "full_attention".
  TORCH_ARG(std::vector<std::string>, layer_types) = {};
  /// Gemma 3's q_norm / k_norm.
  TORCH_ARG(bool, qk_norm) = false;
  TORCH_ARG(bool, tie_word_embeddings) = true;
  /// The embedding row of pad_token_id, which gets no gradient (HF's padding_idx); -1 = none.
  TORCH_ARG(int64_t, padding_idx) = -1;

 public:
  bool sliding(int64_t layer) const { return layer_types_.at(static_cast<size_t>(layer)) == "sliding_attention"; }
  /// Gemma2Config's and Gemma3TextConfig's plain keys (models/hf_keys.h), for model_type's; the soft-caps (null
  /// = none), the attention scalar, layer types and rotary settings are read and written beside them.
  template <class V>
  void visit_hf(V& v) {
    const bool g3 = model_type_ == "gemma3_text";
    v.required("vocab_size", vocab_size_);
    v.required("hidden_size", hidden_size_);
    v.required("intermediate_size", intermediate_size_);
    v.required("num_hidden_layers", num_hidden_layers_);
    v.required("num_attention_heads", num_attention_heads_);
    v.key("num_key_value_heads", num_key_value_heads_, num_attention_heads_);
    v.key("head_dim", head_dim_, int64_t{256});
    v.key("max_position_embeddings", max_position_embeddings_, int64_t{g3 ? 131072 : 8192});
    v.key("rms_norm_eps", rms_norm_eps_, 1e-6, HfBound::positive);
    v.key("attention_bias", attention_bias_, false);
    v.key_or("hidden_activation", "hidden_act", hidden_act_, "gelu_pytorch_tanh");
    v.key("attention_dropout", attention_dropout_, 0.0, HfBound::probability);
    v.key("initializer_range", initializer_range_, 0.02);
    v.key("sliding_window", sliding_window_, int64_t{4096});
    v.key("tie_word_embeddings", tie_word_embeddings_, true);
  }
};

/// Gemma's RMSNorm: x / rms(x) * (1 + w) in float32, cast back; w starts at 0.
class GemmaRMSNormImpl : public torch::nn::Module, public ParallelPartialGradient {
 public:
  GemmaRMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(GemmaRMSNorm);

class GemmaAttentionImpl : public torch::nn::Module {
 public:
  GemmaAttentionImpl(const GemmaOptions& o, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  layers::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  GemmaRMSNorm q_norm{nullptr}, k_norm{nullptr};  // Gemma 3
  int64_t n_heads, n_kv_heads, head_dim;
  layers::AttentionOptions attn;
};
TORCH_MODULE(GemmaAttention);

class GemmaMLPImpl : public torch::nn::Module {
 public:
  explicit GemmaMLPImpl(const GemmaOptions& o);
  at::Tensor forward(const at::Tensor& x);
  layers::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  std::string act;
};
TORCH_MODULE(GemmaMLP);

class GemmaDecoderLayerImpl : public torch::nn::Module {
 public:
  GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  GemmaAttention self_attn{nullptr};
  GemmaMLP mlp{nullptr};
  GemmaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr}, pre_feedforward_layernorm{nullptr},
      post_feedforward_layernorm{nullptr};
};
TORCH_MODULE(GemmaDecoderLayer);

class GemmaModelImpl : public torch::nn::Module {
 public:
  explicit GemmaModelImpl(const GemmaOptions& o);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args);
  layers::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  GemmaRMSNorm norm{nullptr};
  at::Tensor inv_freq, local_inv_freq;
  double rope_scale, local_rope_scale;
  std::vector<bool> sliding;
  double embed_scale;
  int64_t max_positions;
};
TORCH_MODULE(GemmaModel);

class GemmaForCausalLM final : public CausalLM {
 public:
  explicit GemmaForCausalLM(const GemmaOptions& o);

  OutputHead output_head() override;
  std::string block_prefix(int64_t i) const override { return "model.layers." + std::to_string(i); }
  std::string family() const override { return options.model_type(); }
  std::optional<ParameterInit> parameter_init(const std::string& name) const override;
  std::vector<std::string> default_lora_targets() const override { return {"q_proj", "v_proj"}; }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t hidden_size() const override { return options.hidden_size(); }
  int64_t max_positions() const override { return options.max_position_embeddings(); }
  int64_t num_layers() const override { return options.num_hidden_layers(); }
  double final_logit_softcap() const override { return options.final_logit_softcapping(); }
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;
  std::vector<std::string> lm_head_parameters() const override {
    return options.tie_word_embeddings() ? std::vector<std::string>{} : std::vector<std::string>{"lm_head.weight"};
  }

  /// HF's init: N(0, initializer_range) for linear and embedding weights, zero
  /// biases and zero norm weights (the norms multiply by 1 + w).

  GemmaOptions options;
  GemmaModel model{nullptr};
  layers::Dense lm_head{nullptr};  // null when tied

 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "model.embed_tokens.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }
};

}  // namespace anvil::models::gemma
