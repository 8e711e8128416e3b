// LLaMA's entry in the model registry: our typed config and HF config.json
// both map onto LlamaOptions.
#include "../hf_config_reader.h"
#include "anvil/models/llama.h"
#include "anvil/models/registry.h"

namespace anvil::models::llama {
namespace {

/// Meta's SwiGLU width: 2/3 of 4h, rounded up to a multiple of 256.
int64_t default_intermediate(int64_t hidden) { return 256 * ((8 * hidden / 3 + 255) / 256); }

/// Our typed config as `model_type` (llama, qwen2, qwen3) shapes it.
std::shared_ptr<CausalLM> from_typed_config(const config::ModelConfig& c, const std::string& model_type) {
  layers::RopeOptions rope;
  rope.theta(c.rope_theta);
  if (c.rope_scaling.type == "llama3")
    rope.type("llama3")
        .factor(c.rope_scaling.factor)
        .low_freq_factor(c.rope_scaling.low_freq_factor)
        .high_freq_factor(c.rope_scaling.high_freq_factor)
        .original_max_positions(c.rope_scaling.original_max_position_embeddings);
  LlamaOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .intermediate_size(c.intermediate_size > 0 ? c.intermediate_size : default_intermediate(c.hidden_size))
      .num_hidden_layers(c.num_layers)
      .num_attention_heads(c.num_heads)
      .num_key_value_heads(c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads)
      .max_position_embeddings(c.max_position_embeddings)
      .rms_norm_eps(c.layer_norm_eps)
      .rope(rope)
      .attention_bias(c.attention_bias)
      .tie_word_embeddings(c.tie_embeddings == "true")
      .hidden_act(c.activation == "auto" ? "silu" : c.activation)
      .attention_dropout(c.dropout)
      .initializer_range(c.initializer_range)
      .model_type(model_type)
      .qkv_bias(model_type == "qwen2")
      .qk_norm(model_type == "qwen3");
  if (model_type == "qwen2" && c.attention_bias)
    throw ConfigError("model.attention_bias: Qwen2 has biases on q, k and v (not on o_proj) by its definition; "
                      "leave the key out");
  return std::make_shared<LlamaForCausalLM>(o);
}

/// An HF config.json of `model_type` llama, qwen2 or qwen3.
std::shared_ptr<CausalLM> from_hf(const nlohmann::json& j, const std::string& where, const std::string& model_type) {
  const bool qwen2 = model_type == "qwen2", qwen3 = model_type == "qwen3";
  HfConfigReader r(j, where, qwen2 ? "Qwen2" : qwen3 ? "Qwen3" : "LLaMA");
  LlamaOptions o;
  o.vocab_size(r.integer("vocab_size"))
      .hidden_size(r.integer("hidden_size"))
      .intermediate_size(r.integer("intermediate_size"))
      .num_hidden_layers(r.integer("num_hidden_layers"))
      .num_attention_heads(r.integer("num_attention_heads"));
  o.num_key_value_heads(r.integer("num_key_value_heads", o.num_attention_heads()))
      .head_dim(qwen2 ? 0 : r.integer("head_dim", qwen3 ? 128 : 0))  // Qwen3Config's default is 128
      .max_position_embeddings(r.integer("max_position_embeddings", 2048))
      .rms_norm_eps(r.number("rms_norm_eps", 1e-6, HfConfigReader::Bound::positive))
      .attention_bias(qwen2 ? false : r.boolean("attention_bias", false))
      .mlp_bias(qwen2 || qwen3 ? false : r.boolean("mlp_bias", false))
      .model_type(model_type)
      .qkv_bias(qwen2)
      .qk_norm(qwen3)
      .tie_word_embeddings(r.boolean("tie_word_embeddings", false))
      .hidden_act(r.string("hidden_act", "silu"))
      .attention_dropout(r.number("attention_dropout", 0.0, HfConfigReader::Bound::probability))
      .initializer_range(r.number("initializer_range", 0.02));
  if (o.hidden_size() % o.num_attention_heads() != 0 && o.head_dim() == 0)
    r.fail("num_attention_heads", concat(o.num_attention_heads(), " does not divide hidden_size ", o.hidden_size(),
                                         " and no head_dim is given"));
  if (o.num_attention_heads() % o.num_key_value_heads() != 0)
    r.fail("num_key_value_heads", concat(o.num_key_value_heads(), " must divide num_attention_heads ",
                                         o.num_attention_heads()));
  if (!layers::is_supported_activation(o.hidden_act()))
    r.fail("hidden_act", concat("\"", o.hidden_act(), "\" is not supported"));
  if (qwen2 || qwen3) {
    // Sliding-window attention (Mistral's, Qwen's when use_sliding_window) is not implemented.
    if (r.boolean("use_sliding_window", false))
      r.fail("use_sliding_window", "sliding-window attention is not supported; only full attention (false)");
    if (j.contains("layer_types") && j["layer_types"].is_array())
      for (const auto& t : j["layer_types"])
        if (t != "full_attention")
          r.fail("layer_types", concat("layer type ", t.dump(), " is not supported; only \"full_attention\""));
  }
  auto rope = r.rope(o.dim_per_head(), 10000.0, 1.0);
  if (rope.rotary_dim() != o.dim_per_head()) r.fail("partial_rotary_factor", "partial rotary is not supported");
  o.rope(rope);
  auto model = std::make_shared<LlamaForCausalLM>(o);
  model->special_tokens = r.special_tokens();
  return model;
}

template <const char* Type>
ModelFamily make_family() {
  return {Type, Type, [](const config::ModelConfig& c) { return from_typed_config(c, Type); },
          [](const nlohmann::json& j, const std::string& where) { return from_hf(j, where, Type); }};
}
constexpr char kLlama[] = "llama", kQwen2[] = "qwen2", kQwen3[] = "qwen3";

}  // namespace

ModelFamily family() { return make_family<kLlama>(); }
ModelFamily qwen2_family() { return make_family<kQwen2>(); }
ModelFamily qwen3_family() { return make_family<kQwen3>(); }

}  // namespace anvil::models::llama
