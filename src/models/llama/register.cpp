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

/// Our typed config as `model_type` (llama, qwen2, qwen3, mistral, phi3) shapes it.
std::shared_ptr<CausalLM> from_typed_config(const config::ModelConfig& c, const std::string& model_type) {
  layers::RopeOptions rope;
  rope.theta(c.rope_theta);
  if (c.rope_scaling.type == "llama3")
    rope.type("llama3")
        .factor(c.rope_scaling.factor)
        .low_freq_factor(c.rope_scaling.low_freq_factor)
        .high_freq_factor(c.rope_scaling.high_freq_factor)
        .original_max_positions(c.rope_scaling.original_max_position_embeddings);
  const bool phi3 = model_type == "phi3", moe = model_type == "mixtral" || model_type == "qwen3_moe";
  LlamaOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .intermediate_size(c.intermediate_size > 0 ? c.intermediate_size : default_intermediate(c.hidden_size))
      .num_hidden_layers(c.num_layers)
      .num_attention_heads(c.num_heads)
      .num_key_value_heads(c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads)
      .head_dim(c.head_dim)
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
      .qk_norm(model_type == "qwen3" || model_type == "qwen3_moe")
      .sliding_window(c.sliding_window)
      .fused_projections(phi3)
      .partial_rotary_factor(phi3 ? c.rotary_pct : 1.0)
      .residual_dropout(phi3 ? c.dropout : 0.0);
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
    throw ConfigError(concat("model.num_experts: ", model_type, " has no experts; mixtral and qwen3_moe do"));
  }
  if (c.attention_bias && (model_type == "qwen2" || model_type == "mistral" || model_type == "mixtral" || phi3))
    throw ConfigError(concat("model.attention_bias: ", model_type,
                             model_type == "qwen2" ? " has biases on q, k and v (not on o_proj) by its definition"
                                                   : " has no attention biases",
                             "; leave the key out"));
  if (c.rotary_pct != 1.0 && !phi3)
    throw ConfigError(concat("model.rotary_pct: partial rotary applies to neox and phi3, not ", model_type));
  auto model = std::make_shared<LlamaForCausalLM>(o);
  if (moe) model->router_aux_loss_coef = o.router_aux_loss_coef();
  return model;
}

/// The reader's name of a model_type, for messages.
const char* display_name(const std::string& t) {
  return t == "qwen2"       ? "Qwen2"
         : t == "qwen3"     ? "Qwen3"
         : t == "qwen3_moe" ? "Qwen3-MoE"
         : t == "mistral"   ? "Mistral"
         : t == "mixtral"   ? "Mixtral"
         : t == "phi3"      ? "Phi-3"
                            : "LLaMA";
}

/// `sliding_window` of an HF config: `absent` when the key is missing, 0 when null.
int64_t window_key(const HfConfigReader& r, const nlohmann::json& j, int64_t absent) {
  if (!j.contains("sliding_window")) return absent;
  return j["sliding_window"].is_null() ? 0 : r.integer("sliding_window");
}

/// The experts of an HF config.json of model_type mixtral or qwen3_moe, as transformers reads them.
void read_experts(const HfConfigReader& r, const nlohmann::json& j, LlamaOptions& o, bool mixtral) {
  // Qwen3MoeConfig writes num_local_experts since transformers 5; the Hub's folders say num_experts.
  const char* experts =
      mixtral || (!j.contains("num_experts") && j.contains("num_local_experts")) ? "num_local_experts" : "num_experts";
  o.num_experts(r.integer(experts, mixtral ? 8 : 128))
      .num_experts_per_tok(r.integer("num_experts_per_tok", mixtral ? 2 : 8))
      .router_aux_loss_coef(r.number("router_aux_loss_coef", 0.001))
      .output_router_logits(r.boolean("output_router_logits", false));
  if (o.num_experts_per_tok() > o.num_experts())
    r.fail("num_experts_per_tok", concat(o.num_experts_per_tok(), " exceeds the ", o.num_experts(), " experts"));
  if (mixtral) {
    o.router_jitter_noise(r.number("router_jitter_noise", 0.0, HfConfigReader::Bound::probability));
    return;
  }
  o.moe_intermediate_size(r.integer("moe_intermediate_size", 768))
      .norm_topk_prob(r.boolean("norm_topk_prob", false))
      .decoder_sparse_step(r.integer("decoder_sparse_step", 1));
  std::vector<int64_t> dense;
  if (const auto* v = r.find("mlp_only_layers")) {
    if (!v->is_array()) r.fail("mlp_only_layers", concat("expected a list of layer indices, got ", v->dump()));
    for (const auto& i : *v) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= o.num_hidden_layers())
        r.fail("mlp_only_layers",
               concat("expected layer indices in [0, ", o.num_hidden_layers(), "), got ", v->dump()));
      dense.push_back(i.get<int64_t>());
    }
  }
  o.mlp_only_layers(dense);
}

