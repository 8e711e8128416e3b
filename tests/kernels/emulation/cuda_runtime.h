#pragma once
// A host stand-in for the CUDA runtime, first on the include path of the
// kernels' emulation (tests/kernels/emulated_*.cpp), so that g++ compiles
// src/kernels/*.cu and their kernels run on the CPU: every block in turn,
// each of its threads an OS thread, with __syncthreads as a barrier of the
// block and __shfl_xor_sync as an exchange within a warp. It checks what the
// kernels compute and where they read and write, not how fast or whether
// memory is coalesced; cuda_bf16.h and cuda_fp16.h are CUDA's own, whose
// conversions run on the host too.

#include <cuda_bf16.h>  // first: its host_defines.h defines __global__, __device__ and __forceinline__ for g++
#include <cuda_fp16.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#undef __shared__
#define __shared__ static  // one per kernel instance, which runs one block at a time
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

struct EmulatedDim {
  unsigned x = 0, y = 1, z = 1;
};
inline thread_local EmulatedDim threadIdx, blockIdx;
inline EmulatedDim blockDim, gridDim;

namespace anvil_emulation {

/// The streaming multiprocessors the emulated device reports (kernels size their grids by it).
inline int sms = 2;

struct Warp {
  alignas(8) unsigned char lanes[32 * 8];  // one value a lane, up to 8 bytes
  std::barrier<> bar{32};
};

inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<Warp>> warps;

/// Every lane of the calling thread's warp posts `v`; each gets the value of lane `from(lane)`.
template <typename T, typename From>
T exchange(T v, From from) {
  static_assert(sizeof(T) <= 8);
  auto& w = *warps[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32;
  auto* slots = reinterpret_cast<T*>(w.lanes);
  slots[lane] = v;
  w.bar.arrive_and_wait();
  const T r = slots[from(lane)];
  w.bar.arrive_and_wait();
  return r;
}

/// Runs kernel(arguments...) over grid x block threads.
template <typename... P>
struct Launch {
  void (*kernel)(P...);
  unsigned grid, block;
  template <typename... A>
  void operator()(A&&... args) const {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b) {
      std::barrier<> bar(static_cast<std::ptrdiff_t>(block));
      block_barrier = &bar;
      warps.clear();
      for (unsigned w = 0; w < (block + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>());
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < block; ++t)
        threads.emplace_back([&, b, t] {
          blockIdx.x = b;
          threadIdx.x = t;
          kernel(static_cast<P>(args)...);
        });
      for (auto& t : threads) t.join();
    }
  }
};
template <typename... P>
Launch<P...> launch(void (*kernel)(P...), unsigned grid, unsigned block) {
  return {kernel, grid, block};
}

}  // namespace anvil_emulation

#define ANVIL_LAUNCH(kernel, grid, block, stream) \
  anvil_emulation::launch(kernel, static_cast<unsigned>(grid), static_cast<unsigned>(block))

// CUDA's headers above declare the runtime's types and functions; the kernels' calls reach these instead.
namespace anvil_emulation {
inline cudaError_t last_error() { return cudaSuccess; }
inline cudaError_t get_device(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t device_attribute(int* value, cudaDeviceAttr, int) {
  *value = sms;
  return cudaSuccess;
}
}  // namespace anvil_emulation
#define cudaGetLastError anvil_emulation::last_error
#define cudaGetDevice anvil_emulation::get_device
#define cudaDeviceGetAttribute anvil_emulation::device_attribute

inline void __syncthreads() { anvil_emulation::block_barrier->arrive_and_wait(); }

// Every lane of the warp calls these together, as the kernels do (whole warps in uniform loops).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return anvil_emulation::exchange(v, [&](unsigned lane) { return lane ^ static_cast<unsigned>(lane_mask); });
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
  return anvil_emulation::exchange(v, [&](unsigned lane) { return lane >= delta ? lane - delta : lane; });
}

inline unsigned long long atomicMin(unsigned long long* address, unsigned long long v) {
  static std::mutex m;
  const std::lock_guard<std::mutex> lock(m);
  const auto old = *address;
  if (v < old) *address = v;
  return old;
}

// Round-to-nearest products and sums that nvcc does not fuse; g++ for x86-64 without FMA fuses nothing either.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
