// The counting CPU allocator behind memory/cpu_peak_bytes and the phases'
// tensor peaks (src/core/host_memory.h).
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/device.h"
#include "core/host_memory.h"

namespace anvil {
namespace {

// Every CPU tensor allocated once the allocator is installed counts from its
// allocation to its free, on whichever thread frees it; tensors allocated
// before count neither way; the step's and the phase's peaks reset apart.
TEST(CpuTensorMemory, CountsEachTensorFromItsAllocationToItsFree) {
  auto earlier = at::ones({1000}, at::kFloat);
  count_cpu_tensors();
  count_cpu_tensors();  // once only
  const int64_t base = cpu_tensor_memory(TensorPeak::step).current;
  ASSERT_GE(base, 0);
  reset_cpu_tensor_peak(TensorPeak::step);
  reset_cpu_tensor_peak(TensorPeak::phase);
  constexpr int64_t mib = 1 << 20;
  auto big = at::empty({4 * mib / 4}, at::kFloat);
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base + 4 * mib);
  std::thread([t = std::move(big)]() mutable { t.reset(); }).join();  // freed on another thread
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base);
  earlier.reset();  // allocated before the count: not subtracted
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base);
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).peak, base + 4 * mib);

  // The step's peak is read and reset by the metrics; the phase's stays.
  const auto m = accelerator_memory_metrics(at::Device(at::kCPU));
  ASSERT_EQ(m.count("memory/cpu_peak_bytes"), 1u);
  EXPECT_EQ(m.at("memory/cpu_peak_bytes"), static_cast<double>(base + 4 * mib));
  EXPECT_EQ(m.at("memory/cpu_allocated_bytes"), static_cast<double>(base));
  { auto small = at::empty({mib / 4}, at::kFloat); }
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).peak, base + mib);
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::phase).peak, base + 4 * mib);

  // Raw allocations (ATen's few users of raw_allocate) count as well.
  auto* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(1000);
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base + 1000);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base);
  // Resizing a storage goes through the same allocator.
  auto grown = at::empty({10}, at::kFloat);
  grown.resize_({mib / 4});
  EXPECT_EQ(cpu_tensor_memory(TensorPeak::step).current, base + mib);
}

}  // namespace
}  // namespace anvil
