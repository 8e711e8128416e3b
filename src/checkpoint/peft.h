#pragma once
// PEFT adapter folders: adapter_config.json (LoraConfig's fields) and
// adapter_model.safetensors with PEFT's key names ("base_model.model." + the
// parameter's HF name: "...q_proj.lora_A.weight"; a reward model's score head
// as modules_to_save, "base_model.model.score.weight"). What
// peft.PeftModel.from_pretrained(base, folder) loads, and what it saves.
// docs/lora.md.

#include <filesystem>
#include <string>

#include "anvil/models/causal_lm.h"
#include "models/lora.h"

namespace anvil::checkpoint {

inline constexpr const char* kAdapterConfig = "adapter_config.json";
inline constexpr const char* kAdapterWeights = "adapter_model.safetensors";

/// A folder with adapter_config.json.
bool is_peft_adapter_dir(const std::filesystem::path& dir);

/// Reads `dir`/adapter_config.json: a LoRA adapter (peft_type LORA, bias
/// none, no DoRA or per-layer patterns); anything else is an error naming
/// the file and the key.
models::LoraOptions read_peft_config(const std::filesystem::path& dir);

/// Writes adapter_config.json and adapter_model.safetensors for `model`'s
/// adapters (and score head). `tensors` maps parameter names to the values to
/// write (the model's own when empty).
void save_peft_adapter(const std::filesystem::path& dir, models::CausalLM& model,
                       const std::map<std::string, at::Tensor>& tensors = {});

/// Copies adapter_model.safetensors into the model's adapters (and score
/// head); every adapter parameter must be there with its shape.
void load_peft_weights(models::CausalLM& model, const std::filesystem::path& dir);

/// Installs the adapters `dir` describes on `model` and loads their weights.
models::LoraOptions load_peft_adapter(models::CausalLM& model, const std::filesystem::path& dir);

}  // namespace anvil::checkpoint
