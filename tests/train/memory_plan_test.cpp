// The memory plan's last line: the step held against the device's memory (src/train/memory_plan.h).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/device.h"
#include "train/memory_plan.h"

namespace anvil::train {
namespace {

MemoryPlan a_plan() {
  MemoryPlan p;
  p.masters = p.gradients = 100e6;
  p.moments = 200e6;
  p.activations = 100e6;  // 500 MB at a step
  return p;
}

TEST(MemoryPlan, SaysWhetherTheStepFitsTheDeviceAndWhereItIsUnknown) {
  auto p = a_plan();
  EXPECT_EQ(describe(p).find("against"), std::string::npos) << "no line where the memory is unknown";
  p.device_memory = 1e9;
  auto text = describe(p);
  EXPECT_NE(text.find("against the device's memory, 1 GB: fits, 50 % of it per rank, before the process's own "
                      "(LibTorch, the CUDA context)"),
            std::string::npos)
      << text;
  p.device_memory = 4e8;
  text = describe(p);
  EXPECT_NE(text.find("does not fit: 500 MB per rank"), std::string::npos) << text;
  // Generation's whole copy counts beside the state, not beside a step's activations.
  p.device_memory = 1e9;
  p.generation = 700e6;
  text = describe(p);
  EXPECT_NE(text.find("does not fit: 1.1 GB per rank"), std::string::npos) << text;
  // On the CPU an offloaded state is the same memory as the rest.
  auto host = a_plan();
  host.host = true;
  host.offload = true;
  host.device_shards = 50e6;
  host.device_memory = 1e9;
  text = describe(host);
  EXPECT_NE(text.find("against this host's memory, 1 GB (shared by the ranks on it): fits, 55 % of it per rank"),
            std::string::npos)
      << text;
}

TEST(MemoryPlan, TheCpuIsHeldAgainstTheHostsMemory) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  in >> key >> kib;
  ASSERT_EQ(key, "MemTotal:");
  EXPECT_EQ(device_memory_bytes(at::Device(at::kCPU)), kib * 1024);
  const auto plan = held_against(a_plan(), at::Device(at::kCPU));
  EXPECT_TRUE(plan.host);
  EXPECT_EQ(plan.device_memory, static_cast<double>(kib * 1024));
  // No GPU here: a CUDA device's memory is unknown, and the plan says nothing of it.
  if (device_memory_bytes(at::Device(at::kCUDA, 0)) < 0)
    EXPECT_EQ(describe(held_against(a_plan(), at::Device(at::kCUDA, 0))).find("against"), std::string::npos);
}

}  // namespace
}  // namespace anvil::train
