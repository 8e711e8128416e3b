// One thread per kVec pairs (j, j + half) of a row, or per kVec columns past
// the rotary ones, which are copied. Each product and sum is rounded to the
// element type where ATen's composition (x * cos + rotate_half(x) * sin)
// stores it, and __fmul_rn / __fadd_rn keep nvcc from fusing them, so the
// kernel's results are ATen's bit for bit, forward and backward.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_math.cuh"
#include "kernels/rope_launch.h"

namespace anvil::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float product(float a, float b) {
  return rounded<T>(__fmul_rn(a, b));
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(const T* __restrict__ x, View4 xv, T* __restrict__ out, View4 ov, const T* __restrict__ cos,
                const T* __restrict__ sin, int64_t table_batch, int64_t rotary, bool backward) {
  const int64_t H = xv.size[1], T_ = xv.size[2], D = xv.size[3], half = rotary / 2;
  const int64_t items = (half + D - rotary) / kVec;  // per row: packs of pairs, then packs of copied columns
  const int64_t total = xv.size[0] * H * T_ * items;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t item = e % items, row = e / items;
    const int64_t t = row % T_, bh = row / T_;
    const int64_t h = bh % H, b = bh / H;
    const T* xr = x + b * xv.stride[0] + h * xv.stride[1] + t * xv.stride[2];
    T* outr = out + b * ov.stride[0] + h * ov.stride[1] + t * ov.stride[2];
    const int64_t j = item * kVec;
    if (j >= half) {  // a column past the rotary ones
      const int64_t col = rotary + (j - half);
      *reinterpret_cast<Pack<T, kVec>*>(outr + col) = *reinterpret_cast<const Pack<T, kVec>*>(xr + col);
      continue;
    }
    const int64_t tab = b * table_batch + t * rotary;
    const auto x1 = *reinterpret_cast<const Pack<T, kVec>*>(xr + j);
    const auto x2 = *reinterpret_cast<const Pack<T, kVec>*>(xr + j + half);
    const auto c1 = *reinterpret_cast<const Pack<T, kVec>*>(cos + tab + j);
    const auto c2 = *reinterpret_cast<const Pack<T, kVec>*>(cos + tab + j + half);
    const auto s1 = *reinterpret_cast<const Pack<T, kVec>*>(sin + tab + j);
    const auto s2 = *reinterpret_cast<const Pack<T, kVec>*>(sin + tab + j + half);
    Pack<T, kVec> o1, o2;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float a = to_float(x1.v[i]), bb = to_float(x2.v[i]);
      if (!backward) {
        o1.v[i] = from_float<T>(__fsub_rn(product<T>(a, to_float(c1.v[i])), product<T>(bb, to_float(s1.v[i]))));
        o2.v[i] = from_float<T>(__fadd_rn(product<T>(bb, to_float(c2.v[i])), product<T>(a, to_float(s2.v[i]))));
      } else {
        o1.v[i] = from_float<T>(__fadd_rn(product<T>(a, to_float(c1.v[i])), product<T>(bb, to_float(s2.v[i]))));
        o2.v[i] = from_float<T>(__fsub_rn(product<T>(bb, to_float(c2.v[i])), product<T>(a, to_float(s1.v[i]))));
      }
    }
    *reinterpret_cast<Pack<T, kVec>*>(outr + j) = o1;
    *reinterpret_cast<Pack<T, kVec>*>(outr + j + half) = o2;
  }
}

template <typename T, int kVec>
bool fits(const void* x, const View4& xv, const void* out, const View4& ov, const void* cos, const void* sin,
          int64_t table_batch, int64_t rotary) {
  if (!pack_aligned<T, kVec>(x) || !pack_aligned<T, kVec>(out) || !pack_aligned<T, kVec>(cos) ||
      !pack_aligned<T, kVec>(sin))
    return false;
  if ((rotary / 2) % kVec != 0 || (xv.size[3] - rotary) % kVec != 0 || table_batch % kVec != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (xv.stride[d] % kVec != 0 || ov.stride[d] % kVec != 0) return false;
  return true;
}

template <typename T, int kVec>
int launch(const void* x, const View4& xv, void* out, const View4& ov, const void* cos, const void* sin,
           int64_t table_batch, int64_t rotary, bool backward, cudaStream_t stream) {
  const int64_t items = (rotary / 2 + xv.size[3] - rotary) / kVec;
  const int64_t total = xv.size[0] * xv.size[1] * xv.size[2] * items;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
  const auto kernel = rope_kernel<T, kVec>;
  ANVIL_LAUNCH(kernel, grid, kThreads, stream)
  (static_cast<const T*>(x), xv, static_cast<T*>(out), ov, static_cast<const T*>(cos), static_cast<const T*>(sin),
   table_batch, rotary, backward);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int dispatch(const void* x, const View4& xv, void* out, const View4& ov, const void* cos, const void* sin,
             int64_t table_batch, int64_t rotary, bool backward, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (fits<T, kVec>(x, xv, out, ov, cos, sin, table_batch, rotary))
    return launch<T, kVec>(x, xv, out, ov, cos, sin, table_batch, rotary, backward, stream);
  if (fits<T, 2>(x, xv, out, ov, cos, sin, table_batch, rotary))
    return launch<T, 2>(x, xv, out, ov, cos, sin, table_batch, rotary, backward, stream);
  return launch<T, 1>(x, xv, out, ov, cos, sin, table_batch, rotary, backward, stream);
}

}  // namespace

int rope(const void* x, const View4& xv, void* out, const View4& ov, const void* cos, const void* sin,
         int64_t table_batch, int64_t rotary, Dtype dtype, bool backward, void* stream) {
  if (xv.size[0] * xv.size[1] * xv.size[2] * xv.size[3] == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(dtype, [&](auto zero) {
    return dispatch<decltype(zero)>(x, xv, out, ov, cos, sin, table_batch, rotary, backward, s);
  });
}

}  // namespace anvil::kernels::cuda
