#include "models/gemma/gemma.h"

#include <ATen/ATen.h>

#include <cmath>

#include "../hf_config_reader.h"
#include "models/init.h"

namespace anvil::models::gemma {
namespace {

layers::Linear linear(int64_t in, int64_t out, bool bias) {
  return layers::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

/// transformers 5's per-layer-type rope_parameters entry of `o`.
nlohmann::json rope_entry(const layers::RopeOptions& o) {
  nlohmann::json j = {{"rope_type", o.type()}, {"rope_theta", o.theta()}};
  if (o.type() == "linear") j["factor"] = o.factor();
  return j;
}

}  // namespace

GemmaRMSNormImpl::GemmaRMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", layers::new_parameter({dim}));
  if (!init_skipped()) weight.detach().zero_();
}

at::Tensor GemmaRMSNormImpl::forward(const at::Tensor& x) {
  // As HF's Gemma2RMSNorm: in float32, times (1 + w), cast back.
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return (h * (1.0 + parallel_weight(weight).to(at::kFloat))).to(x.scalar_type());
}

GemmaAttentionImpl::GemmaAttentionImpl(const GemmaOptions& o, int64_t layer)
    : n_heads(o.num_attention_heads()), n_kv_heads(o.num_key_value_heads()), head_dim(o.head_dim()) {
  q_proj = register_module("q_proj", linear(o.hidden_size(), n_heads * head_dim, o.attention_bias()));
  k_proj = register_module("k_proj", linear(o.hidden_size(), n_kv_heads * head_dim, o.attention_bias()));
  v_proj = register_module("v_proj", linear(o.hidden_size(), n_kv_heads * head_dim, o.attention_bias()));
  o_proj = register_module("o_proj", linear(n_heads * head_dim, o.hidden_size(), o.attention_bias()));
  if (o.qk_norm()) {
    q_norm = register_module("q_norm", GemmaRMSNorm(head_dim, o.rms_norm_eps()));
    k_norm = register_module("k_norm", GemmaRMSNorm(head_dim, o.rms_norm_eps()));
  }
  attn.dropout = o.attention_dropout();
  attn.sliding_window = o.sliding(layer) ? o.sliding_window() : 0;
  attn.scale = 1.0 / std::sqrt(o.query_pre_attn_scalar());
  attn.softcap = o.attn_logit_softcapping();
}

at::Tensor GemmaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const ForwardArgs& args, size_t layer) {
  auto q = layers::split_heads(q_proj(x), head_dim);
  auto k = layers::split_heads(k_proj(x), head_dim);
  auto v = layers::split_heads(v_proj(x), head_dim).transpose(1, 2);
  if (q_norm) q = q_norm(q), k = k_norm(k);  // Gemma 3: per head, before RoPE
  q = layers::apply_rope(q.transpose(1, 2), cos, sin);
  k = layers::apply_rope(k.transpose(1, 2), cos, sin);
  auto o = attn;
  if (!is_training()) o.dropout = 0.0;
  return o_proj(layers::attention(q, k, v, args, layer, o));
}

GemmaMLPImpl::GemmaMLPImpl(const GemmaOptions& o) : act(o.hidden_act()) {
  gate_proj = register_module("gate_proj", linear(o.hidden_size(), o.intermediate_size(), false));
  up_proj = register_module("up_proj", linear(o.hidden_size(), o.intermediate_size(), false));
  down_proj = register_module("down_proj", linear(o.intermediate_size(), o.hidden_size(), false));
}

at::Tensor GemmaMLPImpl::forward(const at::Tensor& x) {
  auto gate = gate_proj(x);  // before up_proj, as HF
  return down_proj(layers::gated_activation(gate, up_proj(x), act));
}

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer) {
  self_attn = register_module("self_attn", GemmaAttention(o, layer));
  mlp = register_module("mlp", GemmaMLP(o));
  const auto h = o.hidden_size();
  const auto eps = o.rms_norm_eps();
  input_layernorm = register_module("input_layernorm", GemmaRMSNorm(h, eps));
  post_attention_layernorm = register_module("post_attention_layernorm", GemmaRMSNorm(h, eps));
  pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", GemmaRMSNorm(h, eps));
  post_feedforward_layernorm = register_module("post_feedforward_layernorm", GemmaRMSNorm(h, eps));
}

at::Tensor GemmaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const ForwardArgs& args, size_t layer) {
  auto h = x + post_attention_layernorm(self_attn(input_layernorm(x), cos, sin, args, layer));
  return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
}

GemmaModelImpl::GemmaModelImpl(const GemmaOptions& o)
    : rope_scale(o.rope().attention_factor()),
      local_rope_scale(o.local_rope().attention_factor()),
      embed_scale(std::sqrt(static_cast<double>(o.hidden_size()))),
      max_positions(o.max_position_embeddings()) {
  auto emb = torch::nn::EmbeddingOptions(o.vocab_size(), o.hidden_size());
  if (o.padding_idx() >= 0) emb.padding_idx(o.padding_idx());
  embed_tokens = register_module("embed_tokens", layers::Embedding(emb));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers(); ++i) {
    layers->push_back(GemmaDecoderLayer(o, i));
    sliding.push_back(o.sliding(i));
  }
  norm = register_module("norm", GemmaRMSNorm(o.hidden_size(), o.rms_norm_eps()));
  auto rope = o.rope(), local = o.local_rope();
  inv_freq = layers::rope_inv_freq(rope.head_dim(o.head_dim()).rotary_dim(o.head_dim()));
  local_inv_freq = layers::rope_inv_freq(local.head_dim(o.head_dim()).rotary_dim(o.head_dim()));
}

