// src/kernels/rope, glu and layer_norm: the fused ops against HF's ATen
// composition (at::layer_norm) and the gradients autograd takes through it
// (double, float, bfloat16; the layouts the families hand them: transposed
// projections, NeoX's interleaved q/k/v, Phi-3's fused gate_up halves, one
// decoding token; partial rotary and per-row tables; LayerNorm with and
// without a bias). On the CPU the fused ops run the references, which must
// equal the composition bit for bit. Where a GPU is present, each CUDA kernel
// against its reference on the device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/dispatch.h"
#include "kernels/layer_norm.h"
#include "kernels/rope.h"
#include "kernels/glu.h"

namespace anvil::kernels {
namespace {

/// Lets the CUDA kernels run for a scope (train.unverified_cuda), as bench_kernels does.
struct UnverifiedCuda {
  UnverifiedCuda() { set_unverified_cuda_allowed(true); }
  ~UnverifiedCuda() { set_unverified_cuda_allowed(false); }
};

/// HF's apply_rotary_pos_emb on the first R features, the rest passed through.
at::Tensor hf_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t R = cos.size(-1), D = x.size(-1);
  const auto rot = x.narrow(-1, 0, R), pass = x.narrow(-1, R, D - R);
  const auto rotate_half = at::cat({-rot.narrow(-1, R / 2, R / 2), rot.narrow(-1, 0, R / 2)}, -1);
  return at::cat({rot * cos + rotate_half * sin, pass}, -1);
}

struct Grads {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

/// f's output and the gradients of `inputs` for the loss sum(out * w).
template <typename F>
Grads run(F&& f, const std::vector<at::Tensor>& inputs, const at::Tensor& w) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().set_requires_grad(true));
  Grads r;
  r.out = f(leaves);
  torch::autograd::backward({(r.out * w).sum()});
  r.out = r.out.detach();
  for (const auto& l : leaves) r.grads.push_back(l.grad());
  return r;
}

struct RopeCase {
  std::string name;
  at::Tensor x;  // (B, H, T, D), in the layout a family hands over
  at::Tensor cos, sin;
};

/// The layouts of the families' q and k, in `dtype`, for head size D and rotary width R.
std::vector<RopeCase> rope_cases(at::ScalarType dtype, int64_t R, const at::Device& device = at::kCPU) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t B = 2, H = 3, T = 5, D = 16;
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const auto table = [&](int64_t rows, int64_t t) {
    const auto angle = at::rand({rows, 1, t, R / 2}, g, o) * 6;
    return std::pair{at::cat({angle.cos(), angle.cos()}, -1).to(device, dtype),
                     at::cat({angle.sin(), angle.sin()}, -1).to(device, dtype)};
  };
  std::vector<RopeCase> cases;
  auto [c1, s1] = table(1, T);
  auto [cb, sb] = table(B, T);
  auto [cd, sd] = table(B, 1);
  const auto x = [&](std::vector<int64_t> shape) { return at::randn(shape, g, o).to(device, dtype); };
  cases.push_back({"transposed projection", x({B, T, H, D}).transpose(1, 2), c1, s1});
  cases.push_back({"per-row tables", x({B, T, H, D}).transpose(1, 2), cb, sb});
  cases.push_back({"NeoX q of [q, k, v]", x({B, H, T, 3 * D}).narrow(-1, 0, D), c1, s1});
  cases.push_back({"contiguous", x({B, H, T, D}), cb, sb});
  cases.push_back({"one decoding token", x({B, 1, H, D}).transpose(1, 2), cd, sd});
  return cases;
}

TEST(Rope, FusedOpEqualsHfCompositionAndItsGradient) {
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    for (int64_t R : {16, 8}) {
      for (const auto& c : rope_cases(dtype, R)) {
        const auto w = at::randn(c.x.sizes(), at::TensorOptions().dtype(dtype));
        const auto want = run([&](const auto& in) { return hf_rope(in[0], c.cos, c.sin); }, {c.x}, w);
        const auto got = run([&](const auto& in) { return rope(in[0], c.cos, c.sin); }, {c.x}, w);
        const auto what = c.name + ", " + c10::toString(dtype) + ", R " + std::to_string(R);
        EXPECT_TRUE(at::equal(got.out, want.out)) << what;
        EXPECT_TRUE(at::equal(got.grads[0], want.grads[0]))
            << what << ": " << (got.grads[0] - want.grads[0]).abs().max();
      }
    }
  }
}

