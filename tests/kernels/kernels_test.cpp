// src/kernels/: cross_entropy_rows' ATen reference against ATen's own
// cross_entropy and its autograd (float, double, bfloat16; padding columns,
// ignored rows, a target out of range); where a GPU is present, each CUDA
// kernel against its reference (cross_entropy_rows, inverse_cdf_draw; the
// sampler's distribution is tested in models/generate_test.cpp and by
// bench_kernels' chi-square test on the device).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "kernels/cross_entropy.h"
#include "kernels/dispatch.h"
#include "kernels/draw.h"

namespace anvil::kernels {
namespace {

constexpr int64_t kIgnore = -100;

struct Case {
  at::Tensor logits, targets;  // (n, width), (n)
  int64_t vocab;
};

/// n rows of `width` columns, the first `vocab` real; every third row ignored.
Case make_case(int64_t n, int64_t width, int64_t vocab, at::ScalarType dtype, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto logits = (at::randn({n, width}, g, at::TensorOptions().dtype(at::kDouble)) * 3).to(dtype);
  auto targets = at::randint(vocab, {n}, g, at::TensorOptions().dtype(at::kLong));
  for (int64_t r = 0; r < n; r += 3) targets[r] = kIgnore;
  return {logits, targets, vocab};
}

TEST(CrossEntropyRows, ReferenceEqualsAtenCrossEntropyAndItsGradient) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t width : {37, 64}) {
      auto c = make_case(11, width, 37, dtype, 5);
      // ATen's loss and gradient, on the real columns only.
      auto x = c.logits.narrow(1, 0, c.vocab).clone().set_requires_grad(true);
      auto want = at::cross_entropy_loss(x, c.targets, {}, at::Reduction::None, kIgnore);
      want.sum().backward();
      auto logits = c.logits.clone();
      const auto loss = cross_entropy_rows(logits, c.targets, c.vocab, kIgnore, /*grad=*/true);
      const double tol = dtype == at::kDouble ? 1e-12 : 1e-6;
      EXPECT_TRUE(at::allclose(loss, want.detach(), tol, tol)) << (loss - want).abs().max();
      EXPECT_TRUE(at::allclose(logits.narrow(1, 0, c.vocab), x.grad(), tol, tol))
          << (logits.narrow(1, 0, c.vocab) - x.grad()).abs().max();
      if (width > c.vocab) EXPECT_EQ(logits.narrow(1, c.vocab, width - c.vocab).abs().max().item<double>(), 0.0);
      EXPECT_EQ(logits[0].abs().max().item<double>(), 0.0) << "an ignored row's gradient is zero";
      EXPECT_EQ(loss[0].item<double>(), 0.0);
      // Without the gradient the logits are left alone.
      auto kept = c.logits.clone();
      const auto loss_only = cross_entropy_rows(kept, c.targets, c.vocab, kIgnore, /*grad=*/false);
      EXPECT_TRUE(at::equal(kept, c.logits));
      EXPECT_TRUE(at::equal(loss_only, loss));
    }
  }
}

TEST(CrossEntropyRows, BFloat16IsComputedInFloatAndRoundedOnce) {
  auto c = make_case(9, 64, 50, at::kBFloat16, 8);
  auto as_float = c.logits.to(at::kFloat);
  auto logits = c.logits.clone();
  const auto loss = cross_entropy_rows(logits, c.targets, c.vocab, kIgnore, true);
  const auto want = cross_entropy_rows(as_float, c.targets, c.vocab, kIgnore, true);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(loss, want, 1e-6, 1e-6));
  EXPECT_TRUE(at::equal(logits, as_float.to(at::kBFloat16)));
}

TEST(CrossEntropyRows, ATargetOutOfRangeGivesANanLoss) {
  auto c = make_case(4, 16, 10, at::kFloat, 2);
  c.targets[1] = 10;  // a padding column, not a token
  c.targets[2] = -1;
  auto logits = c.logits.clone();
  const auto loss = cross_entropy_rows(logits, c.targets, c.vocab, kIgnore, true);
  EXPECT_TRUE(std::isnan(loss[1].item<double>()));
  EXPECT_TRUE(std::isnan(loss[2].item<double>()));
  EXPECT_TRUE(std::isfinite(loss[3].item<double>()));
}

TEST(CrossEntropyRows, CudaKernelEqualsTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  // Aligned rows (the vectorised loads), and odd widths (one element at a time); a NaN row.
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (auto [width, vocab] : {std::pair<int64_t, int64_t>{50304, 50257}, {1001, 999}, {64, 64}}) {
      auto c = make_case(37, width, vocab, dtype, 11);
      c.logits[5][7] = NAN;
      auto cpu = c.logits.to(at::kFloat);
      const auto want = cross_entropy_rows_reference(cpu, c.targets, vocab, kIgnore, true);
      auto dev = c.logits.to(at::kCUDA);
      const auto got = cross_entropy_rows(dev, c.targets.to(at::kCUDA), vocab, kIgnore, true).cpu();
      EXPECT_TRUE(std::isnan(got[5].item<double>()));
      auto finite = at::ones({37}, at::kBool);
      finite[5] = false;
      EXPECT_TRUE(at::allclose(got.masked_select(finite), want.masked_select(finite), 1e-5, 1e-5))
          << c10::toString(dtype) << " width " << width;
      const auto g = dev.cpu().to(at::kFloat), w = cpu.to(dtype).to(at::kFloat);
      const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_TRUE(at::allclose(g.index({finite}), w.index({finite}), tol, 1e-6))
          << c10::toString(dtype) << " width " << width << ": " << (g.index({finite}) - w.index({finite})).abs().max();
    }
  }
}

TEST(InverseCdfDraw, CudaKernelDrawsTheReferencesTokens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  auto g = at::make_generator<at::CPUGeneratorImpl>(4);
  auto x = at::randn({2048, 5000}, g, at::TensorOptions().dtype(at::kFloat)) * 3;
  x.masked_fill_(at::rand({2048, 5000}, g) < 0.5, -INFINITY);
  const auto u = at::rand({2048}, g, at::TensorOptions().dtype(at::kDouble)).to(at::kCUDA);
  const auto mine = inverse_cdf_draw(x.to(at::kCUDA), u).cpu(), ref = inverse_cdf_draw_reference(x, u.cpu());
  EXPECT_LE(mine.ne(ref).sum().item<int64_t>(), 10) << "float rounding moves a bin edge only rarely";
  EXPECT_FALSE(at::isinf(x.gather(1, mine.unsqueeze(1))).any().item<bool>()) << "a masked token was drawn";
}

}  // namespace
}  // namespace anvil::kernels
