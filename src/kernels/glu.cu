// Elementwise over rows of gate and up, kVec columns a thread: the forward
// writes act(g) * u, the backward both gradients in one pass. The activations
// and their derivatives are ATen's CUDA expressions in float (silu, and GELU's
// tanh approximation); the products are rounded to the element type where
// ATen's composition stores them.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_math.cuh"
#include "kernels/glu_launch.h"

namespace anvil::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <GluActivation A>
__device__ __forceinline__ float activation(float x) {
  if constexpr (A == GluActivation::kSilu) {
    return x / (1.f + expf(-x));
  } else {
    constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
    const float cube = x * x * x;
    return 0.5f * x * (1.f + tanhf(kBeta * (x + kKappa * cube)));
  }
}

/// dy * act'(x).
template <GluActivation A>
__device__ __forceinline__ float activation_backward(float dy, float x) {
  if constexpr (A == GluActivation::kSilu) {
    const float sg = 1.f / (1.f + expf(-x));
    return dy * sg * (1.f + x * (1.f - sg));
  } else {
    constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
    const float sq = x * x, cube = sq * x;
    const float t = tanhf(kBeta * (x + kKappa * cube));
    const float left = 0.5f * x, right = 1.f + t;
    const float left_derivative = 0.5f * right;
    const float right_derivative = left * (1.f - t * t) * (kBeta * (1.f + 3.f * kKappa * sq));
    return dy * (left_derivative + right_derivative);
  }
}

template <typename T, int kVec, GluActivation A>
__global__ void __launch_bounds__(kThreads)
    glu_kernel(const T* __restrict__ gate, int64_t gate_stride, const T* __restrict__ up, int64_t up_stride,
               int64_t rows, int64_t cols, const T* __restrict__ dy, T* __restrict__ out, T* __restrict__ d_gate,
               T* __restrict__ d_up) {
  const int64_t packs = cols / kVec, total = rows * packs;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = e / packs, c = (e % packs) * kVec;
    const auto g = *reinterpret_cast<const Pack<T, kVec>*>(gate + r * gate_stride + c);
    const auto u = *reinterpret_cast<const Pack<T, kVec>*>(up + r * up_stride + c);
    const int64_t at = r * cols + c;
    if (dy == nullptr) {
      Pack<T, kVec> y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float s = rounded<T>(activation<A>(to_float(g.v[i])));
        y.v[i] = from_float<T>(__fmul_rn(s, to_float(u.v[i])));
      }
      *reinterpret_cast<Pack<T, kVec>*>(out + at) = y;
      continue;
    }
    const auto d = *reinterpret_cast<const Pack<T, kVec>*>(dy + at);
    Pack<T, kVec> dg, du;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float x = to_float(g.v[i]), dyf = to_float(d.v[i]);
      const float s = rounded<T>(activation<A>(x));
      const float ds = rounded<T>(__fmul_rn(dyf, to_float(u.v[i])));  // the gradient of act(g)
      dg.v[i] = from_float<T>(activation_backward<A>(ds, x));
      du.v[i] = from_float<T>(__fmul_rn(dyf, s));
    }
    *reinterpret_cast<Pack<T, kVec>*>(d_gate + at) = dg;
    *reinterpret_cast<Pack<T, kVec>*>(d_up + at) = du;
  }
}

template <typename T, int kVec>
bool fits(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride, int64_t cols, const void* dy,
          const void* out, const void* d_gate, const void* d_up) {
  return cols % kVec == 0 && gate_stride % kVec == 0 && up_stride % kVec == 0 && pack_aligned<T, kVec>(gate) &&
         pack_aligned<T, kVec>(up) && pack_aligned<T, kVec>(dy) && pack_aligned<T, kVec>(out) &&
         pack_aligned<T, kVec>(d_gate) && pack_aligned<T, kVec>(d_up);
}

template <typename T, int kVec, GluActivation A>
int launch(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride, int64_t rows, int64_t cols,
           const void* dy, void* out, void* d_gate, void* d_up, cudaStream_t stream) {
  const int64_t total = rows * (cols / kVec), blocks = (total + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
  const auto kernel = glu_kernel<T, kVec, A>;
  ANVIL_LAUNCH(kernel, grid, kThreads, stream)
  (static_cast<const T*>(gate), gate_stride, static_cast<const T*>(up), up_stride, rows, cols,
   static_cast<const T*>(dy), static_cast<T*>(out), static_cast<T*>(d_gate), static_cast<T*>(d_up));
  return static_cast<int>(cudaGetLastError());
}

template <typename T, GluActivation A>
int dispatch(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride, int64_t rows, int64_t cols,
             const void* dy, void* out, void* d_gate, void* d_up, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (fits<T, kVec>(gate, gate_stride, up, up_stride, cols, dy, out, d_gate, d_up))
    return launch<T, kVec, A>(gate, gate_stride, up, up_stride, rows, cols, dy, out, d_gate, d_up, stream);
  if (fits<T, 2>(gate, gate_stride, up, up_stride, cols, dy, out, d_gate, d_up))
    return launch<T, 2, A>(gate, gate_stride, up, up_stride, rows, cols, dy, out, d_gate, d_up, stream);
  return launch<T, 1, A>(gate, gate_stride, up, up_stride, rows, cols, dy, out, d_gate, d_up, stream);
}

}  // namespace

int glu(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride, int64_t rows, int64_t cols,
        const void* dy, void* out, void* d_gate, void* d_up, GluActivation act, Dtype dtype, void* stream) {
  if (rows * cols == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (act == GluActivation::kSilu)
      return dispatch<T, GluActivation::kSilu>(gate, gate_stride, up, up_stride, rows, cols, dy, out, d_gate, d_up, s);
    return dispatch<T, GluActivation::kGeluTanh>(gate, gate_stride, up, up_stride, rows, cols, dy, out, d_gate, d_up,
                                                 s);
  });
}

}  // namespace anvil::kernels::cuda
