// train.tf32, host-to-device copies and the accelerator memory metrics (src/core/device.h).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "anvil/config/config.h"
#include "core/device.h"

namespace {
/// Lets the paths no GPU has run yet run for a scope (train.unverified_cuda): the tests below are their checks.
struct UnverifiedCuda {
  UnverifiedCuda() { anvil::set_unverified_cuda_allowed(true); }
  ~UnverifiedCuda() { anvil::set_unverified_cuda_allowed(false); }
};
}  // namespace

// A GPU user gets a CUDA path that no GPU has run only by asking
// (train.unverified_cuda, docs/algorithms.md): off in a fresh process and in
// the config's defaults, and the switch goes both ways.
TEST(Device, UnverifiedCudaPathsAreOffUnlessAskedFor) {
  EXPECT_FALSE(anvil::unverified_cuda_allowed());
  EXPECT_FALSE(anvil::config::TrainConfig{}.unverified_cuda);
  {
    const UnverifiedCuda on;
    EXPECT_TRUE(anvil::unverified_cuda_allowed());
  }
  EXPECT_FALSE(anvil::unverified_cuda_allowed());
}

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

TEST(Device, ToDeviceOnTheCpuIsPlainTo) {
  const auto t = at::arange(6, at::kLong);
  const auto moved = anvil::to_device(t, at::Device(at::kCPU));
  EXPECT_TRUE(at::equal(moved, t));
  EXPECT_FALSE(anvil::to_device(at::Tensor(), at::Device(at::kCPU)).defined());
}

// A host tensor reaches the GPU without the host waiting for the kernels
// queued before the copy, and with the values it had when copied.
TEST(Device, HostTensorsReachCudaWithoutWaitingForTheStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const UnverifiedCuda allowed;
  const at::Device dev(at::kCUDA, 0);
  auto a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
  for (int i = 0; i < 20; ++i) a = at::tanh(at::matmul(a, a));  // some tens of milliseconds queued
  auto host = at::arange(1 << 16, at::kLong);
  const auto on_device = anvil::to_device(host, dev);
  const bool queued = !at::accelerator::getCurrentStream(dev.index()).query();
  host.fill_(-1);  // the copy was taken from pinned memory, not from here
  at::accelerator::synchronizeDevice(dev.index());
  EXPECT_TRUE(queued) << "to_device waited for the stream";
  EXPECT_TRUE(at::equal(on_device.cpu(), at::arange(1 << 16, at::kLong)));
}

TEST(Device, HostTensorsFillCudaBuffersWithoutWaitingForTheStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const UnverifiedCuda allowed;
  const at::Device dev(at::kCUDA, 0);
  auto buffer = at::zeros({1 << 16}, at::TensorOptions().dtype(at::kLong).device(dev));
  const auto storage = buffer.data_ptr();
  auto a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
  for (int i = 0; i < 20; ++i) a = at::tanh(at::matmul(a, a));
  auto host = at::arange(1 << 16, at::kLong);
  anvil::copy_to_device(buffer, host);
  const bool queued = !at::accelerator::getCurrentStream(dev.index()).query();
  host.fill_(-1);
  at::accelerator::synchronizeDevice(dev.index());
  EXPECT_TRUE(queued) << "copy_to_device waited for the stream";
  EXPECT_EQ(buffer.data_ptr(), storage) << "the buffer was replaced, not filled";
  EXPECT_TRUE(at::equal(buffer.cpu(), at::arange(1 << 16, at::kLong)));
}

TEST(Device, CopyToDeviceOnTheCpuIsACopy) {
  auto buffer = at::zeros({5}, at::kLong);
  anvil::copy_to_device(buffer, at::arange(5, at::kLong));
  EXPECT_TRUE(at::equal(buffer, at::arange(5, at::kLong)));
}
