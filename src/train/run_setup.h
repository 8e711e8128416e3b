#pragma once
// What a training run is made of, from its config to its objective: the
// device, the communicator, the tokenizer, the model (with adapters), the
// checkpoint it continues and the objective; and the --dry-run plan.
// run_training (trainer.cpp) builds it, then runs the loop.

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "anvil/config/config.h"
#include "distributed/comm.h"
#include "distributed/mesh.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/objective.h"
#include "anvil/train/trainer.h"

namespace anvil::train {

struct RunSetup {
  std::filesystem::path out_dir;
  std::string config_yaml;
  std::optional<std::filesystem::path> latest;  // the checkpoint it continues (or evaluates)
  at::Device device = at::kCPU;
  std::shared_ptr<distributed::Communicator> comm;  // set for sharded runs (over the training ranks)
  /// dist.tensor_parallel > 1: the mesh over `comm` (data is split over its
  /// data-parallel group; the engine cuts the model across its tensor-parallel one).
  std::shared_ptr<distributed::Mesh> mesh;
  /// Where the algorithm keeps ranks apart from training (side_ranks): the
  /// whole launch, whose ranks [0, trainers) train; `side` on the others.
  std::shared_ptr<distributed::Communicator> world;
  int64_t trainers = 0;
  bool side = false;
  RankContext ranks;
  bool lead = true;
  int64_t micro_per_step = 1;
  /// The rows of the objective's micro-batches; train.micro_batch_size: auto
  /// starts at the whole step's batch (the loop halves it as memory requires).
  int64_t micro_batch_size = 1;
  bool auto_micro_batch = false;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::shared_ptr<models::CausalLM> model;
  std::unique_ptr<Objective> objective;
};

/// Validates what needs the model or the filesystem (device, resume, batch
/// math against the world size, data.max_length) and builds the run.
RunSetup setup_run(const config::RunConfig& cfg, const RunOptions& options);

/// Optimizer steps for `epochs` passes over data of `rows_per_epoch` rows
/// taken `rows_per_step` at a time, as transformers counts them for
/// num_train_epochs: ceil(epochs * steps per epoch), where an epoch takes
/// ceil(rows_per_epoch / rows_per_step) steps (at least 1).
int64_t steps_for_epochs(double epochs, int64_t rows_per_epoch, int64_t rows_per_step);

/// `cfg` with the run's micro batch (train.micro_batch_size: auto's start), length and warmup resolved, each
/// logged: train.max_steps
/// from train.num_train_epochs (when max_steps is 0) over the objective's
/// training data, and schedule.warmup_steps from schedule.warmup_ratio. The
/// loop, the schedule and the plan use what it returns; config.yaml keeps the
/// keys as given. Throws ConfigError for epochs of an objective whose steps
/// do not read its training data a row at a time.
config::RunConfig resolve_length(const config::RunConfig& cfg, RunSetup& r);

/// --dry-run: the plan of the run, from the first micro-batch.
void print_plan(RunSetup& r, const config::RunConfig& cfg);
/// trainer --plan-memory: the bytes each of `world` ranks will hold, from the
/// model's shapes alone (built without memory); nothing else is loaded.
void print_memory_plan(const config::RunConfig& cfg, int64_t world);

/// `x` with `precision` significant digits.
std::string format_number(double x, int precision = 4);

}  // namespace anvil::train
