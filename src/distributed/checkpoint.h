#pragma once
// Checkpoints of sharded runs. checkpoint-<step>/ holds:
//   sharding.json            units, their parameters' shapes and offsets, and
//                            which element range of each unit every shard holds
//   shards/shard-R-of-S.safetensors
//                            per unit "<unit>.param" (float32 master values),
//                            "<unit>.exp_avg", "<unit>.exp_avg_sq" (AdamW state)
//   rng/rank-R.safetensors   each rank's random-number generator states
//   config.json, generation_config.json, tokenizer files, config.yaml
//   model-K-of-N.safetensors the float32 model (unless turned off), one file
//   model.safetensors.index.json
//                            per unit, each written by the rank that owns the
//                            unit (u mod W), so the folder also loads in
//                            transformers as is; one rank, or LoRA adapters:
//                            model.safetensors / adapter_model.safetensors
//   <name>/                  a companion model (PPO's critic), whole
//   trainer_state.json       step and data position; written last
// Every rank writes its own shard into one temporary folder (on a file system
// the ranks share) and marks it written; once all have, rank 0 writes
// trainer_state.json, fsyncs and renames the folder into place, so a
// checkpoint-<step> folder is complete or absent. A save's collectives (the
// temporary folder, the consolidated model's gather) run at the save; its
// files can then be written at once (save_sharded_checkpoint) or by a
// background thread per rank (prepare_sharded_save, write_sharded_files,
// publish_sharded_save: rank 0 waits for the others' marks). Loading
// re-shards: any number of ranks, under the same strategy or another, reads
// the element ranges it needs from every shard. `anvil export` consolidates a
// sharded checkpoint into one HF folder. docs/distributed.md.

#include <torch/optim/optimizer.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "distributed/sharding.h"
#include "checkpoint/checkpoint.h"
#include "anvil/tokenizer/tokenizer.h"
#include "io/trainer_state.h"

namespace anvil::distributed {

bool is_sharded_checkpoint(const std::filesystem::path& dir);

/// Collective: every rank calls it. Returns the published folder. With
/// `consolidated`, the float32 model is written too, in HF layout (gathered
/// unit by unit; a file per unit, each by its owner, on several ranks), so
/// the folder is an HF model folder as well.
std::filesystem::path save_sharded_checkpoint(const std::filesystem::path& output_dir, ShardedModel& model,
                                              torch::optim::Optimizer& optimizer, const tokenizer::Tokenizer* tokenizer,
                                              const io::TrainerState& state, const std::string& run_config_yaml,
                                              int64_t keep_last, bool consolidated = true,
                                              const std::function<void(const std::filesystem::path&)>& extra = {});

/// A sharded checkpoint between its collective part and its files. The
/// tensor maps hold this rank's live tensors (views of the masters and
/// moments) or gathered copies: copy them before the next optimizer step.
struct ShardedSave {
  std::filesystem::path output_dir, tmp;
  int64_t rank = 0, world = 1, keep_last = 0;
  io::TensorMap shard;               // "<unit>.param", ".exp_avg", ".exp_avg_sq" of this rank's slice
  std::filesystem::path shard_file;  // empty: this rank writes no shard (no_shard, rank > 0)
  io::TensorMap rng;                 // this rank's generator states
  io::TensorMap whole;               // rank 0, consolidated on one rank or with LoRA: the gathered model by HF name
  /// Consolidated on several ranks: the HF folder's files this rank owns
  /// (model-K-of-N.safetensors, one per unit) and the named heads' file
  /// (rank 0); rank 0 also writes the index.
  std::vector<std::pair<std::string, io::TensorMap>> owned;
  io::TensorMap heads;
  nlohmann::json index;               // rank 0: model.safetensors.index.json
  nlohmann::json meta;                // rank 0: sharding.json
  models::CausalLM* model = nullptr;  // for config.json and which parameters are saved (never its tensors)
  const tokenizer::Tokenizer* tokenizer = nullptr;
  io::TrainerState state;
  std::string run_config_yaml;
  /// Rank 0: models trained beside the policy (gather_consolidated), each
  /// written whole into the folder of its name.
  std::vector<std::pair<std::string, checkpoint::ModelState>> companions;
};

/// Collective: the part of a save every rank does together (the temporary
/// folder, the consolidated model's gather) and the state each rank takes.
ShardedSave prepare_sharded_save(const std::filesystem::path& output_dir, ShardedModel& model,
                                 torch::optim::Optimizer& optimizer, const tokenizer::Tokenizer* tokenizer,
                                 const io::TrainerState& state, const std::string& run_config_yaml, int64_t keep_last,
                                 bool consolidated);
/// This rank's files (its shard, its RNG states; rank 0 also the consolidated
/// model, sharding.json and the config files), fsynced, then its mark. No
/// collective: a background thread may call it.
void write_sharded_files(const ShardedSave& save);
/// Rank 0, after write_sharded_files: waits up to `timeout_s` for every
/// rank's mark (a CheckpointError naming the missing ranks after that), then
/// writes trainer_state.json (after `before_complete`), fsyncs and publishes
/// the folder, keeping the newest keep_last. Returns it.
std::filesystem::path publish_sharded_save(
    const ShardedSave& save, double timeout_s,
    const std::function<void(const std::filesystem::path&)>& before_complete = {});

/// Collective: `model` whole in HF layout and its AdamW state by parameter
/// name (a reward model's LM head left out), gathered to rank 0 (the other
/// ranks get empty maps); the tensors are fresh unless one rank holds all.
checkpoint::ModelState gather_consolidated(ShardedModel& model, torch::optim::Optimizer& optimizer);

/// Collective: rank 0 writes `model` whole and its AdamW state by parameter
/// name into `dir`, as checkpoint::save_model_and_optimizer does for one process (a
/// companion model's part of a checkpoint: it reads back into any number of
/// ranks with checkpoint::load_model_and_optimizer and import_optimizer_state).
void save_consolidated(const std::filesystem::path& dir, ShardedModel& model, torch::optim::Optimizer& optimizer);

/// Restores master weights, AdamW state and this rank's RNG (when the
/// checkpoint has one for this rank) into a run of any world size and
/// strategy; returns the trainer state. `before_unit(u, units)`, when given,
/// runs before each unit is read (the trainer's test hook waits there).
io::TrainerState load_sharded_checkpoint(const std::filesystem::path& dir, ShardedModel& model,
                                         torch::optim::Optimizer& optimizer,
                                         const std::function<void(size_t, size_t)>& before_unit = {});

/// Moves the AdamW state of a per-parameter optimizer over the model's own
/// parameters (as restored from a single-process checkpoint) into
/// `sharded_optimizer`, whose parameters are `model`'s master shards.
void import_optimizer_state(ShardedModel& model, torch::optim::Optimizer& per_parameter,
                            torch::optim::Optimizer& sharded_optimizer);

/// The whole float32 flat parameters of every unit, by unit name.
std::map<std::string, at::Tensor> read_sharded_units(const std::filesystem::path& dir, const std::string& kind);

/// Writes the consolidated model of a sharded checkpoint as an HF folder.
void export_sharded_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& output,
                               const std::string& dtype);

}  // namespace anvil::distributed
