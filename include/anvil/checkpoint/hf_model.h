#pragma once
// Model folders in Hugging Face layout: config.json + model.safetensors (or
// sharded with model.safetensors.index.json) + tokenizer files. Every Anvil
// checkpoint's model files are such a folder and load in transformers as is.

#include <filesystem>
#include <map>
#include <optional>
#include <memory>

#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::checkpoint {

/// Named heads (CausalLM::add_head) are saved beside the HF files: their
/// weights in heads.safetensors ("heads.<name>.weight" / ".bias"), their
/// shapes in heads.json, so transformers loads the base model as is.
inline constexpr const char* kHeadsFile = "heads.safetensors";
inline constexpr const char* kHeadsConfig = "heads.json";

/// A LoRA adapter folder keeps its model's config (a reward model's score
/// head, the pad id) under this name, not config.json: transformers takes a
/// folder holding both config.json and adapter_config.json for a complete
/// model with an embedded adapter and looks for the weights there, while
/// PEFT writes no config.json and transformers then loads the base that
/// adapter_config.json names. Folders written before keep loading.
inline constexpr const char* kAdapterModelConfig = "anvil_model_config.json";

/// Whether a parameter belongs to a named head (saved in heads.safetensors).
inline bool is_head_parameter(const std::string& name) { return name.rfind("heads.", 0) == 0; }

/// Writes config.json, generation_config.json, model.safetensors and the
/// tokenizer's files into `dir` (which must exist).
void save_model_dir(const std::filesystem::path& dir, models::CausalLM& model, const tokenizer::Tokenizer* tokenizer);

/// Writes the weights of `model`, given as `tensors` (parameter name -> value;
/// all of them), into `dir`: named heads in heads.safetensors, the rest in
/// model.safetensors (a reward model's without its LM head). A model with
/// LoRA adapters writes a PEFT adapter folder instead (io/peft.h): its base
/// stays in the folder the adapter names.
void save_weight_files(const std::filesystem::path& dir, models::CausalLM& model,
                       const std::map<std::string, at::Tensor>& tensors);

/// Writes config.json (kAdapterModelConfig for a model with LoRA adapters),
/// generation_config.json, heads.json (when the model has named heads) and the tokenizer's files (no weights).
/// config.json's dtype is `dtype`, or the parameters' when undefined.
void save_model_config(const std::filesystem::path& dir, models::CausalLM& model, const tokenizer::Tokenizer* tokenizer,
                       std::optional<at::ScalarType> dtype = std::nullopt);

/// Builds the model `dir`/config.json describes (with the heads heads.json
/// names), with freshly initialised weights.
std::shared_ptr<models::CausalLM> model_from_config(const std::filesystem::path& dir);

/// Throws unless `output` is a new (or empty) folder and `dtype` is float32,
/// bfloat16 or float16.
void check_export_target(const std::filesystem::path& output, const std::string& dtype);

/// Writes `model` cast to `dtype` and `tok` as an HF folder at `output`
/// (which must not exist or be empty) atomically: beside it, fsynced, renamed.
void write_model_dir_atomic(models::CausalLM& model, const tokenizer::Tokenizer* tok,
                            const std::filesystem::path& output, const std::string& dtype);

/// Builds the model described by `dir`/config.json and loads its weights. A
/// PEFT adapter folder without model.safetensors (a LoRA run's checkpoint)
/// loads its base from adapter_config.json's base_model_name_or_path (or
/// `base`, when given), then the adapters.
std::shared_ptr<models::CausalLM> load_model_dir(const std::filesystem::path& dir,
                                                 const std::filesystem::path& base = {});

/// load_model_dir without reading the weights: the model is built on
/// `device` without storage (models/init.h's DeferredInitGuard), the folder's
/// tensors are checked against it (names, shapes, none missing) and kept
/// mapped as its parameter_source, from which a sharded run reads each rank's
/// ranges (distributed::ShardedModel) and anything else the whole
/// (models::materialize_deferred). Sharded checkpoints and PEFT adapter
/// folders load as load_model_dir does.
std::shared_ptr<models::CausalLM> open_model_dir(const std::filesystem::path& dir, const at::Device& device);

/// Writes the model folder of `checkpoint` (an Anvil checkpoint-N/ or any
/// supported HF folder) as a standalone HF folder at `output`, optionally cast
/// to `dtype` (float32, bfloat16, float16). The model is fully loaded and
/// validated first; `output` must not exist or be empty, and appears
/// atomically (written beside it, fsynced, renamed).
void export_model_dir(const std::filesystem::path& checkpoint, const std::filesystem::path& output,
                      const std::string& dtype = "float32");

/// Copies the weights in `dir` into an already built model; every parameter
/// must be present with its shape, and no unknown tensor may be left over.
/// LoRA adapters may be missing (a base folder); with adapters, a PEFT
/// adapter folder without model.safetensors loads only the adapters (the
/// base is already in the model).
void load_weights(models::CausalLM& model, const std::filesystem::path& dir);

}  // namespace anvil::checkpoint
