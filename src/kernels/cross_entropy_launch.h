#pragma once
// The CUDA side of kernels/cross_entropy: plain types only, so that the .cu
// compiles with nvcc alone (no LibTorch headers) and the C++ side calls it.

#include <cstdint>

#include "kernels/launch.h"

namespace anvil::kernels::cuda {

/// Per-row cross-entropy of contiguous `logits` (rows x stride, the first
/// `vocab` columns real): loss[r] = logsumexp(x[r]) - x[r][targets[r]], 0 where
/// targets[r] == ignore_index. With `grad`, each row is overwritten in place
/// by d loss[r] / d x[r] = softmax(x[r]) - onehot(targets[r]) (zeros on
/// ignored rows and on the padding columns), times grad_scale[r] when
/// `grad_scale` is not null. `stream` is a cudaStream_t.
/// Returns a cudaError_t (0: launched).
int cross_entropy_rows(void* logits, Dtype dtype, int64_t rows, int64_t stride, int64_t vocab, const int64_t* targets,
                       int64_t ignore_index, float* loss, bool grad, const float* grad_scale, void* stream);

}  // namespace anvil::kernels::cuda
