#pragma once
// GPT-2 (Radford et al. 2019) with Hugging Face parameter names and layouts,
// so an HF checkpoint loads by a rename-free walk. HF's Conv1D keeps weights
// as (in, out); we store them the same way.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>

#include "anvil/models/causal_lm.h"
#include "models/hf_keys.h"
#include "models/layers.h"
#include "models/lora.h"

namespace anvil::models::gpt2 {

struct GPT2Options {
  TORCH_ARG(int64_t, vocab_size) = 50257;
  TORCH_ARG(int64_t, n_positions) = 1024;
  TORCH_ARG(int64_t, n_embd) = 768;
  TORCH_ARG(int64_t, n_layer) = 12;
  TORCH_ARG(int64_t, n_head) = 12;
  /// MLP width; 0 means 4 * n_embd.
  TORCH_ARG(int64_t, n_inner) = 0;
  TORCH_ARG(double, resid_pdrop) = 0.1;
  TORCH_ARG(double, embd_pdrop) = 0.1;
  TORCH_ARG(double, attn_pdrop) = 0.1;
  TORCH_ARG(double, layer_norm_epsilon) = 1e-5;
  TORCH_ARG(double, initializer_range) = 0.02;

 public:
  int64_t inner() const { return n_inner_ > 0 ? n_inner_ : 4 * n_embd_; }
  /// GPT2Config's keys (models/hf_keys.h): read from and written to config.json.
  template <class V>
  void visit_hf(V& v) {
    v.required("vocab_size", vocab_size_);
    v.key("n_positions", n_positions_, int64_t{1024});
    v.constant("n_ctx", n_positions_);
    v.required("n_embd", n_embd_);
    v.required("n_layer", n_layer_);
    v.required("n_head", n_head_);
    v.zero_is_null("n_inner", n_inner_);
    v.key("resid_pdrop", resid_pdrop_, 0.1, HfBound::probability);
    v.key("embd_pdrop", embd_pdrop_, 0.1, HfBound::probability);
    v.key("attn_pdrop", attn_pdrop_, 0.1, HfBound::probability);
    v.key("layer_norm_epsilon", layer_norm_epsilon_, 1e-5, HfBound::positive);
    v.key("initializer_range", initializer_range_, 0.02);
    v.only("activation_function", "gelu_new", "only gelu_new is supported");
    v.only("tie_word_embeddings", true, "untied GPT-2 heads are not supported");
    v.only("scale_attn_weights", true, "GPT-2 without the 1/sqrt(head_dim) attention scale is not supported");
    v.only("scale_attn_by_inverse_layer_idx", false, "not supported");
    v.only("reorder_and_upcast_attn", false, "not supported");
  }
};

/// HF's Conv1D: y = x @ W + b with W stored as (in, out); it can carry a
/// LoRA adapter (PEFT's fan_in_fan_out layout: A (r, in), B (out, r)).
class Conv1DImpl : public torch::nn::Module, public LoraLayer, public ParallelLinear {
 public:
  Conv1DImpl(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& x);
  int64_t in_features() const override { return weight.size(0); }
  int64_t out_features() const override { return weight.size(1); }
  int64_t output_dim() const override { return 1; }
  void add_to_weight(const at::Tensor& delta_out_in) override;
  at::Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const GPT2Options& o);
  /// x: (B, T, C); keys/values go to args.cache under `layer`.
  at::Tensor forward(const at::Tensor& x, const ForwardArgs& args, size_t layer);

  Conv1D c_attn, c_proj;
  torch::nn::Dropout resid_dropout;
  int64_t n_head, n_embd;
  double attn_pdrop;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPT2Options& o);
  at::Tensor forward(const at::Tensor& x);
  Conv1D c_fc, c_proj;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPT2Options& o);
  at::Tensor forward(const at::Tensor& x, const ForwardArgs& args, size_t layer);
  // Declaration order = registration order = HF's parameter order.
  layers::LayerNorm ln_1;
  Attention attn;
  layers::LayerNorm ln_2;
  MLP mlp;
};
TORCH_MODULE(Block);

/// The trunk: HF's `transformer` submodule.
class GPT2ModelImpl : public torch::nn::Module {
 public:
  explicit GPT2ModelImpl(const GPT2Options& o);
  /// (B, T) ids -> (B, T, C) final hidden states.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args);
  layers::Embedding wte, wpe;
  torch::nn::Dropout drop;
  torch::nn::ModuleList h;
  layers::LayerNorm ln_f;
};
TORCH_MODULE(GPT2Model);

/// GPT2LMHeadModel: the LM head is tied to `transformer.wte.weight`.
class GPT2LMHeadModel final : public CausalLM {
 public:
  explicit GPT2LMHeadModel(const GPT2Options& o);

  OutputHead output_head() override;
  std::string block_prefix(int64_t i) const override { return "transformer.h." + std::to_string(i); }
  std::string family() const override { return "gpt2"; }
  std::optional<ParameterInit> parameter_init(const std::string& name) const override;
  std::vector<std::string> default_lora_targets() const override { return {"c_attn"}; }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t hidden_size() const override { return options.n_embd(); }
  int64_t max_positions() const override { return options.n_positions(); }
  int64_t num_layers() const override { return options.n_layer(); }
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;

  /// GPT-2's init: N(0, initializer_range), residual projections scaled by
  /// 1/sqrt(2 * n_layer), zero biases, unit LayerNorm.
  std::vector<std::string> input_embedding_parameters() const override {
    return {"transformer.wte.weight", "transformer.wpe.weight"};
  }

  GPT2Options options;
  GPT2Model transformer{nullptr};

 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "transformer.wte.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }
};

}  // namespace anvil::models::gpt2
