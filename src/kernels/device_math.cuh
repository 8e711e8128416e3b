#pragma once
// Device helpers shared by the kernels: conversions between the stored types
// and float, rounding to a stored type, aligned packs for 16-byte loads and
// stores, and the launch. nvcc compiles them; so does g++ for the kernels'
// emulation on the CPU (tests/kernels/emulation/), which defines ANVIL_LAUNCH.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.h"

/// kernel<<<grid, block, 0, stream>>>(arguments...) as ANVIL_LAUNCH(kernel, grid, block, stream)(arguments...),
/// `kernel` a name without commas (a template's instance through a variable).
#ifndef ANVIL_LAUNCH
#define ANVIL_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#endif

namespace anvil::kernels::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// x rounded to T and back: what an ATen op that computes in float and stores
/// a T leaves for the next op to read.
template <typename T>
__device__ __forceinline__ float rounded(float x) {
  return to_float(from_float<T>(x));
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

/// Whether `p` may be read or written as Pack<T, kVec>.
template <typename T, int kVec>
__host__ __device__ __forceinline__ bool pack_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

/// f(T{}) for the element type T that `dtype` names: a launcher's one instance per type. Returns f's
/// cudaError_t, or cudaErrorInvalidValue for an unknown dtype.
template <typename F>
int by_dtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat:
      return f(float{});
    case Dtype::kHalf:
      return f(__half{});
    case Dtype::kBFloat16:
      return f(__nv_bfloat16{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace anvil::kernels::cuda
