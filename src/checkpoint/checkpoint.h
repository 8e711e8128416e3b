#pragma once
// Training checkpoints: `<output_dir>/checkpoint-<step>/` holds the model in
// HF layout (config.json, model.safetensors, tokenizer files, loadable by
// transformers as is) and, beside it, the trainer state: trainer_state.json
// (step, data position), optimizer.safetensors + optimizer.json (AdamW moments
// by parameter name and their step counts), rng_state.safetensors and the run's
// config.yaml. A checkpoint is written to a temp folder, fsynced and renamed
// into place, so a folder named checkpoint-<step> is always complete. What is
// written is given as tensors by name (CheckpointParts), so the same code
// writes a model's live tensors or copies of them taken earlier in host memory
// (a background save: src/train/checkpoint_writer.h).

#include <torch/optim/optimizer.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "io/trainer_state.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::checkpoint {

/// A model's part of a checkpoint, by Hugging Face parameter name: the
/// weights its folder holds and its AdamW state. The tensors are the live ones
/// (a save that writes at once) or copies of them (a background save).
struct ModelState {
  /// Read for its config, heads and adapters (which training never changes),
  /// never for its tensors.
  models::CausalLM* model = nullptr;
  io::TensorMap weights;  // the parameters its folder holds (a LoRA run's: the adapters and heads)
  io::TensorMap moments;  // "<name>.exp_avg", ".exp_avg_sq", ".max_exp_avg_sq"
  nlohmann::json steps = nlohmann::json::object();  // each stepped parameter's step count
  at::ScalarType dtype = at::kFloat;                // config.json's
};

/// `model`'s weights and `optimizer`'s AdamW state, as they are (no copies).
ModelState model_state(models::CausalLM& model, torch::optim::Optimizer& optimizer);

/// Writes `state` into `dir` (created): the HF folder (with the tokenizer's
/// files when given), optimizer.safetensors and optimizer.json.
void save_model_state(const std::filesystem::path& dir, const ModelState& state, const tokenizer::Tokenizer* tokenizer);

struct CheckpointParts {
  ModelState model;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  io::TensorMap rng;  // rng_state()
  io::TrainerState state;
  std::string run_config_yaml;
  /// Models trained beside the policy, each written into the folder of its name.
  std::vector<std::pair<std::string, ModelState>> companions;
  /// Called on the unfinished folder just before trainer_state.json marks it
  /// complete (a test pauses a background write there).
  std::function<void(const std::filesystem::path& dir)> before_complete;
};

/// Writes checkpoint-<step> atomically and keeps only the newest `keep_last`
/// (0 = all). Returns the checkpoint's folder.
std::filesystem::path save_checkpoint(const std::filesystem::path& output_dir, const CheckpointParts& parts,
                                      int64_t keep_last);

/// Renames the finished folder `tmp` to `output_dir`/checkpoint-<step>
/// (replacing one of the same step safely), keeps the newest `keep_last`
/// checkpoints and removes leftovers of interrupted saves.
void publish_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& output_dir, int64_t step,
                        int64_t keep_last);

/// The default random generators' states, the CPU's and `device`'s (when not
/// the CPU), keyed by device name (host copies).
io::TensorMap rng_state(const at::Device& device);
/// Writes rng_state(`device`) to `path` (safetensors).
void save_rng_state(const std::filesystem::path& path, const at::Device& device);
/// Restores them. A GPU state stored under another index (another rank's
/// file) is used when this device's is absent.
void load_rng_state(const std::filesystem::path& path, const at::Device& device);

/// The complete checkpoint with the highest step, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& output_dir);

/// A model and its optimizer state alone (a companion model's part of a
/// checkpoint): the HF folder and optimizer.safetensors / optimizer.json, no
/// trainer or RNG state. `dir` is created.
void save_model_and_optimizer(const std::filesystem::path& dir, models::CausalLM& model,
                              torch::optim::Optimizer& optimizer);
/// Writes optimizer.safetensors / optimizer.json from AdamW moments keyed
/// "<parameter>.exp_avg" / ".exp_avg_sq" and each parameter's step count.
void save_optimizer_moments(const std::filesystem::path& dir, const std::map<std::string, at::Tensor>& moments,
                            const nlohmann::json& steps);
/// Restores what save_model_and_optimizer wrote.
void load_model_and_optimizer(const std::filesystem::path& dir, models::CausalLM& model,
                              torch::optim::Optimizer& optimizer);

/// Restores weights, optimizer state and RNG state; returns the trainer state.
io::TrainerState load_checkpoint(const std::filesystem::path& dir, models::CausalLM& model,
                                 torch::optim::Optimizer& optimizer);

}  // namespace anvil::checkpoint