TEST(Rope, TablesThatTakeAGradientGoThroughAutograd) {
  auto c = rope_cases(at::kDouble, 16)[0];
  const auto cos = c.cos.clone().set_requires_grad(true);
  const auto out = rope(c.x, cos, c.sin);
  torch::autograd::backward({out.sum()});
  ASSERT_TRUE(cos.grad().defined());
  EXPECT_TRUE(at::allclose(cos.grad(), c.x.sum(1, /*keepdim=*/true).sum(0, true)));
}

struct GluCase {
  std::string name;
  at::Tensor gate, up;
};

std::vector<GluCase> glu_cases(at::ScalarType dtype, const at::Device& device = at::kCPU) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto x = [&](std::vector<int64_t> shape) {
    return (at::randn(shape, g, at::TensorOptions().dtype(at::kDouble)) * 3).to(device, dtype);
  };
  std::vector<GluCase> cases;
  cases.push_back({"separate projections", x({2, 7, 24}), x({2, 7, 24})});
  const auto fused = x({2, 7, 48});  // Phi-3's gate_up_proj: gate rows, then up rows
  cases.push_back({"halves of a fused projection", fused.narrow(-1, 0, 24), fused.narrow(-1, 24, 24)});
  cases.push_back({"one decoding token", x({3, 1, 40}), x({3, 1, 40})});
  cases.push_back({"odd width", x({5, 13}), x({5, 13})});
  return cases;
}

/// HF's gated MLP: ACT2FN[hidden_act](gate) * up.
at::Tensor hf_gated(const at::Tensor& gate, const at::Tensor& up, GluActivation act) {
  return (act == GluActivation::kSilu ? at::silu(gate) : at::gelu(gate, "tanh")) * up;
}

const char* name_of(GluActivation act) { return act == GluActivation::kSilu ? "silu" : "gelu tanh"; }

TEST(Glu, FusedOpEqualsTheCompositionAndItsGradients) {
  for (auto act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
    for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
      for (const auto& c : glu_cases(dtype)) {
        const auto w = at::randn(c.gate.sizes(), at::TensorOptions().dtype(dtype));
        const auto want = run([&](const auto& in) { return hf_gated(in[0], in[1], act); }, {c.gate, c.up}, w);
        const auto got = run([&](const auto& in) { return glu(in[0], in[1], act); }, {c.gate, c.up}, w);
        const auto what = c.name + ", " + c10::toString(dtype) + ", " + name_of(act);
        EXPECT_TRUE(at::equal(got.out, want.out)) << what;
        EXPECT_TRUE(at::equal(got.grads[0], want.grads[0])) << what << ": gate";
        EXPECT_TRUE(at::equal(got.grads[1], want.grads[1])) << what << ": up";
      }
    }
  }
}

TEST(Glu, HfActivationNamesMapToTheirKernels) {
  EXPECT_EQ(glu_activation("silu"), GluActivation::kSilu);
  EXPECT_EQ(glu_activation("swish"), GluActivation::kSilu);
  EXPECT_EQ(glu_activation("gelu_pytorch_tanh"), GluActivation::kGeluTanh);
  EXPECT_EQ(glu_activation("gelu_new"), GluActivation::kGeluTanh);
  EXPECT_FALSE(glu_activation("gelu").has_value()) << "the exact GELU keeps ATen's composition";
  EXPECT_FALSE(glu_activation("relu").has_value());
}

TEST(Glu, MismatchedInputsAreRefusedWithTheirShapes) {
  try {
    glu(at::zeros({2, 3}), at::zeros({2, 4}), GluActivation::kSilu);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate and up of one shape and dtype expected, got [2, 3]"), std::string::npos)
        << e.what();
  }
}

TEST(LayerNorm, FusedOpEqualsAtLayerNormAndItsGradients) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(9);
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    for (int64_t C : {64, 768}) {
      for (bool bias : {true, false}) {
        const auto o = at::TensorOptions().dtype(at::kDouble);
        const auto x = (at::randn({3, 7, C}, g, o) * 2 + 0.5).to(dtype);
        const auto w = (at::randn({C}, g, o) * 0.1 + 1).to(dtype), b = at::randn({C}, g, o).to(dtype);
        const auto dw = at::randn({3, 7, C}, g, o).to(dtype);
        std::vector<at::Tensor> in{x, w};
        if (bias) in.push_back(b);
        const auto want = run(
            [&](const auto& t) { return at::layer_norm(t[0], {C}, t[1], bias ? t[2] : at::Tensor(), 1e-5); }, in, dw);
        const auto got =
            run([&](const auto& t) { return layer_norm(t[0], t[1], bias ? t[2] : at::Tensor(), 1e-5); }, in, dw);
        const auto what = std::string(c10::toString(dtype)) + ", C " + std::to_string(C) + (bias ? ", bias" : "");
        EXPECT_TRUE(at::equal(got.out, want.out)) << what;
        for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(at::equal(got.grads[i], want.grads[i])) << what << " " << i;
      }
    }
  }
}

