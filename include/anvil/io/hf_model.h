#pragma once
// Model folders in Hugging Face layout: config.json + model.safetensors (or
// sharded with model.safetensors.index.json) + tokenizer files. Every Anvil
// checkpoint's model files are such a folder and load in transformers as is.

#include <filesystem>
#include <memory>

#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::io {

/// Writes config.json, generation_config.json, model.safetensors and the
/// tokenizer's files into `dir` (which must exist).
void save_model_dir(const std::filesystem::path& dir, models::CausalLM& model,
                    const tokenizer::Tokenizer* tokenizer);

/// Builds the model described by `dir`/config.json and loads its weights.
std::shared_ptr<models::CausalLM> load_model_dir(const std::filesystem::path& dir);

/// Copies the weights in `dir` into an already built model; every parameter
/// must be present with its shape, and no unknown tensor may be left over.
void load_weights(models::CausalLM& model, const std::filesystem::path& dir);

}  // namespace anvil::io
