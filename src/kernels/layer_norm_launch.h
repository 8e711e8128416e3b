#pragma once
// The CUDA side of kernels/layer_norm: plain types only (nvcc compiles the
// .cu without LibTorch's headers).

#include <cstdint>

#include "kernels/launch.h"

namespace anvil::kernels::cuda {

/// Whether the backward kernel takes rows of `cols` features of `dtype`: a
/// multiple of 32 x (16 bytes / element size), at most 4 of them (256 to
/// 1024 in bfloat16 and float16: GPT-2 small and medium, OPT and Pythia up to
/// 410M; 128 to 512 in float32). Wider rows keep ATen's backward.
bool layer_norm_backward_fits(int64_t cols, Dtype dtype);

/// How many partial sums (rows of 2 x cols floats) the backward writes for
/// `rows` rows on the current device: the size of its `partial` scratch.
int64_t layer_norm_backward_partials(int64_t rows);

/// LayerNorm's backward over contiguous rows x cols `x` and `dy` (16-byte
/// aligned), with the forward's float `mean` and `rstd` (one per row) and
/// `gamma` (cols): writes dx (rows x cols) and, through `partial` (scratch of
/// layer_norm_backward_partials(rows) x 2 x cols floats), d_gamma and d_beta
/// (cols each, in the element type; d_beta may be null). Every sum is taken
/// in a fixed order, so a device repeats its results. `stream` is a
/// cudaStream_t. Returns a cudaError_t (0: launched).
int layer_norm_backward(const void* dy, const void* x, const float* mean, const float* rstd, const void* gamma,
                        int64_t rows, int64_t cols, void* dx, void* d_gamma, void* d_beta, float* partial, Dtype dtype,
                        void* stream);

}  // namespace anvil::kernels::cuda
