// The registry entries of LLaMA and the families that are options of its code
// (qwen2, qwen3, mistral, phi3, and the mixture-of-experts mixtral and
// qwen3_moe): our typed config and HF config.json both map onto LlamaOptions.
#include "../hf_config_reader.h"
#include "models/llama/llama.h"
#include "anvil/models/registry.h"

namespace anvil::models::llama {
namespace {

/// Meta's SwiGLU width: 2/3 of 4h, rounded up to a multiple of 256.
int64_t default_intermediate(int64_t hidden) { return 256 * ((8 * hidden / 3 + 255) / 256); }

/// The model types of the rows that have `what`, for messages ("mixtral and qwen3_moe").
std::string types_with(bool (*what)(const LlamaVariant&)) {
  std::vector<std::string> names;
  for (const auto& v : variants())
    if (what(v)) names.emplace_back(v.model_type);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

/// Our typed config as variant `v` shapes it.
std::shared_ptr<CausalLM> from_typed_config(const config::ModelConfig& c, const LlamaVariant& v) {
  layers::RopeOptions rope;
  rope.theta(c.rope_theta);
  if (c.rope_scaling.type == "llama3")
    rope.type("llama3")
        .factor(c.rope_scaling.factor)
        .low_freq_factor(c.rope_scaling.low_freq_factor)
        .high_freq_factor(c.rope_scaling.high_freq_factor)
        .original_max_positions(c.rope_scaling.original_max_position_embeddings);
  const bool moe = v.experts != LlamaVariant::Experts::kNone;
  LlamaOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .intermediate_size(c.intermediate_size > 0 ? c.intermediate_size : default_intermediate(c.hidden_size))
      .num_hidden_layers(c.num_hidden_layers)
      .num_attention_heads(c.num_attention_heads)
      .num_key_value_heads(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads)
      .head_dim(c.head_dim)
      .max_position_embeddings(c.max_position_embeddings)
      .rms_norm_eps(c.layer_norm_eps)
      .rope(rope)
      .attention_bias(c.attention_bias)
      .tie_word_embeddings(c.tie_word_embeddings == "true")
      .hidden_act(c.hidden_act == "auto" ? "silu" : c.hidden_act)
      .attention_dropout(c.dropout)
      .initializer_range(c.initializer_range)
      .model_type(v.model_type)
      .qkv_bias(v.qkv_bias)
      .qk_norm(v.qk_norm)
      .sliding_window(c.sliding_window)
      .fused_projections(v.fused_projections)
      .partial_rotary_factor(v.partial_rotary ? c.partial_rotary_factor : 1.0)
      .residual_dropout(v.residual_dropout ? c.dropout : 0.0);
  if (moe) {
    o.num_experts(c.num_experts > 0 ? c.num_experts : 8)
        .num_experts_per_tok(c.num_experts_per_tok)
        .moe_intermediate_size(c.moe_intermediate_size)
        .norm_topk_prob(true)
        .router_aux_loss_coef(c.router_aux_loss_coef >= 0 ? c.router_aux_loss_coef : 0.001)
        .output_router_logits(true);
    if (o.num_experts_per_tok() > o.num_experts())
      throw ConfigError(concat("model.num_experts_per_tok: ", o.num_experts_per_tok(), " exceeds model.num_experts ",
                               o.num_experts()));
  } else if (c.num_experts > 0) {
    throw ConfigError(
        concat("model.num_experts: ", v.model_type, " has no experts; ",
               types_with([](const LlamaVariant& r) { return r.experts != LlamaVariant::Experts::kNone; }), " do"));
  }
  if (c.attention_bias && !v.attention_bias_key)
    throw ConfigError(
        concat("model.attention_bias: ", v.model_type,
               v.qkv_bias ? " has biases on q, k and v (not on o_proj) by its definition" : " has no attention biases",
               "; leave the key out"));
  if (c.partial_rotary_factor != 1.0 && !v.partial_rotary)
    throw ConfigError(concat("model.partial_rotary_factor: partial rotary applies to neox and ",
                             types_with([](const LlamaVariant& r) { return r.partial_rotary; }), ", not ",
                             v.model_type));
  auto model = std::make_shared<LlamaForCausalLM>(o);
  if (moe) model->router_aux_loss_coef = o.router_aux_loss_coef();
  return model;
}

/// `sliding_window` of an HF config: `absent` when the key is missing, 0 when null.
int64_t window_key(const HfConfigReader& r, const nlohmann::json& j, int64_t absent) {
  if (!j.contains("sliding_window")) return absent;
  return j["sliding_window"].is_null() ? 0 : r.integer("sliding_window");
}

/// Qwen3-MoE's layers with a dense MLP (mlp_only_layers), as transformers reads them.
std::vector<int64_t> dense_layers(const HfConfigReader& r, int64_t layers) {
  std::vector<int64_t> dense;
  if (const auto* v = r.find("mlp_only_layers")) {
    if (!v->is_array()) r.fail("mlp_only_layers", concat("expected a list of layer indices, got ", v->dump()));
    for (const auto& i : *v) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= layers)
        r.fail("mlp_only_layers", concat("expected layer indices in [0, ", layers, "), got ", v->dump()));
      dense.push_back(i.get<int64_t>());
    }
  }
  return dense;
}

/// An HF config.json of variant `v`.
std::shared_ptr<CausalLM> from_hf(const nlohmann::json& j, const std::string& where, const LlamaVariant& v) {
  HfConfigReader r(j, where, v.display_name);
  LlamaOptions o;
  HfKeyReader keys(r);
  o.visit_hf(keys, v);
  o.model_type(v.model_type).qkv_bias(v.qkv_bias).qk_norm(v.qk_norm).fused_projections(v.fused_projections);
  if (o.hidden_size() % o.num_attention_heads() != 0 && o.head_dim() == 0)
    r.fail("num_attention_heads", concat(o.num_attention_heads(), " does not divide hidden_size ", o.hidden_size(),
                                         " and no head_dim is given"));
  if (o.num_attention_heads() % o.num_key_value_heads() != 0)
    r.fail("num_key_value_heads",
           concat(o.num_key_value_heads(), " must divide num_attention_heads ", o.num_attention_heads()));
  if (!layers::is_supported_activation(o.hidden_act()))
    r.fail("hidden_act", concat("\"", o.hidden_act(), "\" is not supported"));
  // Sliding windows as transformers reads them: Mistral's on every layer (4096
  // when the key is missing, none when null), Phi-3's on every layer when set,
  // Qwen's only with use_sliding_window and then on the layers layer_types
  // names (by default those from max_window_layers on).
  if (v.windows == LlamaVariant::Windows::kEveryLayer) o.sliding_window(window_key(r, j, v.window_default));
  if (v.experts != LlamaVariant::Experts::kNone && o.num_experts_per_tok() > o.num_experts())
    r.fail("num_experts_per_tok", concat(o.num_experts_per_tok(), " exceeds the ", o.num_experts(), " experts"));
  if (v.experts == LlamaVariant::Experts::kQwen3Moe) o.mlp_only_layers(dense_layers(r, o.num_hidden_layers()));
  if (v.windows == LlamaVariant::Windows::kQwenLayers && r.boolean("use_sliding_window", false)) {
    o.sliding_window(window_key(r, j, v.window_default));
    auto types = r.layer_types(o.num_hidden_layers());
    if (types.empty()) {
      const auto from = r.integer("max_window_layers", 28);
      for (int64_t i = 0; i < o.num_hidden_layers(); ++i)
        types.push_back(i >= from ? "sliding_attention" : "full_attention");
    }
    o.layer_types(types);
  }
  // Phi-3's RoPE without a factor: max_position_embeddings / original_max_position_embeddings.
  const auto original_max = v.original_max_positions_default > 0
                                ? r.integer("original_max_position_embeddings", v.original_max_positions_default)
                                : 0;
  auto rope = r.rope(o.dim_per_head(), 10000.0, 1.0, o.max_position_embeddings(), original_max);
  o.partial_rotary_factor(static_cast<double>(rope.rotary_dim()) / static_cast<double>(o.dim_per_head()));
  if (rope.rotary_dim() != o.dim_per_head() && !v.partial_rotary)
    r.fail("partial_rotary_factor", "partial rotary is not supported");
  o.rope(rope);
  const auto special = r.special_tokens();
  o.padding_idx(r.padding_idx(special, o.vocab_size()));
  auto model = std::make_shared<LlamaForCausalLM>(o);
  model->special_tokens = special;
  // transformers adds the load-balancing loss only with output_router_logits.
  model->router_aux_loss_coef = o.output_router_logits() ? o.router_aux_loss_coef() : 0.0;
  return model;
}

/// The registry's entry of one row: every variant reads model.head_dim, grouped-query heads and the rotary keys
/// (LLaMA 3's scaling among them), the rows whose config.json has attention_bias that key, Phi-3 partial rotary,
/// the windowed ones model.sliding_window, those with experts their keys (Mixtral's experts are intermediate_size
/// wide, Qwen3-MoE's have their own width).
ModelFamily make_family(const LlamaVariant& v) {
  ModelFamily f{v.model_type, v.model_type, [&v](const config::ModelConfig& c) { return from_typed_config(c, v); },
                [&v](const nlohmann::json& j, const std::string& where) { return from_hf(j, where, v); }};
  if (v.experts == LlamaVariant::Experts::kQwen3Moe) f.config_keys.push_back("model.moe_intermediate_size");
  f.config_keys.insert(f.config_keys.end(),
                       {"model.num_key_value_heads", "model.rope_theta", "model.rope_scaling.type",
                        "model.rope_scaling.factor", "model.rope_scaling.low_freq_factor",
                        "model.rope_scaling.high_freq_factor", "model.rope_scaling.original_max_position_embeddings"});
  if (v.attention_bias_key) f.config_keys.push_back("model.attention_bias");
  if (v.partial_rotary) f.config_keys.push_back("model.partial_rotary_factor");
  f.config_keys.push_back("model.head_dim");
  if (v.windows != LlamaVariant::Windows::kNone) f.config_keys.push_back("model.sliding_window");
  if (v.experts != LlamaVariant::Experts::kNone)
    f.config_keys.insert(f.config_keys.end(),
                         {"model.num_experts", "model.num_experts_per_tok", "model.router_aux_loss_coef"});
  return f;
}

}  // namespace

std::vector<ModelFamily> families() {
  std::vector<ModelFamily> out;
  for (const auto& v : variants()) out.push_back(make_family(v));
  return out;
}

}  // namespace anvil::models::llama
