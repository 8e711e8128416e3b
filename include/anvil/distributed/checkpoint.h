#pragma once
// Checkpoints of sharded runs. checkpoint-<step>/ holds:
//   sharding.json            units, their parameters' shapes and offsets, and
//                            which element range of each unit every shard holds
//   shards/shard-R-of-S.safetensors
//                            per unit "<unit>.param" (float32 master values),
//                            "<unit>.exp_avg", "<unit>.exp_avg_sq" (AdamW state)
//   rng/rank-R.safetensors   each rank's random-number generator states
//   config.json, generation_config.json, tokenizer files, config.yaml
//   model.safetensors        the whole float32 model (unless turned off), so
//                            the folder also loads in transformers as is
//   <name>/                  a companion model (PPO's critic), whole
//   trainer_state.json       step and data position; written last
// Every rank writes its own shard into one temporary folder; once all have
// (a barrier), rank 0 writes trainer_state.json, fsyncs and renames the folder
// into place, so a checkpoint-<step> folder is complete or absent. Loading
// re-shards: any number of ranks, under the same strategy or another, reads
// the element ranges it needs from every shard. `anvil export` consolidates a
// sharded checkpoint into one HF folder. docs/distributed.md.

#include <torch/optim/optimizer.h>

#include <filesystem>
#include <functional>
#include <string>

#include "anvil/distributed/sharding.h"
#include "anvil/io/checkpoint.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::distributed {

bool is_sharded_checkpoint(const std::filesystem::path& dir);

/// Collective: every rank calls it. Returns the published folder. With
/// `consolidated`, rank 0 also writes the whole float32 model as
/// model.safetensors (gathered unit by unit), so the folder is an HF model
/// folder as well.
std::filesystem::path save_sharded_checkpoint(const std::filesystem::path& output_dir, ShardedModel& model,
                                              torch::optim::Optimizer& optimizer,
                                              const tokenizer::Tokenizer* tokenizer, const io::TrainerState& state,
                                              const std::string& run_config_yaml, int64_t keep_last,
                                              bool consolidated = true,
                                              const std::function<void(const std::filesystem::path&)>& extra = {});

/// Collective: rank 0 writes `model` whole and its AdamW state by parameter
/// name into `dir`, as io::save_model_and_optimizer does for one process (a
/// companion model's part of a checkpoint: it reads back into any number of
/// ranks with io::load_model_and_optimizer and import_optimizer_state).
void save_consolidated(const std::filesystem::path& dir, ShardedModel& model, torch::optim::Optimizer& optimizer);

/// Restores master weights, AdamW state and this rank's RNG (when the
/// checkpoint has one for this rank) into a run of any world size and
/// strategy; returns the trainer state.
io::TrainerState load_sharded_checkpoint(const std::filesystem::path& dir, ShardedModel& model,
                                         torch::optim::Optimizer& optimizer);

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
