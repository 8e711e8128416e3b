#pragma once
// The CUDA side of kernels/glu: plain types only (nvcc compiles the .cu
// without LibTorch's headers).

#include <cstdint>

#include "kernels/launch.h"

namespace anvil::kernels::cuda {

/// The gate's activation: silu (SwiGLU: LLaMA, Mistral, Qwen, Phi-3, the
/// experts of mixtures) or GELU's tanh approximation (GeGLU: Gemma).
enum class GluActivation { kSilu, kGeluTanh };

/// Over rows x cols elements, with g, u read from `gate`, `up` (row r at
/// r * gate_stride, r * up_stride; columns contiguous) and the results
/// contiguous (rows x cols), s = act(g) rounded to the element type:
///   forward (`dy` null):  out = s * u
///   backward:             d_gate = act'(g) * (dy * u), d_up = dy * s
/// each product rounded where ATen's composition act(gate) * up stores it.
/// `stream` is a cudaStream_t. Returns a cudaError_t (0: launched).
int glu(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride, int64_t rows, int64_t cols,
        const void* dy, void* out, void* d_gate, void* d_up, GluActivation act, Dtype dtype, void* stream);

}  // namespace anvil::kernels::cuda
