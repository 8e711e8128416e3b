#pragma once
// LLaMA (Touvron et al. 2023) and its descendants (LLaMA 2/3, TinyLlama,
// Mistral-style GQA): RMSNorm, rotary positions (optionally LLaMA-3 scaled),
// SwiGLU MLP, grouped-query attention. Parameter names are HF's
// LlamaForCausalLM names.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "anvil/models/causal_lm.h"
#include "anvil/models/layers.h"

namespace anvil::models::llama {

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
  /// theta, type (default | llama3) and scaling; head/rotary dims are filled in.
  TORCH_ARG(layers::RopeOptions, rope) = {};
  TORCH_ARG(bool, attention_bias) = false;
  TORCH_ARG(bool, mlp_bias) = false;
  TORCH_ARG(bool, tie_word_embeddings) = false;
  TORCH_ARG(std::string, hidden_act) = "silu";
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, initializer_range) = 0.02;
  /// The HF model_type this model is saved as: llama, qwen2 (Qwen2 / Qwen2.5)
  /// or qwen3. Qwen2 is LLaMA with biases on q, k and v (qkv_bias); Qwen3 is
  /// LLaMA with an RMSNorm over each head of q and k before RoPE (qk_norm).
  TORCH_ARG(std::string, model_type) = "llama";
  /// Biases on q_proj, k_proj and v_proj only (Qwen2's); attention_bias puts
  /// them on o_proj too.
  TORCH_ARG(bool, qkv_bias) = false;
  /// q_norm / k_norm: RMSNorm(head_dim) of each query and key head (Qwen3's).
  TORCH_ARG(bool, qk_norm) = false;

 public:
  int64_t dim_per_head() const { return head_dim_ > 0 ? head_dim_ : hidden_size_ / num_attention_heads_; }
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaOptions& o);
  /// x (B, T, C); cos/sin (B, 1, T, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  layers::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  layers::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only
  int64_t n_heads, n_kv_heads, head_dim;
  double dropout;
};
TORCH_MODULE(LlamaAttention);

/// down(act(gate(x)) * up(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x);
  layers::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  std::string act;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  layers::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// HF's `model` submodule.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args);  // (B, T, C)
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  layers::RMSNorm norm{nullptr};
  at::Tensor inv_freq;  // (rotary_dim / 2), not a parameter
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
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;
  std::vector<std::string> lm_head_parameters() const override {
    return options.tie_word_embeddings() ? std::vector<std::string>{} : std::vector<std::string>{"lm_head.weight"};
  }

  /// HF's init: N(0, initializer_range) for linear and embedding weights, zero
  /// biases, unit RMSNorm weights.
  void reset_parameters();

  LlamaOptions options;
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied to model.embed_tokens
 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "model.embed_tokens.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }
};

}  // namespace anvil::models::llama
