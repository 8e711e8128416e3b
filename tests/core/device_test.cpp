// train.tf32 and the accelerator memory metrics (src/core/device.h).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "core/device.h"

TEST(Device, Tf32SwitchesCublasAndCudnnBothWays) {
  auto& ctx = at::globalContext();
  const bool cublas = ctx.allowTF32CuBLAS(), cudnn = ctx.allowTF32CuDNN();
  anvil::set_tf32(true);
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  EXPECT_TRUE(ctx.allowTF32CuDNN());
  anvil::set_tf32(false);
  EXPECT_FALSE(ctx.allowTF32CuBLAS());
  EXPECT_FALSE(ctx.allowTF32CuDNN());
  ctx.setAllowTF32CuBLAS(cublas);
  ctx.setAllowTF32CuDNN(cudnn);
}

TEST(Device, CpuRunsReportNoAcceleratorMemory) {
  EXPECT_TRUE(anvil::accelerator_memory_metrics(at::Device(at::kCPU)).empty());
}

// Runs only where a GPU is visible (the bench/gpu machine); skipped here.
TEST(Device, CudaPeakCoversATensorAndResetsAfterReading) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device dev(at::kCUDA, 0);
  anvil::accelerator_memory_metrics(dev);  // reset the peak
  const int64_t bytes = 64 << 20;
  {
    auto t = at::empty({bytes / 4}, at::TensorOptions().dtype(at::kFloat).device(dev));
    t.fill_(1);
  }
  auto m = anvil::accelerator_memory_metrics(dev);
  ASSERT_EQ(m.count("memory/gpu_peak_bytes"), 1u);
  EXPECT_GE(m["memory/gpu_peak_bytes"], static_cast<double>(bytes));
  EXPECT_GE(m["memory/gpu_peak_reserved_bytes"], m["memory/gpu_peak_bytes"]);
  // Freed and reset: the next window's peak is what is held now.
  auto next = anvil::accelerator_memory_metrics(dev);
  EXPECT_LT(next["memory/gpu_peak_bytes"], static_cast<double>(bytes));
}
