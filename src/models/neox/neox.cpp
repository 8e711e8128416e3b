#include "models/neox/neox.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "../hf_config_reader.h"
#include "models/init.h"

namespace anvil::models::neox {
namespace {

layers::LayerNorm layer_norm(const NeoXOptions& o) {
  return layers::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size()}).eps(o.layer_norm_eps()));
}

}  // namespace

NeoXAttentionImpl::NeoXAttentionImpl(const NeoXOptions& o)
    : n_heads(o.num_attention_heads()), head_dim(o.head_dim()), dropout(o.attention_dropout()) {
  query_key_value = register_module("query_key_value", layers::Linear(o.hidden_size(), 3 * o.hidden_size()));
  dense = register_module("dense", layers::Linear(o.hidden_size(), o.hidden_size()));
}

at::Tensor NeoXAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                      const ForwardArgs& args, size_t layer) {
  // Per head, the fused projection holds [q_h, k_h, v_h] side by side (the heads this rank holds under tensor
  // parallelism).
  auto qkv = layers::split_heads(query_key_value(x), 3 * head_dim).transpose(1, 2);  // (B, H, T, 3D)
  auto parts = qkv.chunk(3, -1);                                                     // 3 x (B, H, T, D)
  auto q = layers::apply_rope(parts[0], cos, sin);
  auto k = layers::apply_rope(parts[1], cos, sin);
  return dense(layers::attention(q, k, parts[2], args, layer, is_training() ? dropout : 0.0));
}

NeoXMLPImpl::NeoXMLPImpl(const NeoXOptions& o) : act(o.hidden_act()) {
  dense_h_to_4h = register_module("dense_h_to_4h", layers::Linear(o.hidden_size(), o.intermediate_size()));
  dense_4h_to_h = register_module("dense_4h_to_h", layers::Linear(o.intermediate_size(), o.hidden_size()));
}

at::Tensor NeoXMLPImpl::forward(const at::Tensor& x) {
  return dense_4h_to_h(layers::activation(dense_h_to_4h(x), act));
}

NeoXLayerImpl::NeoXLayerImpl(const NeoXOptions& o) : parallel(o.use_parallel_residual()) {
  input_layernorm = register_module("input_layernorm", layer_norm(o));
  post_attention_layernorm = register_module("post_attention_layernorm", layer_norm(o));
  post_attention_dropout = register_module("post_attention_dropout", torch::nn::Dropout(o.hidden_dropout()));
  post_mlp_dropout = register_module("post_mlp_dropout", torch::nn::Dropout(o.hidden_dropout()));
  attention = register_module("attention", NeoXAttention(o));
  mlp = register_module("mlp", NeoXMLP(o));
}

at::Tensor NeoXLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const ForwardArgs& args, size_t layer) {
  auto a = post_attention_dropout(attention(layers::layer_norm(input_layernorm, x), cos, sin, args, layer));
  if (parallel) return x + a + post_mlp_dropout(mlp(layers::layer_norm(post_attention_layernorm, x)));
  auto h = x + a;
  return h + post_mlp_dropout(mlp(layers::layer_norm(post_attention_layernorm, h)));
}

NeoXModelImpl::NeoXModelImpl(const NeoXOptions& o) : max_positions(o.max_position_embeddings()) {
  embed_in = register_module("embed_in", layers::Embedding(o.vocab_size(), o.hidden_size()));
  emb_dropout = register_module("emb_dropout", torch::nn::Dropout(o.hidden_dropout()));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers(); ++i) layers->push_back(NeoXLayer(o));
  final_layer_norm = register_module("final_layer_norm", layer_norm(o));
  inv_freq = layers::rope_inv_freq(o.rope());
}

at::Tensor NeoXModelImpl::forward(const at::Tensor& input_ids, const ForwardArgs& args) {
  const auto B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = args.cache ? args.cache->length : 0;
  TORCH_CHECK(past + T <= max_positions, "sequence of ", past + T,
              " tokens exceeds max_position_embeddings=", max_positions);
  if (inv_freq.device() != input_ids.device()) inv_freq = inv_freq.to(input_ids.device());
  auto x = emb_dropout(embed_in(input_ids));  // (B, T, C)
  auto [cos, sin] = layers::rope_cos_sin(inv_freq, layers::positions(args, B, T, input_ids.device()),
                                         x.scalar_type());  // (B, 1, T, R)
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers[i]->as<NeoXLayer>();
    x = layers::run_block(
        args, i, x, [layer, cos, sin, args, i](const at::Tensor& t) { return layer->forward(t, cos, sin, args, i); });
  }
  if (args.cache) args.cache->advance(T);
  return layers::layer_norm(final_layer_norm, x);
}

GPTNeoXForCausalLM::GPTNeoXForCausalLM(const NeoXOptions& o) : options(o) {
  TORCH_CHECK(o.hidden_size() % o.num_attention_heads() == 0, "num_attention_heads must divide hidden_size");
  options.rope().head_dim(o.head_dim());
  gpt_neox = register_module("gpt_neox", NeoXModel(options));
  if (!o.tie_word_embeddings())
    embed_out = register_module("embed_out",
                                layers::Dense(torch::nn::LinearOptions(o.hidden_size(), o.vocab_size()).bias(false)));
  if (!init_skipped()) init_parameters(*this);  // loading weights: they overwrite it (models/init.h)
}

at::Tensor GPTNeoXForCausalLM::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return gpt_neox->forward(input_ids, args);
}

CausalLM::OutputHead GPTNeoXForCausalLM::output_head() {
  if (!embed_out) return {gpt_neox->embed_in->weight, {}};  // tied
  return {embed_out->weight, embed_out->bias};
}

std::optional<ParameterInit> GPTNeoXForCausalLM::parameter_init(const std::string& name) const {
  const bool is_norm =
      name.find("layernorm.") != std::string::npos || name.find("final_layer_norm.") != std::string::npos;
  if (is_norm) return ParameterInit::constant(name.ends_with("weight") ? 1.0 : 0.0);
  if (name.ends_with("bias")) return ParameterInit::constant(0.0);
  return ParameterInit::normal(options.initializer_range());
}

nlohmann::json GPTNeoXForCausalLM::hf_config() const {
  auto o = options;
  nlohmann::json j = {
      {"architectures", {"GPTNeoXForCausalLM"}},
      {"model_type", "gpt_neox"},
      {"rotary_pct", static_cast<double>(o.rope().rotary_dim()) / static_cast<double>(o.head_dim())},
      {"rotary_emb_base", o.rope().theta()},
      {"torch_dtype", "float32"},
  };
  HfKeyWriter keys(j);
  o.visit_hf(keys);
  write_hf_rope(j, o.rope(), /*write_partial=*/true);
  write_hf_special_tokens(j, special_tokens);
  return j;
}

std::string GPTNeoXForCausalLM::checkpoint_key(const std::string& name) const {
  // Causal-mask and rotary buffers older checkpoints saved.
  if (name.ends_with(".attention.bias") || name.ends_with(".attention.masked_bias") ||
      name.ends_with("rotary_emb.inv_freq"))
    return "";
  // transformers 5 names the head lm_head in memory; files keep embed_out.
  if (name == "lm_head.weight" || name == "embed_out.weight")
    return options.tie_word_embeddings() ? "" : "embed_out.weight";
  return name;
}

}  // namespace anvil::models::neox