at::Tensor GemmaModelImpl::forward(const at::Tensor& input_ids, const ForwardArgs& args) {
  const auto B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = args.cache ? args.cache->length : 0;
  TORCH_CHECK(past + T <= max_positions, "sequence of ", past + T,
              " tokens exceeds max_position_embeddings=", max_positions);
  const auto device = input_ids.device();
  if (inv_freq.device() != device) inv_freq = inv_freq.to(device), local_inv_freq = local_inv_freq.to(device);
  auto x = embed_tokens(input_ids);
  // HF: the embedding times sqrt(hidden), as a float32 scalar cast to the embedding's dtype.
  x = x * at::scalar_tensor(embed_scale, at::kFloat).to(x.scalar_type());
  const auto pos = layers::positions(args, B, T, device);
  auto [cos, sin] = layers::rope_cos_sin(inv_freq, pos, x.scalar_type(), rope_scale);
  auto [lcos, lsin] = layers::rope_cos_sin(local_inv_freq, pos, x.scalar_type(), local_rope_scale);
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers[i]->as<GemmaDecoderLayer>();
    const auto c = sliding[i] ? lcos : cos;
    const auto s = sliding[i] ? lsin : sin;
    x = layers::run_block(args, i, x,
                          [layer, c, s, args, i](const at::Tensor& t) { return layer->forward(t, c, s, args, i); });
  }
  if (args.cache) args.cache->advance(T);
  return norm(x);
}

GemmaForCausalLM::GemmaForCausalLM(const GemmaOptions& o) : options(o) {
  TORCH_CHECK(o.num_attention_heads() % o.num_key_value_heads() == 0,
              "num_key_value_heads must divide num_attention_heads");
  TORCH_CHECK(static_cast<int64_t>(o.layer_types().size()) == o.num_hidden_layers(), "gemma: one layer type per layer");
  model = register_module("model", GemmaModel(o));
  if (!o.tie_word_embeddings())
    lm_head = register_module("lm_head",
                              layers::Dense(torch::nn::LinearOptions(o.hidden_size(), o.vocab_size()).bias(false)));
  if (!init_skipped()) init_parameters(*this);  // loading weights: they overwrite it (models/init.h)
}

at::Tensor GemmaForCausalLM::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return model->forward(input_ids, args);
}

CausalLM::OutputHead GemmaForCausalLM::output_head() {
  if (!lm_head) return {model->embed_tokens->weight, {}};
  return {lm_head->weight, lm_head->bias};
}

std::optional<ParameterInit> GemmaForCausalLM::parameter_init(const std::string& name) const {
  // Gemma's norms scale by (1 + weight): zero is the identity.
  if (name.ends_with("norm.weight") || name.ends_with("bias")) return ParameterInit::constant(0.0);
  return ParameterInit::normal(options.initializer_range(),
                               name == embedding_parameter() ? options.padding_idx() : int64_t{-1});
}

nlohmann::json GemmaForCausalLM::hf_config() const {
  auto o = options;
  const bool g3 = o.model_type() == "gemma3_text";
  const auto cap = [](double c) { return c > 0 ? nlohmann::json(c) : nlohmann::json(nullptr); };
  nlohmann::json j = {
      {"architectures", {g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM"}},
      {"model_type", o.model_type()},
      // An int in transformers' config classes (strictly checked), so whole values are written as one.
      {"query_pre_attn_scalar", o.query_pre_attn_scalar() == std::floor(o.query_pre_attn_scalar())
                                    ? nlohmann::json(static_cast<int64_t>(o.query_pre_attn_scalar()))
                                    : nlohmann::json(o.query_pre_attn_scalar())},
      {"attn_logit_softcapping", cap(o.attn_logit_softcapping())},
      {"final_logit_softcapping", cap(o.final_logit_softcapping())},
      {"layer_types", o.layer_types()},
      {"torch_dtype", "float32"},
  };
  HfKeyWriter keys(j);
  o.visit_hf(keys);
  if (g3) {
    // Both spellings: transformers 5's per-layer-type rope_parameters and 4's keys.
    j["rope_parameters"] = {{"full_attention", rope_entry(o.rope())},
                            {"sliding_attention", rope_entry(o.local_rope())}};
    j["rope_theta"] = o.rope().theta();
    j["rope_local_base_freq"] = o.local_rope().theta();
    j["rope_scaling"] = o.rope().type() == "linear"
                            ? nlohmann::json({{"rope_type", "linear"}, {"factor", o.rope().factor()}})
                            : nlohmann::json(nullptr);
  } else {
    write_hf_rope(j, o.rope(), /*write_partial=*/false);
  }
  write_hf_special_tokens(j, special_tokens);
  if (o.padding_idx() >= 0) j["pad_token_id"] = o.padding_idx();
  // None rather than the config class's default (Phi-3: 32000, Gemma: 0), which would be a padding_idx there.
  if (!j.contains("pad_token_id")) j["pad_token_id"] = nullptr;
  return j;
}

std::string GemmaForCausalLM::checkpoint_key(const std::string& name) const {
  if (name == "lm_head.weight" && options.tie_word_embeddings()) return "";
  return name;
}

}  // namespace anvil::models::gemma