/// The largest difference between a and b in units of b's dtype's rounding at b's magnitude.
double ulps(const at::Tensor& a, const at::Tensor& b) {
  const double eps = b.scalar_type() == at::kBFloat16 ? 1.0 / 128 : b.scalar_type() == at::kHalf ? 1.0 / 1024 : 1.2e-7;
  const auto ad = a.cpu().to(at::kDouble), bd = b.cpu().to(at::kDouble);
  return ((ad - bd).abs() / (bd.abs().clamp_min(1e-3) * eps)).max().item<double>();
}

TEST(Rope, CudaKernelEqualsTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const UnverifiedCuda allowed;  // the kernels under test have not passed on a GPU yet
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t R : {16, 8}) {
      for (const auto& c : rope_cases(dtype, R, at::kCUDA)) {
        const auto what = c.name + ", " + c10::toString(dtype) + ", R " + std::to_string(R);
        EXPECT_LE(ulps(rope_forward(c.x, c.cos, c.sin), rope_forward_reference(c.x, c.cos, c.sin)), 1.0) << what;
        EXPECT_LE(ulps(rope_backward(c.x, c.cos, c.sin), rope_backward_reference(c.x, c.cos, c.sin)), 1.0) << what;
      }
    }
  }
}

TEST(Glu, CudaKernelEqualsTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const UnverifiedCuda allowed;  // the kernels under test have not passed on a GPU yet
  for (auto act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      // Each value within one rounding of its own size, plus 1e-6 of the largest: the activation's
      // derivative magnifies float's last bits near its zero, where nvcc may fuse differently from ATen.
      const auto agree = [&](const at::Tensor& a, const at::Tensor& b) {
        const double eps = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.2e-7;
        const auto ad = a.cpu().to(at::kDouble), bd = b.cpu().to(at::kDouble);
        return ((ad - bd).abs() <= bd.abs() * eps + 1e-6 * bd.abs().max()).all().item<bool>();
      };
      for (const auto& c : glu_cases(dtype, at::kCUDA)) {
        const auto what = c.name + ", " + c10::toString(dtype) + ", " + name_of(act);
        const auto dy = at::randn(c.gate.sizes(), c.gate.options());
        EXPECT_TRUE(agree(glu_forward(c.gate, c.up, act), glu_forward_reference(c.gate, c.up, act))) << what;
        const auto [dg, du] = glu_backward(dy, c.gate, c.up, act);
        const auto [rg, ru] = glu_backward_reference(dy, c.gate, c.up, act);
        EXPECT_TRUE(agree(dg, rg)) << what << ": gate";
        EXPECT_TRUE(agree(du, ru)) << what << ": up";
      }
    }
  }
}

}  // namespace
}  // namespace anvil::kernels

namespace anvil::kernels {
namespace {

TEST(LayerNorm, CudaKernelEqualsTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const UnverifiedCuda allowed;  // the kernels under test have not passed on a GPU yet
  auto g = at::make_generator<at::CPUGeneratorImpl>(13);
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // 768 and 256 take the kernel in every dtype; 100 keeps ATen's backward.
    for (int64_t C : {768, 256, 100}) {
      for (int64_t rows : {37, 4096}) {
        const auto o = at::TensorOptions().dtype(at::kDouble);
        const auto dev = at::TensorOptions().dtype(dtype).device(at::kCUDA);
        const auto x = (at::randn({rows, C}, g, o) * 2 + 0.5).to(dev), dy = at::randn({rows, C}, g, o).to(dev);
        const auto w = (at::randn({C}, g, o) * 0.1 + 1).to(dev);
        const auto [y, mean, rstd] = at::native_layer_norm(x, {C}, w, at::Tensor(), 1e-5);
        const auto got = layer_norm_backward(dy, x, mean, rstd, w, true);
        const auto want = layer_norm_backward_reference(dy, x, mean, rstd, w, true);
        const double tol = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 2e-3 : 1.6e-2;
        const auto rel = [](const at::Tensor& a, const at::Tensor& b) {
          return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.to(at::kDouble).abs().max()).item<double>();
        };
        const auto what = std::string(c10::toString(dtype)) + ", " + std::to_string(rows) + " x " + std::to_string(C);
        EXPECT_LE(rel(std::get<0>(got), std::get<0>(want)), tol) << what << ": dx";
        EXPECT_LE(rel(std::get<1>(got), std::get<1>(want)), tol) << what << ": d weight";
        EXPECT_LE(rel(std::get<2>(got), std::get<2>(want)), tol) << what << ": d bias";
      }
    }
  }
}

}  // namespace
}  // namespace anvil::kernels
