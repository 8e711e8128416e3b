#pragma once
// Model families by name. Each family registers itself with one line in
// src/models/registry.cpp; shared code never switches on the architecture.

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"

namespace anvil::models {

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
  /// The model keys it reads among those several families share
  /// ("model.sliding_window"), and its own checks of a model built from keys:
  /// the registry hands them, with its own keys below, to the config layer
  /// (config::add_model_family), so a config sets only what its family reads.
  std::vector<std::string> config_keys = {};
  std::function<void(const config::ModelConfig& model, const config::Checks& checks)> check = {};
  /// Keys that are its alone (config::family_keys<T>()), in the model
  /// section beside the shared ones; section_defaults reads them with
  /// model.own.get<T>(name).
  std::function<std::unique_ptr<config::Extension>()> own_keys = {};
};

const ModelFamily& family_by_name(const std::string& name);
const ModelFamily& family_by_hf_model_type(const std::string& model_type, const std::string& where);
std::vector<std::string> family_names();

/// An independent copy of `model` (same family, shape, heads, weights, device
/// and dtype), e.g. DPO's frozen reference.
std::shared_ptr<CausalLM> clone_model(CausalLM& model);

}  // namespace anvil::models
