#pragma once
// Model families by name, and the model keys only some of them read. Each
// family registers itself with one line in src/models/registry.cpp; shared
// code never switches on the architecture.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"

namespace anvil::models {

// The model section's keys that several families read but not every one, in
// groups by what they shape: normalisation, attention, rotary positions and
// experts. Each is registered once (config::ModelKeyGroup) and named by the
// families that read it (ModelFamily::config_keys); a family's keys that no
// other family reads are its own group (OPT's, NeoX's). A program sets them
// in code as cfg.model.keys.get<models::RotaryKeys>().rope_theta = 5e5.

/// model.layer_norm_eps (OPT's LayerNorms are always 1e-5).
struct NormKeys {
  static constexpr const char* kGroup = "norm";
  double layer_norm_eps = 1e-5;
  void visit(config::FieldVisitor& v);
};

/// Grouped-query attention, head width, projection biases and sliding windows.
struct AttentionKeys {
  static constexpr const char* kGroup = "attention";
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  bool attention_bias = false;
  int64_t sliding_window = 0;
  void visit(config::FieldVisitor& v);
  /// head_dim, or hidden_size / num_attention_heads when it is 0.
  int64_t head_dim_of(const config::ModelConfig& c) const;
};

/// Rotary frequency scaling (model.rope_scaling.type).
enum class RopeScaling { kNone, kLlama3 };
inline const config::Choices<RopeScaling> kRopeScalings{{"none", RopeScaling::kNone}, {"llama3", RopeScaling::kLlama3}};

/// LLaMA-3.1 rotary frequency scaling (HF rope_type "llama3").
struct RopeScalingConfig {
  RopeScaling type = RopeScaling::kNone;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  void visit(config::FieldVisitor& v);
};

/// Rotary position embeddings: base, scaling and the fraction of each head that rotates.
struct RotaryKeys {
  static constexpr const char* kGroup = "rotary";
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  double partial_rotary_factor = 1.0;
  void visit(config::FieldVisitor& v);
};

/// A mixture of experts: how many, how many per token, their width and the load-balancing loss.
struct ExpertKeys {
  static constexpr const char* kGroup = "experts";
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;
  double router_aux_loss_coef = -1;
  void visit(config::FieldVisitor& v);
};

/// The groups above, in the order the model section lists them, with their
/// checks of a model built from keys (the registry registers them before the
/// families).
std::vector<config::ModelKeyGroup> key_groups();

struct ModelFamily {
  std::string name;        // our config's model.family
  std::string model_type;  // HF config.json "model_type"
  /// Random-init model from our typed config (vocab_size already resolved).
  /// The registry makes it: the model section becomes a config.json under
  /// the family's names (hidden_size is GPT-2's n_embd, dropout its three
  /// *_pdrop), section_defaults adds the family's own, and from_hf_config
  /// builds it, so one key list per family reads both.
  std::function<std::shared_ptr<CausalLM>(const config::ModelConfig&)> from_config;
  /// Model shaped by an HF config.json; `where` names the file for errors.
  std::function<std::shared_ptr<CausalLM>(const nlohmann::json&, const std::string& where)> from_hf_config;
  /// What a model built from the section's keys takes where the section
  /// leaves a value to the family and transformers' default differs (LLaMA:
  /// intermediate_size 0 is Meta's SwiGLU width, not LlamaConfig's 11008), and
  /// the family's own keys under their config.json names; may throw
  /// ConfigError for a key the family does not read.
  std::function<void(const config::ModelConfig& model, nlohmann::json& hf)> section_defaults = {};
  /// Its HF modules store linear weights as (in, out), GPT-2's Conv1D: PEFT
  /// adapters of it say fan_in_fan_out.
  bool conv1d_weights = false;
  /// The keys of the groups several families share (models/registry.h) that it
  /// reads ("model.sliding_window"), and its own checks of a model built from
  /// keys: the registry hands them, with its own keys below, to the config
  /// layer (config::add_model_family), so a config sets only what its family
  /// reads.
  std::vector<std::string> config_keys = {};
  std::function<void(const config::ModelConfig& model, const config::Checks& checks)> check = {};
  /// Keys that are its alone (config::family_keys<T>()), in the model
  /// section beside the groups'; section_defaults reads them with
  /// model.keys.get<T>(name).
  std::function<std::unique_ptr<config::Extension>()> own_keys = {};
};

const ModelFamily& family_by_name(const std::string& name);
const ModelFamily& family_by_hf_model_type(const std::string& model_type, const std::string& where);
std::vector<std::string> family_names();

/// An independent copy of `model` (same family, shape, heads, weights, device
/// and dtype), e.g. DPO's frozen reference.
std::shared_ptr<CausalLM> clone_model(CausalLM& model);

}  // namespace anvil::models
