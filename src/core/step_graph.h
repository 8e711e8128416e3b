#pragma once
// CUDA-graph capture of a step, for the layers above that record one: a
// decode step (generation/generate.cpp), a whole training step
// (train/graph_steps.h). Built with CUDA when LibTorch has it; elsewhere
// built() is false and nothing is used.

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace anvil {

/// While alive, the CUDA work of `device` goes to a side stream (graphs cannot
/// be captured on the default one), ordered after the work queued before it;
/// on destruction the previous stream waits for the side stream and is current again.
class SideStream {
 public:
  /// With `keep`: the stream whose id *keep holds when not 0, else a new one
  /// whose id is stored there, so that later scopes reuse it (a graph is
  /// recorded on the stream its warm-up steps ran on).
  explicit SideStream(const c10::Device& device, int64_t* keep = nullptr);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One captured step, replayed as a whole.
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  /// Whether this build can capture graphs at all.
  static bool built();
  /// Records step() on the current stream without running it; false, with the
  /// reason in `why`, when the step cannot be captured (the stream is left
  /// usable and nothing ran).
  /// With `default_rng`, the device's default generator is registered with
  /// the graph: each replay draws fresh numbers (dropout) as eager steps do.
  /// With `share_pool`, the recording allocates from that graph's memory
  /// pool: graphs replayed one at a time on one stream can share it.
  bool capture(const std::function<void()>& step, std::string* why, bool default_rng = false,
               StepGraph* share_pool = nullptr);
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil
