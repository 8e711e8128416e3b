// Inverse-CDF sampling in one kernel, one block per row: the row's max and
// sum of exponentials (float, as a float softmax), then each thread's share
// of the probabilities over a contiguous segment (double), a block-wide scan
// of the shares, and a walk through the one segment that holds the row's
// target. Replaces softmax -> float64 -> cumsum -> searchsorted, which read
// and wrote (rows, vocab) four times.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/device_math.cuh"
#include "kernels/draw_launch.h"

namespace anvil::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by an earlier reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[lane < kWarps ? lane : 0];
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;  // every thread holds the result
}

__global__ void __launch_bounds__(kThreads)
    inverse_cdf_draw_kernel(const float* __restrict__ scores, int64_t vocab, const double* __restrict__ uniforms,
                            int64_t* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const float* row = scores + r * vocab;
  __shared__ float fscratch[kWarps];
  __shared__ double dscratch[kWarps];
  __shared__ unsigned long long found;
  if (threadIdx.x == 0) found = static_cast<unsigned long long>(vocab - 1);

  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) m = fmaxf(m, row[v]);
  m = block_reduce(
      m, [](float a, float b) { return fmaxf(a, b); }, fscratch);
  float s = 0.f;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) s += expf(row[v] - m);
  s = block_reduce(
      s, [](float a, float b) { return a + b; }, fscratch);

  // This thread's segment and its probability mass.
  const int64_t seg = (vocab + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * seg, end = begin + seg < vocab ? begin + seg : vocab;
  double part = 0.0;
  for (int64_t v = begin; v < end; ++v) part += static_cast<double>(expf(row[v] - m) / s);

  // Exclusive scan of the segments' masses: within each warp, then over the warps.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double inclusive = part;
  for (int off = 1; off < 32; off <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) dscratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    double w = lane < kWarps ? dscratch[lane] : 0.0;
    for (int off = 1; off < 32; off <<= 1) {
      const double up = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += up;
    }
    if (lane < kWarps) dscratch[lane] = w;  // inclusive totals of warps 0..lane
  }
  __syncthreads();
  const double before = (warp > 0 ? dscratch[warp - 1] : 0.0) + inclusive - part;
  const double total = dscratch[kWarps - 1];
  const double target = uniforms[r] * total;
  if (part > 0.0 && before <= target && target < before + part) {
    double c = before;
    for (int64_t v = begin; v < end; ++v) {
      c += static_cast<double>(expf(row[v] - m) / s);
      if (c > target) {
        atomicMin(&found, static_cast<unsigned long long>(v));
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) out[r] = static_cast<int64_t>(found);
}

}  // namespace

int inverse_cdf_draw(const float* scores, int64_t rows, int64_t vocab, const double* uniforms, int64_t* out,
                     void* stream) {
  if (rows == 0) return 0;
  const auto kernel = inverse_cdf_draw_kernel;
  ANVIL_LAUNCH(kernel, static_cast<unsigned>(rows), kThreads, static_cast<cudaStream_t>(stream))
  (scores, vocab, uniforms, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace anvil::kernels::cuda
