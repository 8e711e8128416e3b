#pragma once
// The CUDA side of kernels/draw: plain types only (nvcc compiles the .cu
// without LibTorch's headers).

#include <cstdint>

namespace anvil::kernels::cuda {

/// For each row r of contiguous float `scores` (rows x vocab): the first
/// index v whose cumulative probability (softmax in float, summed in double)
/// exceeds uniforms[r] x the row's total; vocab - 1 when none does. Writes
/// `out` (rows, int64). `stream` is a cudaStream_t. Returns a cudaError_t.
int inverse_cdf_draw(const float* scores, int64_t rows, int64_t vocab, const double* uniforms, int64_t* out,
                     void* stream);

}  // namespace anvil::kernels::cuda
