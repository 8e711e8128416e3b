#pragma once
// CUDA-graph capture of a decode step (internal to generation). Built with
// CUDA when LibTorch has it; elsewhere built() is false and nothing is used.

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

namespace anvil::generation::detail {

/// While alive, the CUDA work of `device` goes to a side stream (graphs cannot
/// be captured on the default one), ordered after the work queued before it;
/// on destruction the previous stream waits for the side stream and is current again.
class SideStream {
 public:
  explicit SideStream(const c10::Device& device);
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
  bool capture(const std::function<void()>& step, std::string* why);
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::generation::detail
