// One block per row: an online max / sum-of-exponentials pass, then (with
// `grad`) a pass that overwrites the row with softmax - onehot. Reads the
// logits in their own dtype (no float copy of the chunk) and accumulates in
// float, as Liger's cross-entropy does in Triton.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cross_entropy_launch.h"
#include "kernels/device_math.cuh"

namespace anvil::kernels::cuda {
namespace {

constexpr int kThreads = 512;

/// (m, s): s = sum exp(x - m) over what was seen; m = -inf with s = 0 when nothing was.
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float top = fmaxf(m, m2);
  s = s * expf(m - top) + s2 * expf(m2 - top);
  m = top;
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(T* __restrict__ logits, int64_t stride, int64_t vocab,
                              const int64_t* __restrict__ targets, int64_t ignore_index, float* __restrict__ loss,
                              bool grad, const float* __restrict__ grad_scale) {
  const int64_t r = blockIdx.x;
  T* row = logits + r * stride;
  const int64_t y = targets[r];
  const int64_t packs = (stride + kVec - 1) / kVec;  // stride % kVec == 0 when kVec > 1
  auto* packed = reinterpret_cast<Pack<T, kVec>*>(row);
  if (y == ignore_index) {
    if (threadIdx.x == 0) loss[r] = 0.f;
    if (grad) {
      Pack<T, kVec> zero;
#pragma unroll
      for (int i = 0; i < kVec; ++i) zero.v[i] = from_float<T>(0.f);
      for (int64_t p = threadIdx.x; p < packs; p += kThreads) packed[p] = zero;
    }
    return;
  }
  // Pass 1: each thread's (max, sum of exponentials) over its packs of real columns.
  float m = -INFINITY, s = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const Pack<T, kVec> x = packed[p];
    float f[kVec];
    float top = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t col = p * kVec + i;
      f[i] = col < vocab ? to_float(x.v[i]) : -INFINITY;
      nan |= f[i] != f[i];
      top = fmaxf(top, f[i]);
    }
    if (nan) {  // fmaxf drops NaN: carry it in the sum instead
      combine(m, s, 0.f, NAN);
      continue;
    }
    float part = 0.f;
    if (top != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) part += expf(f[i] - top);
    }
    combine(m, s, top, part);
  }
  // Block reduction: warps by shuffles, then the first warp over the warps.
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
    combine(m, s, m2, s2);
  }
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  __shared__ float lse_shared;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? sm[lane] : -INFINITY;
    s = lane < kThreads / 32 ? ss[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
      combine(m, s, m2, s2);
    }
    if (lane == 0) {
      const float lse = m + logf(s);
      lse_shared = lse;
      // An out-of-range target gives NaN, as a non-finite loss the trainer stops on.
      loss[r] = (y >= 0 && y < vocab) ? lse - to_float(row[y]) : NAN;
    }
  }
  __syncthreads();
  if (!grad) return;
  // Pass 2: the row becomes softmax - onehot (0 on the padding columns).
  const float lse = lse_shared;
  const float scale = grad_scale != nullptr ? grad_scale[r] : 1.f;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    Pack<T, kVec> x = packed[p];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t col = p * kVec + i;
      const float g = col < vocab ? (expf(to_float(x.v[i]) - lse) - (col == y ? 1.f : 0.f)) * scale : 0.f;
      x.v[i] = from_float<T>(g);
    }
    packed[p] = x;
  }
}

template <typename T>
int launch(void* logits, int64_t rows, int64_t stride, int64_t vocab, const int64_t* targets, int64_t ignore_index,
           float* loss, bool grad, const float* grad_scale, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool aligned = stride % kVec == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const auto kernel = aligned ? cross_entropy_rows_kernel<T, kVec> : cross_entropy_rows_kernel<T, 1>;
  ANVIL_LAUNCH(kernel, static_cast<unsigned>(rows), kThreads, stream)
  (static_cast<T*>(logits), stride, vocab, targets, ignore_index, loss, grad, grad_scale);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int cross_entropy_rows(void* logits, Dtype dtype, int64_t rows, int64_t stride, int64_t vocab, const int64_t* targets,
                       int64_t ignore_index, float* loss, bool grad, const float* grad_scale, void* stream) {
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(dtype, [&](auto zero) {
    return launch<decltype(zero)>(logits, rows, stride, vocab, targets, ignore_index, loss, grad, grad_scale, s);
  });
}

}  // namespace anvil::kernels::cuda
