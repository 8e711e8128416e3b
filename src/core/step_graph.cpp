#include "core/step_graph.h"

#include <stdexcept>

#if ANVIL_WITH_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>
#endif

namespace anvil {

namespace {
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
}  // namespace

#if ANVIL_WITH_CUDA_GRAPHS

struct SideStream::Impl {
  Impl(c10::cuda::CUDAStream p, c10::cuda::CUDAStream s) : previous(p), side(s), guard(s) {}
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

SideStream::SideStream(const c10::Device& device, int64_t* keep) {
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto previous = c10::cuda::getCurrentCUDAStream(index);
  auto side = keep && *keep != 0 ? c10::cuda::CUDAStream(c10::Stream::unpack3(*keep, index, c10::DeviceType::CUDA))
                                 : c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  if (keep) *keep = side.id();
  at::cuda::CUDAEvent queued;
  queued.record(previous);
  queued.block(side);
  impl_ = std::make_unique<Impl>(previous, side);
}

SideStream::~SideStream() {
  at::cuda::CUDAEvent finished;
  finished.record(impl_->side);
  finished.block(impl_->previous);
  impl_->guard.reset();
}

struct StepGraph::Impl {
  at::cuda::CUDAGraph graph;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::built() { return true; }

bool StepGraph::capture(const std::function<void()>& step, std::string* why, bool default_rng, StepGraph* share_pool) {
  try {
    if (default_rng) impl_->graph.register_generator_state(at::cuda::detail::getDefaultCUDAGenerator());
    if (share_pool)
      impl_->graph.capture_begin(share_pool->impl_->graph.pool());
    else
      impl_->graph.capture_begin();
  } catch (const std::exception& e) {
    *why = first_line(e.what());
    return false;
  }
  try {
    step();
  } catch (const std::exception& e) {
    *why = first_line(e.what());
    try {
      impl_->graph.capture_end();
    } catch (const std::exception&) {
      // The capture was already invalidated; ending it is all that was needed.
    }
    (void)cudaGetLastError();
    return false;
  }
  try {
    impl_->graph.capture_end();
  } catch (const std::exception& e) {
    *why = first_line(e.what());
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void StepGraph::replay() { impl_->graph.replay(); }

#else

struct SideStream::Impl {};
SideStream::SideStream(const c10::Device&, int64_t*) {}
SideStream::~SideStream() = default;
struct StepGraph::Impl {};
StepGraph::StepGraph() = default;
StepGraph::~StepGraph() = default;
bool StepGraph::built() { return false; }
bool StepGraph::capture(const std::function<void()>&, std::string* why, bool, StepGraph*) {
  *why = "built without CUDA";
  return false;
}
void StepGraph::replay() { throw std::logic_error("StepGraph::replay: built without CUDA"); }

#endif

}  // namespace anvil
