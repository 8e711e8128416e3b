#include "anvil/models/registry.h"

#include <optional>
#include <set>

#include "config/hf_names.h"
#include "models/init.h"

#include <ATen/ATen.h>

#include "anvil/core/error.h"

namespace anvil::models {
namespace gpt2 {
ModelFamily family();
}
namespace llama {
std::vector<ModelFamily> families();  // a row each (llama/variants.cpp)
}  // namespace llama
namespace gemma {
ModelFamily gemma2_family();
ModelFamily gemma3_family();
}  // namespace gemma
namespace neox {
ModelFamily family();
}
namespace opt {
ModelFamily family();
}

namespace {

/// The model section as a config.json: each key the family reads under its own name and every other name
/// families give it (config/hf_names.h; the family's list reads its own: GPT-2 n_embd, OPT ffn_dim, LLaMA
/// rms_norm_eps), with the section's "the family's default" values (auto, 0) left out or resolved as the
/// section's docs say. `reads`: whether the family reads a key that only some families do.
nlohmann::json section_as_hf_config(const config::ModelConfig& c, const std::function<bool(const char*)>& reads) {
  nlohmann::json j;
  const auto put = [&j](const char* key, const nlohmann::json& value) {
    j[key] = value;
    for (const auto& n : config::model_hf_names())
      if (std::string(n.key) == key) j[n.name] = value;
  };
  put("vocab_size", c.vocab_size);
  put("hidden_size", c.hidden_size);
  put("num_hidden_layers", c.num_hidden_layers);
  put("num_attention_heads", c.num_attention_heads);
  put("max_position_embeddings", c.max_position_embeddings);
  if (c.intermediate_size > 0) put("intermediate_size", c.intermediate_size);
  if (c.hidden_act != "auto") put("hidden_act", c.hidden_act);
  if (c.tie_word_embeddings != config::Tied::kAuto)
    put("tie_word_embeddings", c.tie_word_embeddings == config::Tied::kTrue);
  put("dropout", c.dropout);
  put("initializer_range", c.initializer_range);
  const auto& norm = c.keys.get<NormKeys>();
  const auto& att = c.keys.get<AttentionKeys>();
  const auto& rot = c.keys.get<RotaryKeys>();
  const auto& moe = c.keys.get<ExpertKeys>();
  if (reads("model.layer_norm_eps")) put("layer_norm_eps", norm.layer_norm_eps);
  if (reads("model.num_key_value_heads") && att.num_key_value_heads > 0)
    put("num_key_value_heads", att.num_key_value_heads);
  if (reads("model.head_dim")) put("head_dim", att.head_dim_of(c));
  if (reads("model.attention_bias")) put("attention_bias", att.attention_bias);
  if (reads("model.sliding_window"))
    put("sliding_window", att.sliding_window > 0 ? nlohmann::json(att.sliding_window) : nlohmann::json(nullptr));
  if (reads("model.rope_theta")) put("rope_theta", rot.rope_theta);
  if (reads("model.rope_scaling.type") && rot.rope_scaling.type == RopeScaling::kLlama3)
    put("rope_scaling", {{"rope_type", "llama3"},
                         {"factor", rot.rope_scaling.factor},
                         {"low_freq_factor", rot.rope_scaling.low_freq_factor},
                         {"high_freq_factor", rot.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rot.rope_scaling.original_max_position_embeddings}});
  if (reads("model.partial_rotary_factor")) put("partial_rotary_factor", rot.partial_rotary_factor);
  if (reads("model.num_experts")) {
    put("num_experts", moe.num_experts > 0 ? moe.num_experts : 8);
    put("num_experts_per_tok", moe.num_experts_per_tok);
    // A model built from keys always adds the load-balancing loss (0.001 unless set).
    put("router_aux_loss_coef", moe.router_aux_loss_coef >= 0 ? moe.router_aux_loss_coef : 0.001);
    put("output_router_logits", true);
  }
  if (reads("model.moe_intermediate_size") && moe.moe_intermediate_size > 0)
    put("moe_intermediate_size", moe.moe_intermediate_size);
  return j;
}

/// `f` with from_config made from its from_hf_config; `partial`: the keys only some families read.
ModelFamily with_section_builder(ModelFamily f, const std::set<std::string>& partial) {
  if (f.from_config) return f;  // a family that builds from the section itself
  std::set<std::string> own(f.config_keys.begin(), f.config_keys.end());
  f.from_config = [reads = [partial, own](const char* key) { return !partial.count(key) || own.count(key); },
                   defaults = f.section_defaults, build = f.from_hf_config,
                   model_type = f.model_type](const config::ModelConfig& c) {
    auto j = section_as_hf_config(c, reads);
    j["model_type"] = model_type;
    if (defaults) defaults(c, j);
    try {
      return build(j, "model section (read as a config.json)");
    } catch (const CheckpointError& e) {
      throw ConfigError(e.what());  // the config's values, not a folder's
    }
  };
  return f;
}

// One line per family; LLaMA's variants are rows of llama/variants.cpp, one line for all.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> all = [] {
    std::vector<ModelFamily> out = {gpt2::family()};
    // LLaMA, Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), Mistral (sliding windows), Phi-3 (fused
    // projections, LongRoPE), Mixtral and Qwen3-MoE (experts): a row each of llama::variants().
    for (auto& f : llama::families()) out.push_back(std::move(f));
    for (auto f : {gemma::gemma2_family(), gemma::gemma3_family(), neox::family(), opt::family()})
      out.push_back(std::move(f));
    std::set<std::string> partial;
    for (const auto& f : out) partial.insert(f.config_keys.begin(), f.config_keys.end());
    for (auto& f : out) f = with_section_builder(std::move(f), partial);
    return out;
  }();
  return all;
}
}  // namespace

