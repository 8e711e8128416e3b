#pragma once
// The shared training loop: iterations of an Objective's optimizer steps
// on an Engine (engine.h), with eval, checkpoints, resume and the
// non-finite guard.

#include <atomic>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/train/engine.h"
#include "anvil/train/objective.h"

namespace anvil::train {

struct TrainResult {
  int64_t step = 0;          // steps completed
  bool interrupted = false;  // stopped early by SIGTERM/SIGINT
  Metrics last_eval;
  int64_t tokens = 0;           // input tokens of this run's steps
  double wall_s = 0;            // of this run's steps
  std::string best_checkpoint;  // the kept checkpoint with the lowest eval/loss ("" if none)
};

struct RunOptions {
  /// Load config, tokenizer and data, build the model and print the plan
  /// (parameters, batch, tokens per step, epochs, memory, the first training
  /// sample with its trained tokens marked); train and write nothing.
  bool dry_run = false;
  /// Evaluate the model (output_dir's latest checkpoint, train.resume_from or
  /// model.from) once, write <output_dir>/eval-step-<N>.json and return.
  bool eval_only = false;
};

/// Runs (or resumes, from the latest complete checkpoint in output_dir) a
/// training run. SIGTERM/SIGINT finish the current step, save and return.
TrainResult run_training(const config::RunConfig& cfg, const RunOptions& options = {});

/// Asks a running loop to save and stop after the current step.
void request_stop();

/// The `trainer` program: --config files, key=value overrides, --dry-run,
/// --eval-only, --print-config, --help. A program that links libanvil and
/// registers its own objectives (register_objective) first gets the same
/// command line by calling it from main. Returns the exit code.
int trainer_main(int argc, char** argv);

}  // namespace anvil::train
