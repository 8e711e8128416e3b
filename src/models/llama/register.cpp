// The registry entries of LLaMA and the families that are options of its code
// (qwen2, qwen3, mistral, phi3, and the mixture-of-experts mixtral and
// qwen3_moe): HF config.json (our model section as one) maps onto LlamaOptions.
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

/// What a model of variant `v` built from the model section's keys takes beyond the section's values, and the
/// section's keys `v` does not read, named with the variants that do.
void section_defaults(const config::ModelConfig& c, const LlamaVariant& v, nlohmann::json& hf) {
  const bool moe = v.experts != LlamaVariant::Experts::kNone;
  const auto& experts = c.keys.get<ExpertKeys>();
  const auto& attention = c.keys.get<AttentionKeys>();
  if (experts.num_experts > 0 && !moe)
    throw ConfigError(
        concat("model.num_experts: ", v.model_type, " has no experts; ",
               types_with([](const LlamaVariant& r) { return r.experts != LlamaVariant::Experts::kNone; }), " do"));
  if (attention.attention_bias && !v.attention_bias_key)
    throw ConfigError(
        concat("model.attention_bias: ", v.model_type,
               v.qkv_bias ? " has biases on q, k and v (not on o_proj) by its definition" : " has no attention biases",
               "; leave the key out"));
  if (c.keys.get<RotaryKeys>().partial_rotary_factor != 1.0 && !v.partial_rotary)
    throw ConfigError(concat("model.partial_rotary_factor: partial rotary applies to neox and ",
                             types_with([](const LlamaVariant& r) { return r.partial_rotary; }), ", not ",
                             v.model_type));
  if (moe && experts.num_experts_per_tok > hf.at("num_experts").get<int64_t>())
    throw ConfigError(concat("model.num_experts_per_tok: ", experts.num_experts_per_tok, " exceeds model.num_experts ",
                             hf.at("num_experts").get<int64_t>()));
  if (c.intermediate_size == 0) hf["intermediate_size"] = default_intermediate(c.hidden_size);
  if (moe) hf["norm_topk_prob"] = true;
  if (moe && experts.moe_intermediate_size == 0) hf["moe_intermediate_size"] = hf["intermediate_size"];
  // A window from the section is on every layer.
  if (v.windows == LlamaVariant::Windows::kQwenLayers && attention.sliding_window > 0) {
    hf["use_sliding_window"] = true;
    hf["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.num_hidden_layers), "sliding_attention");
  }
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

/// The registry's entry of one row: every variant reads grouped-query heads and the rotary keys
/// (LLaMA 3's scaling among them), the rows whose config.json has head_dim or attention_bias those (Qwen2's
/// heads are hidden_size / num_attention_heads wide), Phi-3 partial rotary,
/// the windowed ones model.sliding_window, those with experts their keys (Mixtral's experts are intermediate_size
/// wide, Qwen3-MoE's have their own width).
ModelFamily make_family(const LlamaVariant& v) {
  ModelFamily f{v.model_type, v.model_type, {}, [&v](const nlohmann::json& j, const std::string& where) {
                  return from_hf(j, where, v);
                }};
  f.section_defaults = [&v](const config::ModelConfig& c, nlohmann::json& hf) { section_defaults(c, v, hf); };
  if (v.experts == LlamaVariant::Experts::kQwen3Moe) f.config_keys.push_back("model.moe_intermediate_size");
  f.config_keys.insert(f.config_keys.end(),
                       {"model.layer_norm_eps", "model.num_key_value_heads", "model.rope_theta",
                        "model.rope_scaling.type", "model.rope_scaling.factor", "model.rope_scaling.low_freq_factor",
                        "model.rope_scaling.high_freq_factor", "model.rope_scaling.original_max_position_embeddings"});
  if (v.attention_bias_key) f.config_keys.push_back("model.attention_bias");
  if (v.partial_rotary) f.config_keys.push_back("model.partial_rotary_factor");
  if (v.head_dim_key) f.config_keys.push_back("model.head_dim");
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
