#pragma once
// Internal (not installed): whole-step CUDA graphs (train.cuda_graphs). The
// step after the warm-up steps (run eagerly on a side stream) is recorded
// once and replayed for every later step whose batches have its shapes: the
// batches are copied into the graph's input buffers, the learning rate and
// the loss scale into its device scalars, and the host counts the optimizer
// step. docs/algorithms.md.

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/train/engine.h"
#include "anvil/train/objective.h"

namespace anvil::train {

/// A step run through the graph: its outputs (copies, the graph's own are
/// overwritten by the next replay) and the optimizer's ticket.
struct GraphedStep {
  GraphStep out;
  int64_t ticket = -1;
};

class GraphSteps {
 public:
  /// `mode`: train.cuda_graphs (auto, on, off). `refusal`: why the run cannot
  /// record its steps ("" when it can); under `on` a refusal is an error
  /// (ConfigError), under `auto` it is logged once on a CUDA device.
  GraphSteps(Engine& engine, Objective& objective, const std::string& mode, const std::string& refusal, double max_norm,
             int64_t warmup_steps = 2);
  ~GraphSteps();
  GraphSteps(const GraphSteps&) = delete;
  GraphSteps& operator=(const GraphSteps&) = delete;

  /// Tests (ANVIL_TEST_CUDA_GRAPHS=emulate): on any device, a "recording"
  /// keeps the step's function and each "replay" calls it, so that the
  /// inputs, the device scalars and the host's counting run without a GPU.
  static bool emulated();
  /// Whether steps may still go through a graph (false once recording failed).
  bool active() const { return active_; }
  /// Whether the next eager step is a warm-up step, to be run on a side stream.
  bool warming() const { return active_ && !recorded_; }
  /// Step `step` through the graph: recorded at the warm-up's end, then
  /// replayed for later steps whose `batches` have the recorded step's shapes; nullopt when
  /// the loop must run it eagerly (a warm-up step, other shapes, or a
  /// recording that failed, which is logged and ends graphs for the run).
  std::optional<GraphedStep> run(int64_t step, const std::vector<Batch>& batches, int64_t step_targets, double lr);

  /// The eager step's side stream while warming() (nullptr otherwise); the
  /// loop keeps it alive while it queues the step.
  std::shared_ptr<void> warmup_stream();

 private:
  std::string shapes(const std::vector<Batch>& batches) const;
  void fill(const std::vector<Batch>& batches, int64_t step_targets, double lr);
  bool record(int64_t step);

  Engine& engine_;
  Objective& objective_;
  double max_norm_;
  int64_t warmup_;
  bool active_ = false;
  bool recorded_ = false;
  bool said_shapes_ = false;
  int64_t stream_ = 0;  // the side stream's id: the warm-up steps' and the recording's
  int64_t seen_ = 0;    // warm-up steps run so far
  std::string shapes_;  // the recorded step's
  std::vector<Batch> inputs_;
  at::Tensor scale_, lr_;
  GraphStep out_;
  struct Graph;
  std::unique_ptr<Graph> graph_;
};

}  // namespace anvil::train
