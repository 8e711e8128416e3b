#pragma once
// What a kernel's C++ side does when its launch fails because this build has
// no code for the GPU at hand (compiled for other architectures): switch the
// kernel off for the process, say so once, and let the ATen reference run.

#include <atomic>

#include "core/logging.h"

namespace anvil::kernels::detail {

/// True when `rc` (a cudaError_t from the launch) means "no code for this
/// GPU": cudaErrorInvalidDeviceFunction (98) or cudaErrorNoKernelImageForDevice
/// (209). Then `off` is set and the first such failure is logged.
inline bool no_code_for_this_gpu(int rc, const char* kernel, std::atomic<bool>& off) {
  if (rc != 98 && rc != 209) return false;
  if (!off.exchange(true))
    log::warn(kernel,
              ": this build has no CUDA code for this GPU's architecture (set TORCH_CUDA_ARCH_LIST, "
              "e.g. 8.0;9.0, when configuring); using the ATen path, which is slower");
  return true;
}

}  // namespace anvil::kernels::detail
