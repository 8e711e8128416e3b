#pragma once
// Device-wide switches, host-to-device copies and the accelerator's memory
// counters.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/metrics.h"

namespace anvil {

/// float32 matmuls and convolutions on TensorFloat-32 tensor cores (CUDA), or
/// IEEE float32 (PyTorch's default). No effect on the CPU.
void set_tf32(bool on);

/// Whether CUDA paths that no GPU has run yet may run: the fused RoPE,
/// gated-MLP and LayerNorm-backward kernels, packed rows through flash
/// attention, each step read while the next runs, and host batches copied
/// through pinned memory without a wait. Each was tested on the CPU (ATen
/// references, the kernels' source under emulation) but not on a device; off
/// by default, so a GPU user gets only what `bench/gpu/run.sh check` has
/// passed unless they ask (train.unverified_cuda). No effect on the CPU.
bool unverified_cuda_allowed();
void set_unverified_cuda_allowed(bool on);

/// `t` on `device`. A host tensor bound for CUDA goes through pinned memory
/// and is copied without waiting: a pageable tensor's `.to(cuda)` is a copy
/// followed by a stream synchronize, which makes the host wait for every
/// kernel queued before it; a pinned one's copy is queued behind them (the
/// caching host allocator keeps the pinned block until the copy has run).
/// Anywhere else, or while unverified_cuda_allowed() is false (the pinned
/// path has not run on a GPU yet), `t.to(device)`.
at::Tensor to_device(const at::Tensor& t, const c10::Device& device);

/// dst.copy_(src) the same way: a host `src` bound for a CUDA `dst` goes
/// through pinned memory straight into dst's storage (one copy, no wait).
void copy_to_device(at::Tensor& dst, const at::Tensor& src);

/// The caching allocator's counters for `device` since the previous call
/// (whose peaks it then resets): memory/gpu_peak_bytes (the most bytes held
/// by tensors at once, torch.cuda.max_memory_allocated's measure),
/// memory/gpu_peak_reserved_bytes (held by the allocator, allocated or
/// cached), memory/gpu_allocated_bytes (held by tensors now); and, where
/// count_cpu_tensors() counts them (core/host_memory.h), the same for host
/// tensors since the previous call: memory/cpu_peak_bytes,
/// memory/cpu_allocated_bytes.
Metrics accelerator_memory_metrics(const c10::Device& device);

/// The memory a plan of `device` is held against: a GPU's total (its
/// allocator's getMemoryInfo), the host's (MemTotal in /proc/meminfo) for
/// the CPU; -1 where it cannot be known (no such device visible here).
int64_t device_memory_bytes(const c10::Device& device);

/// Returns the caching allocator's unused blocks to the device (after an
/// out-of-memory error, before trying again smaller); nothing for the CPU.
void release_cached_memory(const c10::Device& device);

}  // namespace anvil