const ModelFamily& family_by_name(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return f;
  std::string known;
  for (const auto& n : family_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(concat("model.family: unknown family \"", name, "\"; expected one of ", known));
}

const ModelFamily& family_by_hf_model_type(const std::string& model_type, const std::string& where) {
  for (const auto& f : families())
    if (f.model_type == model_type) return f;
  std::string known;
  for (const auto& f : families()) known += (known.empty() ? "" : ", ") + f.model_type;
  throw CheckpointError(concat(where, ": model_type \"", model_type, "\" is not supported; supported: ", known));
}

// The config layer learns the key groups, the families, their keys and checks from here:
// model.family accepts these names and no others (config/ names none).
const bool kRegisteredWithConfig = [] {
  for (auto& g : key_groups()) config::add_model_key_group(std::move(g));  // before the families that read them
  for (const auto& f : families()) config::add_model_family({f.name, f.config_keys, f.check, f.own_keys});
  return true;
}();

std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.push_back(f.name);
  return out;
}

std::shared_ptr<CausalLM> clone_model(CausalLM& model) {
  const auto config = model.hf_config();
  const auto ref = model.parameters().front();
  // Every value is copied (or, for a model built without storage, read from the same source when sharded):
  // nothing is drawn.
  const bool deferred = has_deferred(model);
  std::optional<DeferredInitGuard> defer;
  std::optional<SkipInitGuard> skip;
  if (deferred)
    defer.emplace(ref.device());
  else
    skip.emplace();
  auto copy = family_by_hf_model_type(config.at("model_type").get<std::string>(), "clone_model")
                  .from_hf_config(config, "clone_model");
  if (model.has_score_head()) copy->add_score_head();
  auto src = model.named_parameters();
  at::NoGradGuard no_grad;
  if (deferred) {
    copy->parameter_source = model.parameter_source;
    for (auto& p : copy->named_parameters())  // the score head: LibTorch's, real
      if (!is_deferred(p.value())) p.value().copy_(src[p.key()]);
  } else {
    copy->to(ref.device(), ref.scalar_type());
    for (auto& p : copy->named_parameters()) p.value().copy_(src[p.key()]);
  }
  copy->special_tokens = model.special_tokens;
  copy->train(model.is_training());
  return copy;
}

}  // namespace anvil::models
