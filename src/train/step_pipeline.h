#pragma once
// Internal (not installed): the one path every optimizer step takes. queue()
// runs the forward and backward, clips, decides on the device whether the
// step is finite and applies or skips it (replaying a recorded CUDA graph
// where it can); read() copies the step's loss, gradient norm and sums to the
// host once. Reading a step at once is queue() then read(); overlapped
// (train.overlap_step_reads), a step is read after the next one is queued.
// Read at once, the decision is read on the host inside queue() (as for an
// engine that cannot skip on the device: companion models, an unfused
// optimizer); read late, it stays on the device, inside the fused AdamW. The loop (trainer.cpp) draws the batches,
// writes the lines, and calls after_step() or its non-finite guard from one place.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "train/step_engine.h"
#include "anvil/train/objective.h"
#include "train/graph_steps.h"
#include "train/run_setup.h"

namespace anvil::train {

/// A queued optimizer step, and its values once read.
struct QueuedStep {
  int64_t step = 0;  // its number: steps done once it is
  double lr = 0;
  int64_t targets = 0, tokens = 0;
  std::chrono::steady_clock::time_point t0;
  // When the host knew it had finished (unset until then).
  std::chrono::steady_clock::time_point done;
  StepStats stats;             // the loss and sums, on the device until read
  at::Tensor norm;             // the gradient norm, on the device until read
  at::Tensor reduced;          // several ranks: [loss, stop flag, sums...] summed over ranks on the device
  int64_t ticket = -1;         // Engine::finish_step_on_device's
  bool graphed = false;        // replayed from the recorded CUDA graph (train.cuda_graphs)
  std::shared_ptr<void> side;  // a warm-up step's side stream, while it is queued
  // Once read (read()):
  bool read = false;
  double loss_value = 0, norm_value = 0;
  Metrics companions;  // the companion models' gradient norms
};

class StepPipeline {
 public:
  /// `resumed_micro_batch`: the micro-batch rows a checkpoint recorded under
  /// train.micro_batch_size: auto (0: none).
  StepPipeline(const config::RunConfig& cfg, RunSetup& run, StepEngine& engine, Objective& objective,
               int64_t resumed_micro_batch);

  /// Whether steps are read one step late (train.overlap_step_reads, where the
  /// engine skips on the device and the objective allows it).
  bool overlapped() const { return overlap_; }
  /// Queues step `step` on `batches` (this rank's micro-batches of a step of
  /// `targets` target units and `tokens` tokens) at learning rate `lr`;
  /// `stop_now`: this process was asked to stop. Injected faults
  /// (ANVIL_TEST_NONFINITE) apply here.
  QueuedStep queue(int64_t step, const std::vector<Batch>& batches, int64_t targets, int64_t tokens, double lr,
                   bool stop_now);
  /// Reads `q` (one copy to the host): its loss, gradient norm and sums,
  /// summed over ranks, and the stop flag; a step skipped on the device is
  /// taken back from the optimizer's count. Returns whether it was applied
  /// (loss and norm finite).
  bool read(QueuedStep& q);
  /// Whether a stop was agreed by the steps queued or read so far.
  bool stop_agreed() const { return stop_; }

  /// train.micro_batch_size: auto: the rows of each micro-batch run (0 when not auto).
  int64_t auto_rows() const;

 private:
  std::string graph_refusal() const;
  StepStats fit_backward(int64_t step, const std::vector<Batch>& batches, int64_t targets);
  void mark_done_if_run(QueuedStep& q) const;

  const config::RunConfig& cfg_;
  RunSetup& run_;
  StepEngine& engine_;
  Objective& objective_;
  const std::map<int64_t, std::string> injected_;
  // train.micro_batch_size: auto: the micro-batches each of the objective's is cut into (0: not auto).
  int64_t auto_parts_;
  bool overlap_;
  std::unique_ptr<GraphSteps> graphs_;
  bool stop_ = false;
};

}  // namespace anvil::train
