#pragma once
// The CUDA side of kernels/rope: plain types only (nvcc compiles the .cu
// without LibTorch's headers).

#include <cstdint>

#include "kernels/launch.h"

namespace anvil::kernels::cuda {

/// A 4-D view (B, H, T, D): sizes, and strides in elements (the last one 1).
struct View4 {
  int64_t size[4];
  int64_t stride[3];
};

/// Rotary embeddings over the first `rotary` columns of each (b, h, t) row of
/// `x` into `out` (the rest copied): with c, s the rows of `cos`, `sin`
/// (contiguous, (B or 1) x T x rotary; `table_batch` 0 when shared over the
/// batch, else T x rotary) and half = rotary / 2, for j < half,
///   forward:  out[j] = x[j] c[j] - x[j+half] s[j],  out[j+half] = x[j+half] c[j+half] + x[j] s[j+half]
///   backward: out[j] = x[j] c[j] + x[j+half] s[j+half], out[j+half] = x[j+half] c[j+half] - x[j] s[j]
/// (the transpose: `x` is then the output's gradient), each product and sum
/// rounded to the element type as ATen's composition rounds them. `x` and
/// `out` are described by their views; `stream` is a cudaStream_t. Returns a
/// cudaError_t (0: launched).
int rope(const void* x, const View4& xv, void* out, const View4& ov, const void* cos, const void* sin,
         int64_t table_batch, int64_t rotary, Dtype dtype, bool backward, void* stream);

}  // namespace anvil::kernels::cuda
