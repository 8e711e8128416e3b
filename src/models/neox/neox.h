#pragma once
// GPT-NeoX (Black et al. 2022) and Pythia: LayerNorm, partial rotary
// positions (rotary_pct), fused QKV in HF's per-head interleaved layout
// [q_h, k_h, v_h] per head, parallel or sequential residual, untied output.
// Parameter names are HF's GPTNeoXForCausalLM checkpoint names.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>

#include "anvil/models/causal_lm.h"
#include "models/hf_keys.h"
#include "models/layers.h"

namespace anvil::models::neox {

struct NeoXOptions {
  TORCH_ARG(int64_t, vocab_size) = 50432;
  TORCH_ARG(int64_t, hidden_size) = 6144;
  TORCH_ARG(int64_t, intermediate_size) = 24576;
  TORCH_ARG(int64_t, num_hidden_layers) = 44;
  TORCH_ARG(int64_t, num_attention_heads) = 64;
  TORCH_ARG(int64_t, max_position_embeddings) = 2048;
  TORCH_ARG(double, layer_norm_eps) = 1e-5;
  /// theta and rotary_dim (= rotary_pct * head_dim); head_dim is filled in.
  TORCH_ARG(layers::RopeOptions, rope) = {};
  /// x + attn(ln1(x)) + mlp(ln2(x)) when true; sequential residuals otherwise.
  TORCH_ARG(bool, use_parallel_residual) = true;
  TORCH_ARG(std::string, hidden_act) = "gelu";
  TORCH_ARG(bool, tie_word_embeddings) = false;
  TORCH_ARG(double, hidden_dropout) = 0.0;
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, initializer_range) = 0.02;

 public:
  int64_t head_dim() const { return hidden_size_ / num_attention_heads_; }
  /// GPTNeoXConfig's plain keys (models/hf_keys.h); the rotary ones are read and written beside them.
  template <class V>
  void visit_hf(V& v) {
    v.required("vocab_size", vocab_size_);
    v.required("hidden_size", hidden_size_);
    v.required("intermediate_size", intermediate_size_);
    v.required("num_hidden_layers", num_hidden_layers_);
    v.required("num_attention_heads", num_attention_heads_);
    v.key("max_position_embeddings", max_position_embeddings_, int64_t{2048});
    v.key("layer_norm_eps", layer_norm_eps_, 1e-5, HfBound::positive);
    v.key("use_parallel_residual", use_parallel_residual_, true);
    v.key("hidden_act", hidden_act_, "gelu");
    v.key("tie_word_embeddings", tie_word_embeddings_, false);
    v.key("hidden_dropout", hidden_dropout_, 0.0, HfBound::probability);
    v.key("attention_dropout", attention_dropout_, 0.0, HfBound::probability);
    v.key("initializer_range", initializer_range_, 0.02);
    v.only("attention_bias", true, "GPT-NeoX without attention biases is not supported");
  }
};

class NeoXAttentionImpl : public torch::nn::Module {
 public:
  explicit NeoXAttentionImpl(const NeoXOptions& o);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  layers::Linear query_key_value{nullptr}, dense{nullptr};
  int64_t n_heads, head_dim;
  double dropout;
};
TORCH_MODULE(NeoXAttention);

class NeoXMLPImpl : public torch::nn::Module {
 public:
  explicit NeoXMLPImpl(const NeoXOptions& o);
  at::Tensor forward(const at::Tensor& x);
  layers::Linear dense_h_to_4h{nullptr}, dense_4h_to_h{nullptr};
  std::string act;
};
TORCH_MODULE(NeoXMLP);

class NeoXLayerImpl : public torch::nn::Module {
 public:
  explicit NeoXLayerImpl(const NeoXOptions& o);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const ForwardArgs& args,
                     size_t layer);
  layers::LayerNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  torch::nn::Dropout post_attention_dropout{nullptr}, post_mlp_dropout{nullptr};
  NeoXAttention attention{nullptr};
  NeoXMLP mlp{nullptr};
  bool parallel;
};
TORCH_MODULE(NeoXLayer);

/// HF's `gpt_neox` submodule.
class NeoXModelImpl : public torch::nn::Module {
 public:
  explicit NeoXModelImpl(const NeoXOptions& o);
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args);  // (B, T, C)
  layers::Embedding embed_in{nullptr};
  torch::nn::Dropout emb_dropout{nullptr};
  torch::nn::ModuleList layers{nullptr};
  layers::LayerNorm final_layer_norm{nullptr};
  at::Tensor inv_freq;
  int64_t max_positions;
};
TORCH_MODULE(NeoXModel);

class GPTNeoXForCausalLM final : public CausalLM {
 public:
  explicit GPTNeoXForCausalLM(const NeoXOptions& o);

  OutputHead output_head() override;
  std::string block_prefix(int64_t i) const override { return "gpt_neox.layers." + std::to_string(i); }
  std::string family() const override { return "neox"; }
  std::optional<ParameterInit> parameter_init(const std::string& name) const override;
  std::vector<std::string> default_lora_targets() const override { return {"query_key_value"}; }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t hidden_size() const override { return options.hidden_size(); }
  int64_t max_positions() const override { return options.max_position_embeddings(); }
  int64_t num_layers() const override { return options.num_hidden_layers(); }
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;
  std::vector<std::string> lm_head_parameters() const override {
    return options.tie_word_embeddings() ? std::vector<std::string>{} : std::vector<std::string>{"embed_out.weight"};
  }

  /// HF's init: N(0, initializer_range) weights, zero biases, unit LayerNorm.

  NeoXOptions options;
  NeoXModel gpt_neox{nullptr};
  layers::Dense embed_out{nullptr};  // null when tied to gpt_neox.embed_in
 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "gpt_neox.embed_in.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }
};

}  // namespace anvil::models::neox
