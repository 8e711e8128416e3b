#include "anvil/models/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "../hf_config_reader.h"

namespace anvil::models::llama {
namespace {

layers::Linear linear(int64_t in, int64_t out, bool bias) {
  return layers::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaOptions& o)
    : n_heads(o.num_attention_heads()),
      n_kv_heads(o.num_key_value_heads()),
      head_dim(o.dim_per_head()),
      dropout(o.attention_dropout()) {
  const bool qkv = o.attention_bias() || o.qkv_bias();
  q_proj = register_module("q_proj", linear(o.hidden_size(), n_heads * head_dim, qkv));
  k_proj = register_module("k_proj", linear(o.hidden_size(), n_kv_heads * head_dim, qkv));
  v_proj = register_module("v_proj", linear(o.hidden_size(), n_kv_heads * head_dim, qkv));
  o_proj = register_module("o_proj", linear(n_heads * head_dim, o.hidden_size(), o.attention_bias()));
  if (o.qk_norm()) {
    q_norm = register_module("q_norm", layers::RMSNorm(layers::RMSNormOptions(head_dim).eps(o.rms_norm_eps())));
    k_norm = register_module("k_norm", layers::RMSNorm(layers::RMSNormOptions(head_dim).eps(o.rms_norm_eps())));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const ForwardArgs& args, size_t layer) {
  const auto B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, n_heads, head_dim});
  auto k = k_proj(x).view({B, T, n_kv_heads, head_dim});
  if (q_norm) q = q_norm(q), k = k_norm(k);  // per head, before RoPE (Qwen3)
  q = q.transpose(1, 2);  // (B, H, T, D)
  k = k.transpose(1, 2);  // (B, Hkv, T, D)
  auto v = v_proj(x).view({B, T, n_kv_heads, head_dim}).transpose(1, 2);
  q = layers::apply_rope(q, cos, sin);
  k = layers::apply_rope(k, cos, sin);
  return o_proj(layers::attention(q, k, v, args, layer, is_training() ? dropout : 0.0));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaOptions& o) : act(o.hidden_act()) {
  gate_proj = register_module("gate_proj", linear(o.hidden_size(), o.intermediate_size(), o.mlp_bias()));
  up_proj = register_module("up_proj", linear(o.hidden_size(), o.intermediate_size(), o.mlp_bias()));
  down_proj = register_module("down_proj", linear(o.intermediate_size(), o.hidden_size(), o.mlp_bias()));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return down_proj(layers::activation(gate_proj(x), act) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaOptions& o) {
  self_attn = register_module("self_attn", LlamaAttention(o));
  mlp = register_module("mlp", LlamaMLP(o));
  input_layernorm =
      register_module("input_layernorm", layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const ForwardArgs& args, size_t layer) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, args, layer);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaOptions& o) : max_positions(o.max_position_embeddings()) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(o.vocab_size(), o.hidden_size()));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers(); ++i) layers->push_back(LlamaDecoderLayer(o));
  norm = register_module("norm", layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
  auto rope = o.rope();
  inv_freq = layers::rope_inv_freq(rope.head_dim(o.dim_per_head()).rotary_dim(o.dim_per_head()));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& input_ids, const ForwardArgs& args) {
  const auto B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = args.cache ? args.cache->length : 0;
  TORCH_CHECK(past + T <= max_positions, "sequence of ", past + T, " tokens exceeds max_position_embeddings=",
              max_positions);
  if (inv_freq.device() != input_ids.device()) inv_freq = inv_freq.to(input_ids.device());
  auto x = embed_tokens(input_ids);  // (B, T, C)
  auto [cos, sin] = layers::rope_cos_sin(inv_freq, layers::positions(args, B, T, input_ids.device()),
                                         x.scalar_type());  // (B, 1, T, D)
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers[i]->as<LlamaDecoderLayer>();
    x = layers::run_block(args, i, x,
                          [layer, cos, sin, args, i](const at::Tensor& t) { return layer->forward(t, cos, sin, args, i); });
  }
  if (args.cache) args.cache->advance(T);
  return norm(x);
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaOptions& o) : options(o) {
  TORCH_CHECK(o.num_attention_heads() % o.num_key_value_heads() == 0,
              "num_key_value_heads must divide num_attention_heads");
  model = register_module("model", LlamaModel(o));
  if (!o.tie_word_embeddings())
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(o.hidden_size(), o.vocab_size()).bias(false)));
  reset_parameters();
}

at::Tensor LlamaForCausalLM::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return model->forward(input_ids, args);
}

CausalLM::OutputHead LlamaForCausalLM::output_head() {
  if (!lm_head) return {model->embed_tokens->weight, {}};  // tied
  return {lm_head->weight, lm_head->bias};
}

void LlamaForCausalLM::reset_parameters() {
  at::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const auto& name = p.key();
    auto& t = p.value();
    if (name.ends_with("norm.weight")) t.fill_(1.0);
    else if (name.ends_with("bias")) t.zero_();
    else t.normal_(0.0, options.initializer_range());
  }
}

nlohmann::json LlamaForCausalLM::hf_config() const {
  const auto& o = options;
  const auto& type = o.model_type();
  const char* architecture = type == "qwen2" ? "Qwen2ForCausalLM" : type == "qwen3" ? "Qwen3ForCausalLM"
                                                                                   : "LlamaForCausalLM";
  nlohmann::json j = {
      {"architectures", {architecture}},
      {"model_type", type},
      {"vocab_size", o.vocab_size()},
      {"hidden_size", o.hidden_size()},
      {"intermediate_size", o.intermediate_size()},
      {"num_hidden_layers", o.num_hidden_layers()},
      {"num_attention_heads", o.num_attention_heads()},
      {"num_key_value_heads", o.num_key_value_heads()},
      {"head_dim", o.dim_per_head()},
      {"max_position_embeddings", o.max_position_embeddings()},
      {"rms_norm_eps", o.rms_norm_eps()},
      {"attention_bias", o.attention_bias()},
      {"mlp_bias", o.mlp_bias()},
      {"tie_word_embeddings", o.tie_word_embeddings()},
      {"hidden_act", o.hidden_act()},
      {"attention_dropout", o.attention_dropout()},
      {"initializer_range", o.initializer_range()},
      {"pretraining_tp", 1},
      {"torch_dtype", "float32"},
  };
  if (type != "llama") {
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    j["use_sliding_window"] = false;
    j["max_window_layers"] = o.num_hidden_layers();
    if (type == "qwen2") j.erase("attention_bias"), j.erase("head_dim");  // q/k/v biases are Qwen2's own
  }
  write_hf_rope(j, o.rope(), /*write_partial=*/false);
  write_hf_special_tokens(j, special_tokens);
  return j;
}

std::string LlamaForCausalLM::checkpoint_key(const std::string& name) const {
  if (name.ends_with("rotary_emb.inv_freq")) return "";  // a buffer older checkpoints saved
  if (name == "lm_head.weight" && options.tie_word_embeddings()) return "";
  return name;
}

}  // namespace anvil::models::llama
