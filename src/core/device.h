#pragma once
// Device-wide switches and the accelerator's memory counters.

#include <c10/core/Device.h>

#include "core/metrics.h"

namespace anvil {

/// float32 matmuls and convolutions on TensorFloat-32 tensor cores (CUDA), or
/// IEEE float32 (PyTorch's default). No effect on the CPU.
void set_tf32(bool on);

/// The caching allocator's counters for `device` since the previous call
/// (whose peaks it then resets): memory/gpu_peak_bytes (the most bytes held
/// by tensors at once, torch.cuda.max_memory_allocated's measure),
/// memory/gpu_peak_reserved_bytes (held by the allocator, allocated or
/// cached), memory/gpu_allocated_bytes (held by tensors now). Empty for the CPU.
Metrics accelerator_memory_metrics(const c10::Device& device);

}  // namespace anvil
