#include "anvil/models/registry.h"

#include "anvil/config/config.h"
#include "anvil/core/error.h"

namespace anvil::models {

void NormKeys::visit(config::FieldVisitor& v) {
  v.field("layer_norm_eps", layer_norm_eps, "LayerNorm / RMSNorm epsilon.", config::positive());
}

void AttentionKeys::visit(config::FieldVisitor& v) {
  v.field("num_key_value_heads", num_key_value_heads,
          "Key/value heads for grouped-query attention; must divide num_attention_heads. 0 = "
          "num_attention_heads.",
          config::renamed_from("num_kv_heads", config::non_negative()));
  v.field("head_dim", head_dim,
          "Width of each attention head when it is not hidden_size / num_attention_heads (Qwen3: 128); 0 = "
          "hidden_size / num_attention_heads.",
          config::non_negative());
  v.field("attention_bias", attention_bias, "Biases on the q, k, v and o projections (LLaMA's attention_bias).");
  v.field("sliding_window", sliding_window,
          "Each token attends to this many latest positions (its own included) on every layer, in training, "
          "packing and the KV cache alike; 0 = full attention.",
          config::non_negative());
}

int64_t AttentionKeys::head_dim_of(const config::ModelConfig& c) const {
  return head_dim > 0 ? head_dim : c.hidden_size / c.num_attention_heads;
}

void RopeScalingConfig::visit(config::FieldVisitor& v) {
  config::enum_field(v, "type", type, "none, or llama3 (LLaMA 3.1 long-context scaling).", kRopeScalings,
                     kRopeScalings.rule());
  v.field("factor", factor, "Slow-down of the long wavelengths.", config::positive());
  v.field("low_freq_factor", low_freq_factor, "Wavelengths above original / low_freq_factor are scaled.",
          config::positive());
  v.field("high_freq_factor", high_freq_factor, "Wavelengths below original / high_freq_factor are kept.",
          config::positive());
  v.field("original_max_position_embeddings", original_max_position_embeddings,
          "Context length the frequencies were trained for.", config::positive());
}

void RotaryKeys::visit(config::FieldVisitor& v) {
  v.field("rope_theta", rope_theta, "Rotary base (theta).", config::positive());
  v.section("rope_scaling", rope_scaling, "Rotary frequency scaling.");
  v.field("partial_rotary_factor", partial_rotary_factor,
          "Fraction of each head's dims that rotate (Pythia: 0.25, its config.json's rotary_pct).",
          config::renamed_from("rotary_pct",
                               config::Rule{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }, {}}));
}

void ExpertKeys::visit(config::FieldVisitor& v) {
  v.field("num_experts", num_experts, "Experts per sparse layer (HF num_local_experts / num_experts); 0 = 8.",
          config::non_negative());
  v.field("num_experts_per_tok", num_experts_per_tok, "Experts each token is routed to (top-k).", config::positive());
  v.field("moe_intermediate_size", moe_intermediate_size,
          "Each expert's MLP width; 0 = intermediate_size (Mixtral's experts are intermediate_size wide).",
          config::non_negative());
  v.field("router_aux_loss_coef", router_aux_loss_coef,
          "Weight of the load-balancing loss (transformers' load_balancing_loss_func, logged as moe/aux_loss) "
          "that every objective adds to its loss. -1 = as the model says: a folder's router_aux_loss_coef when "
          "its output_router_logits is true, else 0 (transformers' rule); 0.001 for a model built from these "
          "keys. May be set with model.from.",
          config::Rule{"-1 or a number >= 0", [](double x) { return x == -1 || x >= 0; }, {}});
}

namespace {

/// The heads of a model built from keys: query heads divide the width unless head_dim sets it, and key/value
/// heads divide the query heads.
void check_heads(const config::ModelConfig& c, const config::Checks& checks) {
  const auto& a = c.keys.get<AttentionKeys>();
  if (a.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
    checks.fail("model.num_attention_heads",
                concat("expected a divisor of model.hidden_size (", c.hidden_size, "), got ", c.num_attention_heads));
  if (a.num_key_value_heads > 0 && c.num_attention_heads % a.num_key_value_heads != 0)
    checks.fail("model.num_key_value_heads", concat("expected a divisor of model.num_attention_heads (",
                                                    c.num_attention_heads, "), got ", a.num_key_value_heads));
}

}  // namespace

std::vector<config::ModelKeyGroup> key_groups() {
  return {config::model_key_group<NormKeys>(), config::model_key_group<AttentionKeys>(check_heads),
          config::model_key_group<RotaryKeys>(), config::model_key_group<ExpertKeys>()};
}

}  // namespace anvil::models
