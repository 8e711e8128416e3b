// The registry entries of Gemma 2 (gemma2) and Gemma 3's text model
// (gemma3_text): HF config.json (our model section as one) maps onto GemmaOptions.
#include "../hf_config_reader.h"
#include "models/gemma/gemma.h"
#include "anvil/models/registry.h"

namespace anvil::models::gemma {
namespace {

/// Gemma 2's layers alternate, sliding first; Gemma 3 has 5 sliding layers to a global one.
std::vector<std::string> default_layer_types(int64_t n, int64_t pattern) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  return out;
}

/// A soft-cap: `def` when the key is missing, 0 (none) when null.
double softcap(const HfConfigReader& r, const nlohmann::json& j, const char* key, double def) {
  if (!j.contains(key)) return def;
  return j[key].is_null() ? 0.0 : r.number(key, def, HfConfigReader::Bound::positive);
}

/// One rope_parameters entry of Gemma 3 (default or linear).
layers::RopeOptions rope_of(const nlohmann::json& entry, const std::string& where, double default_theta) {
  if (!entry.is_object()) throw CheckpointError(concat(where, ": expected an object, got ", entry.dump()));
  HfConfigReader sub(entry, where, "Gemma 3");
  layers::RopeOptions o;
  o.theta(sub.number("rope_theta", default_theta, HfConfigReader::Bound::positive));
  const auto type = sub.string("rope_type", sub.string("type", "default"));
  if (type == "linear")
    o.type("linear").factor(sub.number("factor", 1.0, HfConfigReader::Bound::positive));
  else if (type != "default")
    sub.fail("rope_type", concat("\"", type, "\" is not supported for Gemma 3; supported: default, linear"));
  return o;
}

/// An HF config.json of `model_type` gemma2 or gemma3_text.
std::shared_ptr<CausalLM> from_hf(const nlohmann::json& j, const std::string& where, const std::string& model_type) {
  const bool g3 = model_type == "gemma3_text";
  HfConfigReader r(j, where, g3 ? "Gemma 3" : "Gemma 2");
  GemmaOptions o;
  o.model_type(model_type);
  HfKeyReader keys(r);
  o.visit_hf(keys);
  o.query_pre_attn_scalar(r.number("query_pre_attn_scalar", 256, HfConfigReader::Bound::positive))
      // transformers' Gemma 3 reads attn_logit_softcapping but never applies it (its attention passes no softcap).
      .attn_logit_softcapping(g3 ? 0.0 : softcap(r, j, "attn_logit_softcapping", 50.0))
      .final_logit_softcapping(softcap(r, j, "final_logit_softcapping", g3 ? 0.0 : 30.0))
      .qk_norm(g3);
  if (o.num_attention_heads() % o.num_key_value_heads() != 0)
    r.fail("num_key_value_heads",
           concat(o.num_key_value_heads(), " must divide num_attention_heads ", o.num_attention_heads()));
  if (!layers::is_supported_activation(o.hidden_act()))
    r.fail("hidden_activation", concat("\"", o.hidden_act(), "\" is not supported"));
  if (r.boolean("use_bidirectional_attention", false))
    r.fail("use_bidirectional_attention", "bidirectional (embedding) Gemma models are not causal LMs");
  auto types = r.layer_types(o.num_hidden_layers());
  if (types.empty())
    types = default_layer_types(o.num_hidden_layers(), g3 ? r.integer("sliding_window_pattern", 6) : 2);
  o.layer_types(types);
  if (!g3) {
    auto rope = r.rope(o.head_dim(), 10000.0, 1.0);
    if (rope.rotary_dim() != o.head_dim()) r.fail("partial_rotary_factor", "partial rotary is not supported");
    o.rope(rope).local_rope(rope);
  } else {
    // transformers 5: rope_parameters per layer type; transformers 4: rope_theta + rope_scaling (global) and
    // rope_local_base_freq (sliding).
    const auto* params = r.find("rope_parameters");
    if (params && params->is_object() && params->contains("full_attention")) {
      o.rope(rope_of((*params)["full_attention"], where + ": rope_parameters.full_attention", 1e6));
      o.local_rope(params->contains("sliding_attention")
                       ? rope_of((*params)["sliding_attention"], where + ": rope_parameters.sliding_attention", 1e4)
                       : layers::RopeOptions().theta(1e4));
    } else {
      auto global = params ? rope_of(*params, where + ": rope_parameters", r.number("rope_theta", 1e6))
                           : layers::RopeOptions().theta(r.number("rope_theta", 1e6, HfConfigReader::Bound::positive));
      if (const auto* s = r.find("rope_scaling")) global = rope_of(*s, where + ": rope_scaling", global.theta());
      o.rope(global);
      o.local_rope(
          layers::RopeOptions().theta(r.number("rope_local_base_freq", 10000.0, HfConfigReader::Bound::positive)));
    }
  }
  const auto special = r.special_tokens();
  o.padding_idx(r.padding_idx(special, o.vocab_size()));
  auto model = std::make_shared<GemmaForCausalLM>(o);
  model->special_tokens = special;
  return model;
}

template <const char* Type>
ModelFamily make_family() {
  ModelFamily f{
      Type, Type, {}, [](const nlohmann::json& j, const std::string& where) { return from_hf(j, where, Type); }};
  // A model built from keys: scores scaled by head_dim^-1/2, and without a window every position fits (the
  // sliding layers see everything); Gemma 2's soft-caps (50 on scores, 30 on logits), Gemma 3's q/k norms and
  // local RoPE base 10000 are the config classes' defaults.
  f.section_defaults = [](const config::ModelConfig& c, nlohmann::json& hf) {
    if (c.intermediate_size == 0) hf["intermediate_size"] = 4 * c.hidden_size;
    hf["query_pre_attn_scalar"] = hf.at("head_dim");
    if (c.keys.get<AttentionKeys>().sliding_window == 0) hf["sliding_window"] = c.max_position_embeddings;
  };
  // Of the keys only some families read.
  f.config_keys = {"model.layer_norm_eps", "model.num_key_value_heads", "model.head_dim",
                   "model.attention_bias", "model.rope_theta",          "model.sliding_window"};
  return f;
}
constexpr char kGemma2[] = "gemma2", kGemma3[] = "gemma3_text";

}  // namespace

ModelFamily gemma2_family() { return make_family<kGemma2>(); }
ModelFamily gemma3_family() { return make_family<kGemma3>(); }

}  // namespace anvil::models::gemma
