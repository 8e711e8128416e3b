#pragma once
// How the trainer builds a run's Engine (train/engine.cpp): its sharding from
// the config, and the plain or sharded engine with the checkpoint it resumed.

#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "train/step_engine.h"
#include "anvil/train/objective.h"
#include "distributed/comm.h"
#include "distributed/mesh.h"
#include "distributed/sharding.h"
#include "io/trainer_state.h"

namespace anvil::train {

/// The sharding of a run's model (dist.sharding, dist.param_dtype,
/// dist.reduce_dtype, train.activation_checkpointing).
distributed::ShardingOptions sharding_options(const config::RunConfig& cfg);

/// What make_engine built, and the trainer state of the checkpoint it
/// restored (model, optimizer, RNG) when `resume_from` was given.
struct EngineStart {
  std::unique_ptr<StepEngine> engine;
  std::optional<io::TrainerState> resumed;
};

/// Builds the engine for `model` (already on its device): sharded when
/// `comm` is set, plain otherwise. The optimizer covers the parameters
/// `objective.trains()`; the others are frozen (requires_grad false). The
/// `companions` (RunContext::train) train beside it. With `mesh` (dist.tensor_parallel), the model's blocks
/// are cut across its tensor-parallel group and sharded over its data-parallel one. Restores `resume_from`
/// (a plain or a sharded checkpoint) when given, companions included.
EngineStart make_engine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model,
                        std::shared_ptr<distributed::Communicator> comm, const Objective& objective,
                        const std::optional<std::filesystem::path>& resume_from,
                        const std::vector<CompanionModel>& companions = {},
                        std::shared_ptr<distributed::Mesh> mesh = nullptr);

}  // namespace anvil::train