/// An HF config.json of `model_type` llama, qwen2, qwen3, mistral, phi3, mixtral or qwen3_moe.
std::shared_ptr<CausalLM> from_hf(const nlohmann::json& j, const std::string& where, const std::string& model_type) {
  const bool qwen2 = model_type == "qwen2", qwen3 = model_type == "qwen3" || model_type == "qwen3_moe",
             llama = model_type == "llama", phi3 = model_type == "phi3", mixtral = model_type == "mixtral";
  HfConfigReader r(j, where, display_name(model_type));
  LlamaOptions o;
  o.vocab_size(r.integer("vocab_size"))
      .hidden_size(r.integer("hidden_size"))
      .intermediate_size(r.integer("intermediate_size"))
      .num_hidden_layers(r.integer("num_hidden_layers"))
      .num_attention_heads(r.integer("num_attention_heads"));
  o.num_key_value_heads(r.integer("num_key_value_heads", o.num_attention_heads()))
      .head_dim(qwen2 ? 0 : r.integer("head_dim", model_type == "qwen3" ? 128 : 0))  // Qwen3Config's default is 128
      .max_position_embeddings(r.integer("max_position_embeddings", 2048))
      .rms_norm_eps(r.number("rms_norm_eps", phi3 ? 1e-5 : 1e-6, HfConfigReader::Bound::positive))
      .attention_bias(llama || qwen3 ? r.boolean("attention_bias", false) : false)
      .mlp_bias(llama ? r.boolean("mlp_bias", false) : false)
      .model_type(model_type)
      .qkv_bias(qwen2)
      .qk_norm(qwen3)
      .fused_projections(phi3)
      .residual_dropout(phi3 ? r.number("resid_pdrop", 0.0, HfConfigReader::Bound::probability) : 0.0)
      .tie_word_embeddings(r.boolean("tie_word_embeddings", false))
      .hidden_act(r.string("hidden_act", "silu"))
      .attention_dropout(r.number("attention_dropout", 0.0, HfConfigReader::Bound::probability))
      .initializer_range(r.number("initializer_range", 0.02));
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
  if (model_type == "mistral") o.sliding_window(window_key(r, j, 4096));
  if (mixtral) o.sliding_window(window_key(r, j, 0));
  if (mixtral || model_type == "qwen3_moe") read_experts(r, j, o, mixtral);
  if (phi3) o.sliding_window(window_key(r, j, 0));
  if ((qwen2 || qwen3) && r.boolean("use_sliding_window", false)) {
    o.sliding_window(window_key(r, j, 4096));
    auto types = r.layer_types(o.num_hidden_layers());
    if (types.empty()) {
      const auto from = r.integer("max_window_layers", 28);
      for (int64_t i = 0; i < o.num_hidden_layers(); ++i)
        types.push_back(i >= from ? "sliding_attention" : "full_attention");
    }
    o.layer_types(types);
  }
  // Phi-3's RoPE without a factor: max_position_embeddings / original_max_position_embeddings.
  const auto original_max = phi3 ? r.integer("original_max_position_embeddings", 4096) : 0;
  auto rope = r.rope(o.dim_per_head(), 10000.0, 1.0, o.max_position_embeddings(), original_max);
  o.partial_rotary_factor(static_cast<double>(rope.rotary_dim()) / static_cast<double>(o.dim_per_head()));
  if (rope.rotary_dim() != o.dim_per_head() && !phi3)
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

template <const char* Type>
ModelFamily make_family(std::vector<std::string> keys) {
  ModelFamily f{Type, Type, [](const config::ModelConfig& c) { return from_typed_config(c, Type); },
                [](const nlohmann::json& j, const std::string& where) { return from_hf(j, where, Type); }};
  f.config_keys = std::move(keys);
  return f;
}
// The keys of the model section that only some families read. Functions, not
// namespace-scope vectors: the registry reads them during static
// initialisation (src/models/registry.cpp), perhaps before this file's.
std::vector<std::string> windowed() { return {"model.head_dim", "model.sliding_window"}; }
std::vector<std::string> experts(std::vector<std::string> more) {
  more.insert(more.end(), {"model.head_dim", "model.sliding_window", "model.num_experts", "model.num_experts_per_tok",
                           "model.router_aux_loss_coef"});
  return more;
}
constexpr char kLlama[] = "llama", kQwen2[] = "qwen2", kQwen3[] = "qwen3", kMistral[] = "mistral", kPhi3[] = "phi3",
               kMixtral[] = "mixtral", kQwen3Moe[] = "qwen3_moe";

}  // namespace

ModelFamily family() { return make_family<kLlama>({"model.head_dim"}); }
ModelFamily qwen2_family() { return make_family<kQwen2>(windowed()); }
ModelFamily qwen3_family() { return make_family<kQwen3>(windowed()); }
ModelFamily mistral_family() { return make_family<kMistral>(windowed()); }
ModelFamily phi3_family() { return make_family<kPhi3>(windowed()); }
// Mixtral's experts are intermediate_size wide; Qwen3-MoE's have their own width.
ModelFamily mixtral_family() { return make_family<kMixtral>(experts({})); }
ModelFamily qwen3_moe_family() { return make_family<kQwen3Moe>(experts({"model.moe_intermediate_size"})); }

}  // namespace anvil::models::llama
