#include "core/device.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#include <atomic>
#include <fstream>
#include <limits>
#include <string>

#include "core/host_memory.h"

namespace anvil {

namespace {
std::atomic<bool>& unverified_cuda_flag() {
  static std::atomic<bool> on{false};
  return on;
}
}  // namespace

bool unverified_cuda_allowed() { return unverified_cuda_flag().load(std::memory_order_relaxed); }
void set_unverified_cuda_allowed(bool on) { unverified_cuda_flag().store(on, std::memory_order_relaxed); }

at::Tensor to_device(const at::Tensor& t, const c10::Device& device) {
  if (!t.defined()) return t;
  if (!device.is_cuda() || !t.is_cpu() || !unverified_cuda_allowed()) return t.to(device);
  const auto pinned = t.is_pinned() ? t : t.pin_memory();
  return pinned.to(t.options().device(device), /*non_blocking=*/true);
}

void copy_to_device(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_cuda() || !src.is_cpu() || !unverified_cuda_allowed()) {
    dst.copy_(src);
    return;
  }
  dst.copy_(src.is_pinned() ? src : src.pin_memory(), /*non_blocking=*/true);
}

void set_tf32(bool on) {
  at::globalContext().setAllowTF32CuBLAS(on);
  at::globalContext().setAllowTF32CuDNN(on);
}

Metrics accelerator_memory_metrics(const c10::Device& device) {
  Metrics m;
  if (const auto host = cpu_tensor_memory(TensorPeak::step); host.current >= 0) {
    m["memory/cpu_peak_bytes"] = static_cast<double>(host.peak);
    m["memory/cpu_allocated_bytes"] = static_cast<double>(host.current);
    reset_cpu_tensor_peak(TensorPeak::step);
  }
  if (device.is_cpu() || !at::accelerator::isAccelerator(device.type())) return m;
  auto* allocator = at::getDeviceAllocator(device.type());
  const auto index = device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
  const auto stats = allocator->getDeviceStats(index);
  constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  allocator->resetPeakStats(index);
  m["memory/gpu_peak_bytes"] = static_cast<double>(stats.allocated_bytes[all].peak);
  m["memory/gpu_peak_reserved_bytes"] = static_cast<double>(stats.reserved_bytes[all].peak);
  m["memory/gpu_allocated_bytes"] = static_cast<double>(stats.allocated_bytes[all].current);
  return m;
}

int64_t device_memory_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kib = -1;
    while (in >> key >> kib) {
      if (key == "MemTotal:") return kib * 1024;
      in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return -1;
  }
  if (!at::accelerator::isAccelerator(device.type()) || at::accelerator::deviceCount() == 0) return -1;
  try {
    const auto index = device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
    return static_cast<int64_t>(at::getDeviceAllocator(device.type())->getMemoryInfo(index).second);
  } catch (const c10::Error&) {  // a backend without it, or no such device
    return -1;
  }
}

void release_cached_memory(const c10::Device& device) {
  if (device.is_cpu() || !at::accelerator::isAccelerator(device.type())) return;
  at::getDeviceAllocator(device.type())->emptyCache();
}

}  // namespace anvil
