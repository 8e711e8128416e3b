#pragma once
// What the kernels share on their C++ side: whether this build has them, the
// process-wide switch between the fused ops (kernels/rope, glu,
// layer_norm) and ATen's composition (train.fused_kernels), and the element
// types the CUDA kernels take.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <optional>

#include "kernels/launch.h"

namespace anvil::kernels {

namespace detail {
inline std::atomic<bool>& fused_ops_flag() {
  static std::atomic<bool> on{true};
  return on;
}
}  // namespace detail

/// Whether the models run RoPE and gated activations as the fused ops of
/// src/kernels/ (one op with its own backward, a CUDA kernel on the GPU) or
/// as ATen's composition. On by default; train.fused_kernels sets it.
inline bool fused_ops() { return detail::fused_ops_flag().load(std::memory_order_relaxed); }
inline void set_fused_ops(bool on) { detail::fused_ops_flag().store(on, std::memory_order_relaxed); }

/// Whether this build has src/kernels/'s CUDA kernels (LibTorch with CUDA and
/// nvcc at configure time); without them every op runs its ATen reference.
bool cuda_kernels_built();

/// The kernels' element type for `t`, when they take it (float, float16, bfloat16).
inline std::optional<cuda::Dtype> kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return cuda::Dtype::kFloat;
    case at::kHalf:
      return cuda::Dtype::kHalf;
    case at::kBFloat16:
      return cuda::Dtype::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace anvil::kernels
