// LayerNorm's backward as llm.c writes it: one warp per row computes dx from
// the row's two sums (of dy * gamma and of dy * gamma * xhat), and keeps its
// columns' shares of d_gamma (dy * xhat) and d_beta (dy) in registers across
// the rows it visits; the block's warps then add theirs in turn into one
// partial sum per block (two blocks per SM), and a second kernel adds the
// blocks' partials per column. No atomics, so the order of every sum is fixed.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_math.cuh"
#include "kernels/layer_norm_launch.h"

namespace anvil::kernels::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kMaxPacks = 4;

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// Columns of lane l: packs p = 0..kPacks-1 of kVec at (p * 32 + l) * kVec. A row's x and dy stay in
/// registers as loaded (16 bytes a pack); d_gamma's and d_beta's shares in float.
template <typename T, int kVec, int kPacks>
// Two blocks an SM (at most 128 registers a thread) where the shares fit them without spilling.
__global__ void __launch_bounds__(kThreads, kPacks* kVec <= 24 ? 2 : 1)
    layer_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                               const float* __restrict__ rstd, const T* __restrict__ gamma, int64_t rows,
                               T* __restrict__ dx, float* __restrict__ partial) {
  constexpr int C = 32 * kVec * kPacks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Pack<T, kVec> gm[kPacks];
  float dg[kPacks][kVec], db[kPacks][kVec];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    gm[p] = *reinterpret_cast<const Pack<T, kVec>*>(gamma + (p * 32 + lane) * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) dg[p][i] = 0.f, db[p][i] = 0.f;
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float mu = mean[r], rs = rstd[r];
    Pack<T, kVec> xs[kPacks], ds[kPacks];
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t at = r * C + (p * 32 + lane) * kVec;
      xs[p] = *reinterpret_cast<const Pack<T, kVec>*>(x + at);
      ds[p] = *reinterpret_cast<const Pack<T, kVec>*>(dy + at);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float d = to_float(ds[p].v[i]), xh = (to_float(xs[p].v[i]) - mu) * rs;
        const float g = d * to_float(gm[p].v[i]);
        a += g;
        b += g * xh;
        dg[p][i] += d * xh;
        db[p][i] += d;
      }
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      Pack<T, kVec> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float xh = (to_float(xs[p].v[i]) - mu) * rs;
        const float g = to_float(ds[p].v[i]) * to_float(gm[p].v[i]);
        out.v[i] = from_float<T>(rs * (g - a - xh * b));
      }
      *reinterpret_cast<Pack<T, kVec>*>(dx + r * C + (p * 32 + lane) * kVec) = out;
    }
  }
  // The block's warps add their shares in turn (warp 0 first), then the block writes its partial.
  __shared__ float sum[2 * C];
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const int c = (p * 32 + lane) * kVec + i;
          sum[c] = w == 0 ? dg[p][i] : sum[c] + dg[p][i];
          sum[C + c] = w == 0 ? db[p][i] : sum[C + c] + db[p][i];
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < 2 * C; c += kThreads) partial[static_cast<int64_t>(blockIdx.x) * 2 * C + c] = sum[c];
}

constexpr int kSumCols = 32, kSumRows = 8;

/// Column c of the blocks' partials (d_gamma's, then d_beta's): kSumRows threads each add every kSumRows-th
/// block's, then the first adds the others' sums in order.
template <typename T>
__global__ void __launch_bounds__(kSumCols* kSumRows)
    sum_partials_kernel(const float* __restrict__ partial, int64_t blocks, int64_t cols, T* __restrict__ d_gamma,
                        T* __restrict__ d_beta) {
  const int lane = threadIdx.x % kSumCols, ty = threadIdx.x / kSumCols;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + lane;
  float s = 0.f;
  if (c < 2 * cols) {
#pragma unroll 4
    for (int64_t k = ty; k < blocks; k += kSumRows) s += partial[k * 2 * cols + c];
  }
  __shared__ float part[kSumRows][kSumCols];
  part[ty][lane] = s;
  __syncthreads();
  if (ty != 0 || c >= 2 * cols) return;
  for (int k = 1; k < kSumRows; ++k) s += part[k][lane];
  if (c < cols)
    d_gamma[c] = from_float<T>(s);
  else if (d_beta != nullptr)
    d_beta[c - cols] = from_float<T>(s);
}

template <typename T, int kVec, int kPacks>
int launch_rows(const T* dy, const T* x, const float* mean, const float* rstd, const T* gamma, int64_t rows, T* dx,
                float* partial, int64_t blocks, cudaStream_t stream) {
  const auto kernel = layer_norm_backward_kernel<T, kVec, kPacks>;
  ANVIL_LAUNCH(kernel, static_cast<unsigned>(blocks), kThreads, stream)(dy, x, mean, rstd, gamma, rows, dx, partial);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch(const void* dy, const void* x, const float* mean, const float* rstd, const void* gamma, int64_t rows,
           int64_t cols, void* dx, void* d_gamma, void* d_beta, float* partial, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t blocks = layer_norm_backward_partials(rows);
  const auto* dyt = static_cast<const T*>(dy);
  const auto* xt = static_cast<const T*>(x);
  const auto* gt = static_cast<const T*>(gamma);
  auto* dxt = static_cast<T*>(dx);
  int rc = static_cast<int>(cudaErrorInvalidValue);
  switch (cols / (32 * kVec)) {
#define ANVIL_LN_PACKS(P)                                                                      \
  case P:                                                                                      \
    rc = launch_rows<T, kVec, P>(dyt, xt, mean, rstd, gt, rows, dxt, partial, blocks, stream); \
    break;
    ANVIL_LN_PACKS(1)
    ANVIL_LN_PACKS(2)
    ANVIL_LN_PACKS(3)
    ANVIL_LN_PACKS(4)
#undef ANVIL_LN_PACKS
  }
  if (rc != 0) return rc;
  const unsigned grid = static_cast<unsigned>((2 * cols + kSumCols - 1) / kSumCols);
  const auto sum = sum_partials_kernel<T>;
  ANVIL_LAUNCH(sum, grid, kSumCols * kSumRows, stream)
  (partial, blocks, cols, static_cast<T*>(d_gamma), static_cast<T*>(d_beta));
  return static_cast<int>(cudaGetLastError());
}

int vec_of(Dtype dtype) { return dtype == Dtype::kFloat ? 4 : 8; }

}  // namespace

bool layer_norm_backward_fits(int64_t cols, Dtype dtype) {
  const int64_t lane_cols = 32 * vec_of(dtype);
  return cols > 0 && cols % lane_cols == 0 && cols / lane_cols <= kMaxPacks;
}

int64_t layer_norm_backward_partials(int64_t rows) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
    sms = 1;
  const int64_t needed = (rows + kWarps - 1) / kWarps;
  const int64_t most = 2 * static_cast<int64_t>(sms);
  return needed < 1 ? 1 : needed < most ? needed : most;
}

int layer_norm_backward(const void* dy, const void* x, const float* mean, const float* rstd, const void* gamma,
                        int64_t rows, int64_t cols, void* dx, void* d_gamma, void* d_beta, float* partial, Dtype dtype,
                        void* stream) {
  if (!layer_norm_backward_fits(cols, dtype)) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(dtype, [&](auto zero) {
    return launch<decltype(zero)>(dy, x, mean, rstd, gamma, rows, cols, dx, d_gamma, d_beta, partial, s);
  });
}

}  // namespace anvil::kernels::cuda
