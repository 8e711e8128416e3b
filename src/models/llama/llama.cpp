#include "models/llama/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>

#include "../hf_config_reader.h"
#include "models/context_parallel.h"
#include "models/init.h"

namespace anvil::models::llama {
namespace {

layers::Linear linear(int64_t in, int64_t out, bool bias) {
  return layers::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaOptions& o, int64_t layer)
    : n_heads(o.num_attention_heads()),
      n_kv_heads(o.num_key_value_heads()),
      head_dim(o.dim_per_head()),
      dropout(o.attention_dropout()),
      window(o.window_of(layer)) {
  const bool qkv = o.attention_bias() || o.qkv_bias();
  if (o.fused_projections()) {
    qkv_proj = register_module("qkv_proj", linear(o.hidden_size(), (n_heads + 2 * n_kv_heads) * head_dim, qkv));
  } else {
    q_proj = register_module("q_proj", linear(o.hidden_size(), n_heads * head_dim, qkv));
    k_proj = register_module("k_proj", linear(o.hidden_size(), n_kv_heads * head_dim, qkv));
    v_proj = register_module("v_proj", linear(o.hidden_size(), n_kv_heads * head_dim, qkv));
  }
  o_proj = register_module("o_proj", linear(n_heads * head_dim, o.hidden_size(), o.attention_bias()));
  if (o.qk_norm()) {
    q_norm = register_module("q_norm", layers::RMSNorm(layers::RMSNormOptions(head_dim).eps(o.rms_norm_eps())));
    k_norm = register_module("k_norm", layers::RMSNorm(layers::RMSNormOptions(head_dim).eps(o.rms_norm_eps())));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const ForwardArgs& args, size_t layer) {
  at::Tensor q, k, v;
  // Head counts from the local tensor: under tensor parallelism a rank holds a share of the heads.
  if (qkv_proj) {  // Phi-3: q, k, v rows of one projection
    auto qkv = qkv_proj(x);
    const auto width = qkv.size(-1), all = n_heads + 2 * n_kv_heads;  // every rank holds the same share of each
    const auto kv = width * n_kv_heads / all;
    auto parts = qkv.split_with_sizes({width - 2 * kv, kv, kv}, -1);
    q = layers::split_heads(parts[0], head_dim);
    k = layers::split_heads(parts[1], head_dim);
    v = layers::split_heads(parts[2], head_dim);
  } else {
    q = layers::split_heads(q_proj(x), head_dim);
    k = layers::split_heads(k_proj(x), head_dim);
    v = layers::split_heads(v_proj(x), head_dim);
  }
  if (q_norm) q = q_norm(q), k = k_norm(k);  // per head, before RoPE (Qwen3)
  q = q.transpose(1, 2);                     // (B, H, T, D)
  k = k.transpose(1, 2);                     // (B, Hkv, T, D)
  v = v.transpose(1, 2);
  q = layers::apply_rope(q, cos, sin);
  k = layers::apply_rope(k, cos, sin);
  return o_proj(layers::attention(q, k, v, args, layer, is_training() ? dropout : 0.0, window));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaOptions& o) : act(o.hidden_act()) {
  if (o.fused_projections()) {
    gate_up_proj = register_module("gate_up_proj", linear(o.hidden_size(), 2 * o.intermediate_size(), o.mlp_bias()));
  } else {
    gate_proj = register_module("gate_proj", linear(o.hidden_size(), o.intermediate_size(), o.mlp_bias()));
    up_proj = register_module("up_proj", linear(o.hidden_size(), o.intermediate_size(), o.mlp_bias()));
  }
  down_proj = register_module("down_proj", linear(o.intermediate_size(), o.hidden_size(), o.mlp_bias()));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  if (gate_up_proj) {  // Phi-3: gate rows, then up rows
    auto parts = gate_up_proj(x).chunk(2, -1);
    return down_proj(layers::gated_activation(parts[0], parts[1], act));
  }
  auto gate = gate_proj(x);  // before up_proj, as HF: LoRA dropout draws in this order
  return down_proj(layers::gated_activation(gate, up_proj(x), act));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaOptions& o, int64_t layer)
    : residual_dropout(o.residual_dropout()) {
  self_attn = register_module("self_attn", LlamaAttention(o, layer));
  if (o.sparse_layer(layer)) {
    const bool mixtral = variant(o.model_type()).experts == LlamaVariant::Experts::kMixtral;
    moe::MoeOptions m;
    m.hidden_size(o.hidden_size())
        .intermediate_size(o.moe_intermediate_size() > 0 ? o.moe_intermediate_size() : o.intermediate_size())
        .num_experts(o.num_experts())
        .top_k(o.num_experts_per_tok())
        .norm_topk_prob(o.norm_topk_prob())
        .jitter_noise(o.router_jitter_noise())
        .act(o.hidden_act())
        .expert_names(mixtral ? "w1_w2_w3" : "gate_up_down");
    moe = register_module(mixtral ? "block_sparse_moe" : "mlp", moe::SparseMoeBlock(m));
  } else {
    mlp = register_module("mlp", LlamaMLP(o));
  }
  input_layernorm = register_module("input_layernorm",
                                    layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const ForwardArgs& args, size_t layer) {
  const double p = is_training() ? residual_dropout : 0.0;  // Phi-3's resid_pdrop
  auto a = self_attn(input_layernorm(x), cos, sin, args, layer);
  auto h = x + (p > 0 ? at::dropout(a, p, true) : a);
  auto m = moe ? moe->forward(post_attention_layernorm(h), args) : mlp(post_attention_layernorm(h));
  return h + (p > 0 ? at::dropout(m, p, true) : m);
}

LlamaModelImpl::LlamaModelImpl(const LlamaOptions& o) : rope(o.rope()), max_positions(o.max_position_embeddings()) {
  auto emb = torch::nn::EmbeddingOptions(o.vocab_size(), o.hidden_size());
  if (o.padding_idx() >= 0) emb.padding_idx(o.padding_idx());
  embed_tokens = register_module("embed_tokens", layers::Embedding(emb));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers(); ++i) layers->push_back(LlamaDecoderLayer(o, i));
  norm = register_module("norm", layers::RMSNorm(layers::RMSNormOptions(o.hidden_size()).eps(o.rms_norm_eps())));
  // As HF: int(head_dim * partial_rotary_factor) leading dims rotate.
  rope.head_dim(o.dim_per_head())
      .rotary_dim(static_cast<int64_t>(static_cast<double>(o.dim_per_head()) * o.partial_rotary_factor() + 1e-6));
  inv_freq = layers::rope_inv_freq(rope);
  if (rope.type() == "longrope") long_inv_freq = layers::rope_inv_freq(rope, /*long_context=*/true);
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& input_ids, const ForwardArgs& args) {
  const auto B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = args.cache ? args.cache->length : 0;
  TORCH_CHECK(past + T <= max_positions, "sequence of ", past + T,
              " tokens exceeds max_position_embeddings=", max_positions);
  if (inv_freq.device() != input_ids.device()) inv_freq = inv_freq.to(input_ids.device());
  auto x = embed_tokens(input_ids);  // (B, T, C)
  const auto pos = layers::positions(args, B, T, input_ids.device());
  auto freq = inv_freq;
  if (long_inv_freq.defined()) {
    // LongRoPE (HF longrope_frequency_update): the long factors once the
    // batch's furthest position passes the pretraining context, per call.
    int64_t last = args.position_ids.defined() ? pos.max().item<int64_t>() : past + T - 1;
    if (args.context) last = args.context->max_over_group(last);  // the whole row's, over its ranks' shares
    if (last + 1 > rope.original_max_positions()) {
      if (long_inv_freq.device() != input_ids.device()) long_inv_freq = long_inv_freq.to(input_ids.device());
      freq = long_inv_freq;
    }
  }
  auto [cos, sin] = layers::rope_cos_sin(freq, pos, x.scalar_type(), rope.attention_factor());  // (B, 1, T, R)
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers[i]->as<LlamaDecoderLayer>();
    x = layers::run_block(
        args, i, x, [layer, cos, sin, args, i](const at::Tensor& t) { return layer->forward(t, cos, sin, args, i); });
  }
  if (args.cache) args.cache->advance(T);
  return norm(x);
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaOptions& o) : options(o) {
  TORCH_CHECK(o.num_attention_heads() % o.num_key_value_heads() == 0,
              "num_key_value_heads must divide num_attention_heads");
  model = register_module("model", LlamaModel(o));
  if (!o.tie_word_embeddings())
    lm_head = register_module("lm_head",
                              layers::Dense(torch::nn::LinearOptions(o.hidden_size(), o.vocab_size()).bias(false)));
  if (!init_skipped()) init_parameters(*this);  // loading weights: they overwrite it (models/init.h)
}

at::Tensor LlamaForCausalLM::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return model->forward(input_ids, args);
}

CausalLM::OutputHead LlamaForCausalLM::output_head() {
  if (!lm_head) return {model->embed_tokens->weight, {}};  // tied
  return {lm_head->weight, lm_head->bias};
}

std::optional<ParameterInit> LlamaForCausalLM::parameter_init(const std::string& name) const {
  if (name.ends_with("norm.weight")) return ParameterInit::constant(1.0);
  if (name.ends_with("bias")) return ParameterInit::constant(0.0);
  return ParameterInit::normal(options.initializer_range(),
                               name == embedding_parameter() ? options.padding_idx() : int64_t{-1});
}

nlohmann::json LlamaForCausalLM::hf_config() const {
  auto o = options;
  const auto& v = variant(o.model_type());
  // Written as they are in effect: the head width and (Qwen3-MoE) each expert's.
  o.head_dim(o.dim_per_head());
  if (o.moe_intermediate_size() == 0) o.moe_intermediate_size(o.intermediate_size());
  nlohmann::json j = {{"architectures", {v.architecture}}, {"model_type", v.model_type}, {"torch_dtype", "float32"}};
  HfKeyWriter keys(j);
  o.visit_hf(keys, v);
  const auto window = o.sliding_window() > 0 ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  if (v.windows == LlamaVariant::Windows::kEveryLayer) j["sliding_window"] = window;
  if (v.windows == LlamaVariant::Windows::kQwenLayers) {
    j["use_sliding_window"] = o.sliding_window() > 0;
    j["sliding_window"] = window;
    std::vector<std::string> types;
    for (int64_t i = 0; i < o.num_hidden_layers(); ++i)
      types.push_back(o.window_of(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    // Layers below max_window_layers are full: the first sliding layer, when the windows are contiguous at the end.
    int64_t first = o.num_hidden_layers();
    while (first > 0 && o.window_of(first - 1) > 0) --first;
    j["max_window_layers"] = first;
  }
  if (v.experts == LlamaVariant::Experts::kQwen3Moe) j["mlp_only_layers"] = o.mlp_only_layers();
  if (v.original_max_positions_default > 0)
    j["original_max_position_embeddings"] =
        o.rope().type() == "longrope" ? o.rope().original_max_positions() : o.max_position_embeddings();
  auto rope = o.rope();
  rope.head_dim(o.dim_per_head()).rotary_dim(model->rope.rotary_dim());
  write_hf_rope(j, rope, /*write_partial=*/v.partial_rotary);
  if (v.partial_rotary) j["partial_rotary_factor"] = o.partial_rotary_factor();
  write_hf_special_tokens(j, special_tokens);
  if (o.padding_idx() >= 0) j["pad_token_id"] = o.padding_idx();
  // None rather than the config class's default (Phi-3: 32000, Gemma: 0), which would be a padding_idx there.
  if (!j.contains("pad_token_id")) j["pad_token_id"] = nullptr;
  return j;
}

std::string LlamaForCausalLM::checkpoint_key(const std::string& name) const {
  if (name.ends_with("rotary_emb.inv_freq")) return "";  // a buffer older checkpoints saved
  if (name == "lm_head.weight" && options.tie_word_embeddings()) return "";
  return name;
}

}  // namespace anvil::models::llama
