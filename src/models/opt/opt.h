#pragma once
// OPT (Zhang et al. 2022) and Galactica (Taylor et al. 2022, OPT-shaped)
// with Hugging Face's OPTForCausalLM parameter names: learned positions with
// an offset of 2, pre- or post-LN blocks (do_layer_norm_before), an optional
// word-embedding projection (project_in / project_out, opt-350m), optional
// biases and LayerNorm affines (Galactica), and a tied LM head.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>

#include "anvil/models/causal_lm.h"
#include "models/hf_keys.h"
#include "models/layers.h"

namespace anvil::models::opt {

struct OPTOptions {
  TORCH_ARG(int64_t, vocab_size) = 50272;
  TORCH_ARG(int64_t, hidden_size) = 768;
  TORCH_ARG(int64_t, ffn_dim) = 3072;
  TORCH_ARG(int64_t, num_hidden_layers) = 12;
  TORCH_ARG(int64_t, num_attention_heads) = 12;
  TORCH_ARG(int64_t, max_position_embeddings) = 2048;
  /// The embedding width; project_in / project_out map it to hidden_size when different.
  TORCH_ARG(int64_t, word_embed_proj_dim) = 768;
  TORCH_ARG(bool, do_layer_norm_before) = true;
  TORCH_ARG(bool, enable_bias) = true;
  TORCH_ARG(bool, layer_norm_elementwise_affine) = true;
  TORCH_ARG(bool, remove_final_layer_norm) = false;
  TORCH_ARG(std::string, activation_function) = "relu";
  TORCH_ARG(bool, tie_word_embeddings) = true;
  TORCH_ARG(double, dropout) = 0.1;
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, init_std) = 0.02;
  /// The embedding row that gets no gradient (HF's padding_idx); -1 = none.
  TORCH_ARG(int64_t, padding_idx) = -1;

 public:
  /// OPTConfig's keys (models/hf_keys.h): read from and written to config.json.
  template <class V>
  void visit_hf(V& v) {
    v.required("vocab_size", vocab_size_);
    v.required("hidden_size", hidden_size_);
    v.required("ffn_dim", ffn_dim_);
    v.required("num_hidden_layers", num_hidden_layers_);
    v.required("num_attention_heads", num_attention_heads_);
    v.key("max_position_embeddings", max_position_embeddings_, int64_t{2048});
    v.key("do_layer_norm_before", do_layer_norm_before_, true);
    v.key("enable_bias", enable_bias_, true);
    v.key("layer_norm_elementwise_affine", layer_norm_elementwise_affine_, true);
    v.key("_remove_final_layer_norm", remove_final_layer_norm_, false);
    v.key("activation_function", activation_function_, "relu");
    v.key("tie_word_embeddings", tie_word_embeddings_, true);
    v.key("dropout", dropout_, 0.1, HfBound::probability);
    v.key("attention_dropout", attention_dropout_, 0.0, HfBound::probability);
    v.key("init_std", init_std_, 0.02);
    v.key("word_embed_proj_dim", word_embed_proj_dim_, hidden_size_);
  }
};

/// OPTForCausalLM: `model.decoder.*`, and `lm_head` (tied to
/// model.decoder.embed_tokens unless tie_word_embeddings is false).
class OPTForCausalLM final : public CausalLM {
 public:
  explicit OPTForCausalLM(const OPTOptions& o);

  OutputHead output_head() override;
  std::string block_prefix(int64_t i) const override { return "model.decoder.layers." + std::to_string(i); }
  std::string family() const override { return "opt"; }
  std::optional<ParameterInit> parameter_init(const std::string& name) const override;
  std::vector<std::string> default_lora_targets() const override { return {"q_proj", "v_proj"}; }
  int64_t vocab_size() const override { return options.vocab_size(); }
  /// The width the LM head reads: word_embed_proj_dim (after project_out).
  int64_t hidden_size() const override { return options.word_embed_proj_dim(); }
  int64_t max_positions() const override { return options.max_position_embeddings(); }
  int64_t num_layers() const override { return options.num_hidden_layers(); }
  nlohmann::json hf_config() const override;
  std::string checkpoint_key(const std::string& name) const override;
  std::vector<std::string> lm_head_parameters() const override {
    return options.tie_word_embeddings() ? std::vector<std::string>{} : std::vector<std::string>{"lm_head.weight"};
  }

  /// HF's init: N(0, init_std) weights and embeddings, zero biases and
  /// padding row, unit LayerNorm.
  /// The token and position tables; none apart when project_in (opt-350m) reads its weights before the blocks.
  std::vector<std::string> input_embedding_parameters() const override;

  OPTOptions options;

 protected:
  at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) override;
  std::string embedding_parameter() const override { return "model.decoder.embed_tokens.weight"; }
  void set_vocab_size(int64_t n) override { options.vocab_size(n); }

 private:
  struct Decoder;
  std::shared_ptr<torch::nn::Module> model_;  // "model", holding "decoder"
  Decoder* decoder_ = nullptr;
  layers::Dense lm_head_{nullptr};  // null when tied
};

}  // namespace anvil::models::opt
