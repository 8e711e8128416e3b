#pragma once
// Internal (not installed): whole-step CUDA graphs (train.cuda_graphs). After
// the warm-up steps (run eagerly on a side stream), the first step of each
// new set of batch shapes is recorded once, up to kMaxGraphs graphs sharing
// one memory pool, and every later step of those shapes replays it: the
// batches are copied into the graph's input buffers, the learning rate and
// the loss scale into device scalars, and the host counts the optimizer step.
// docs/algorithms.md.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/step_engine.h"
#include "anvil/train/objective.h"

namespace anvil::train {

/// A step run through a graph: its outputs (copies: the graph's own are
/// overwritten by its next replay) and the optimizer's ticket.
struct GraphedStep {
  GraphStep out;
  int64_t ticket = -1;
};

class GraphSteps {
 public:
  /// The most graphs a run records (padded rows: one per length bucket).
  static constexpr size_t kMaxGraphs = 8;

  /// `mode`: train.cuda_graphs (auto, on, off). `refusal`: why the run cannot
  /// record its steps ("" when it can); under `on` a refusal is an error
  /// (ConfigError), under `auto` it is logged once on a CUDA device.
  GraphSteps(StepEngine& engine, Objective& objective, config::CudaGraphs mode, const std::string& refusal,
             double max_norm, int64_t warmup_steps = 2);
  ~GraphSteps();
  GraphSteps(const GraphSteps&) = delete;
  GraphSteps& operator=(const GraphSteps&) = delete;

  /// Tests (ANVIL_TEST_CUDA_GRAPHS=emulate): on any device, a "recording"
  /// keeps the step's function and each "replay" calls it, so that the
  /// inputs, the device scalars and the host's counting run without a GPU.
  static bool emulated();
  /// Whether steps may still go through a graph (false once recording failed).
  bool active() const { return active_; }
  /// Step `step` through a graph: the one recorded for its batches' shapes,
  /// recorded now when there is none yet and room for it. nullopt when the
  /// loop must run it eagerly: a warm-up step, shapes beyond kMaxGraphs
  /// (logged once), or a recording that failed (logged; it ends graphs for
  /// the run).
  std::optional<GraphedStep> run(int64_t step, const std::vector<Batch>& batches, int64_t step_targets, double lr);
  /// While the warm-up lasts, the side stream its eager steps run on
  /// (nullptr otherwise); the loop keeps it alive while it queues the step.
  std::shared_ptr<void> warmup_stream();

 private:
  struct Graph;
  std::string shapes(const std::vector<Batch>& batches) const;
  void fill(Graph& g, const std::vector<Batch>& batches, int64_t step_targets, double lr);
  bool record(Graph& g, int64_t step);

  StepEngine& engine_;
  Objective& objective_;
  double max_norm_;
  int64_t warmup_;
  bool active_ = false;
  bool said_full_ = false;
  int64_t stream_ = 0;  // the side stream's id: the warm-up steps' and the recordings'
  int64_t seen_ = 0;    // warm-up steps run so far
  at::Tensor scale_, lr_;
  std::map<std::string, std::unique_ptr<Graph>> graphs_;  // by the batches' shapes
  Graph* first_ = nullptr;                                // whose memory pool the others share
};

}  // namespace anvil::train
