// The CUDA kernels of src/kernels/ (cross_entropy_rows, inverse_cdf_draw, rope, glu,
// layer_norm's backward) run
// on the CPU by emulation (tests/kernels/emulation/cuda_runtime.h: g++
// compiles the .cu files, each block's threads run as OS threads), against
// ATen's composition on the same inputs: the indexing, the vector widths
// (16-byte packs, pairs, single elements), strided rows, partial rotary,
// per-row tables, the grid-stride loops, the warp sums and the blocks'
// partial sums. A GPU's own check is bench/gpu/run.sh check; this one runs
// everywhere, so a kernel's logic is tested before a GPU has seen it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cross_entropy_launch.h"
#include "kernels/draw_launch.h"
#include "kernels/layer_norm_launch.h"
#include "kernels/rope_launch.h"
#include "kernels/glu_launch.h"

namespace {

namespace cuda = anvil::kernels::cuda;

cuda::Dtype dtype_of(at::ScalarType t) {
  return t == at::kFloat ? cuda::Dtype::kFloat : t == at::kHalf ? cuda::Dtype::kHalf : cuda::Dtype::kBFloat16;
}

/// The largest difference in units of the rounding of `b`'s dtype at each value's magnitude.
double ulps(const at::Tensor& a, const at::Tensor& b) {
  const auto t = b.scalar_type();
  const double eps = t == at::kBFloat16 ? 1.0 / 128 : t == at::kHalf ? 1.0 / 1024 : 1.2e-7;
  const auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  return ((ad - bd).abs() / (bd.abs().clamp_min(1e-3) * eps)).max().item<double>();
}

// --- cross_entropy_rows -------------------------------------------------------------------------

TEST(EmulatedCrossEntropyRows, KernelEqualsAtenLossAndGradient) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(24);
  constexpr int64_t kIgnore = -100;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // A padded width (16-byte packs, padding columns zeroed) and an odd one (one element at a time).
    for (auto [width, vocab] : {std::pair<int64_t, int64_t>{1088, 1050}, {517, 515}}) {
      const int64_t rows = 5;
      const auto x = (at::randn({rows, width}, g, at::TensorOptions().dtype(at::kDouble)) * 3).to(dtype);
      auto y = at::randint(vocab, {rows}, g, at::TensorOptions().dtype(at::kLong));
      y[1] = kIgnore;
      const auto scale = at::rand({rows}, g, at::TensorOptions().dtype(at::kFloat));
      auto logits = x.clone();
      auto loss = at::empty({rows}, at::kFloat);
      ASSERT_EQ(cuda::cross_entropy_rows(logits.data_ptr(), dtype_of(dtype), rows, width, vocab, y.data_ptr<int64_t>(),
                                         kIgnore, loss.data_ptr<float>(), true, scale.data_ptr<float>(), nullptr),
                0);
      // ATen in double on the same values: the loss, and its gradient times each row's scale.
      auto ref_x = x.narrow(1, 0, vocab).to(at::kDouble).requires_grad_(true);
      const auto ref = at::cross_entropy_loss(ref_x, y, {}, at::Reduction::None, kIgnore);
      ref.backward(scale.to(at::kDouble));
      const auto what = std::string(c10::toString(dtype)) + ", " + std::to_string(width) + " wide";
      EXPECT_LE((loss.to(at::kDouble) - ref.detach()).abs().max().item<double>(), 2e-5) << what;
      const double tol = dtype == at::kFloat ? 4e-6 : 4e-3;
      EXPECT_LE((logits.narrow(1, 0, vocab).to(at::kDouble) - ref_x.grad()).abs().max().item<double>(), tol) << what;
      EXPECT_EQ(logits.narrow(1, vocab, width - vocab).abs().max().item<double>(), 0.0) << what << ": padding";
    }
  }
}

// --- inverse_cdf_draw ---------------------------------------------------------------------------

TEST(EmulatedInverseCdfDraw, KernelDrawsTheTokenTheCumulativeProbabilitiesPick) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(25);
  // A vocabulary narrower than the block's 1024 threads (empty segments) and one wider (several a thread);
  // a third of the tokens masked.
  for (int64_t vocab : {300, 2500}) {
    const int64_t rows = 4;
    auto x = at::randn({rows, vocab}, g, at::TensorOptions().dtype(at::kFloat)) * 3;
    x.masked_fill_(at::rand({rows, vocab}, g) < 0.33, -INFINITY);
    const auto u = at::rand({rows}, g, at::TensorOptions().dtype(at::kDouble));
    auto out = at::empty({rows}, at::kLong);
    ASSERT_EQ(cuda::inverse_cdf_draw(x.data_ptr<float>(), rows, vocab, u.data_ptr<double>(), out.data_ptr<int64_t>(),
                                     nullptr),
              0);
    // The first token whose cumulative probability (softmax in double) exceeds u times the total.
    const auto cdf = at::softmax(x.to(at::kDouble), 1).cumsum(1);
    const auto target = (u * cdf.select(1, vocab - 1)).unsqueeze(1);
    const auto want = (cdf <= target).sum(1).clamp_max(vocab - 1);
    EXPECT_TRUE(at::equal(out, want)) << "vocab " << vocab << ": " << out << " against " << want;
    EXPECT_FALSE(at::isinf(x.gather(1, out.unsqueeze(1))).any().item<bool>()) << "a masked token was drawn";
  }
}

// --- rope ---------------------------------------------------------------------------------------

at::Tensor hf_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t R = cos.size(-1), D = x.size(-1);
  const auto rot = x.narrow(-1, 0, R);
  const auto rotate_half = at::cat({-rot.narrow(-1, R / 2, R / 2), rot.narrow(-1, 0, R / 2)}, -1);
  return at::cat({rot * cos + rotate_half * sin, x.narrow(-1, R, D - R)}, -1);
}

/// x's gradient through hf_rope for the output's gradient `grad`, by ATen's autograd.
at::Tensor hf_rope_backward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  auto x = at::zeros(grad.sizes(), grad.options()).requires_grad_(true);
  hf_rope(x, cos, sin).backward(grad);
  return x.grad();
}

cuda::View4 view4(const at::Tensor& t) {
  cuda::View4 v{};
  for (int d = 0; d < 4; ++d) v.size[d] = t.size(d);
  for (int d = 0; d < 3; ++d) v.stride[d] = t.stride(d);
  return v;
}

at::Tensor emulated_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  auto out = at::empty_like(x);
  if (out.stride(3) != 1) out = at::empty(x.sizes(), x.options());
  const int64_t R = cos.size(-1), table_batch = cos.size(0) == 1 ? 0 : cos.size(2) * R;
  EXPECT_EQ(cuda::rope(x.data_ptr(), view4(x), out.data_ptr(), view4(out), cos.data_ptr(), sin.data_ptr(), table_batch,
                       R, dtype_of(x.scalar_type()), backward, nullptr),
            0);
  return out;
}

TEST(EmulatedRope, KernelEqualsHfCompositionForwardAndBackward) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(21);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // D 16 with R 16 (16-byte packs in 16-bit types), R 8 (pairs), and D 6 (one element at a time).
    for (auto [D, R] : {std::pair<int64_t, int64_t>{16, 16}, {16, 8}, {6, 6}}) {
      const int64_t B = 2, H = 3, T = 5;
      const auto table = [&](int64_t rows, int64_t t) {
        const auto angle = at::rand({rows, 1, t, R / 2}, g, o) * 6;
        return std::pair{at::cat({angle.cos(), angle.cos()}, -1).to(dtype).contiguous(),
                         at::cat({angle.sin(), angle.sin()}, -1).to(dtype).contiguous()};
      };
      const auto [c1, s1] = table(1, T);
      const auto [cb, sb] = table(B, T);
      const auto [cd, sd] = table(B, 1);
      const auto x = [&](std::vector<int64_t> shape) { return at::randn(shape, g, o).to(dtype); };
      struct Case {
        std::string name;
        at::Tensor x, cos, sin;
      };
      const std::vector<Case> cases{
          {"transposed projection", x({B, T, H, D}).transpose(1, 2), c1, s1},
          {"per-row tables", x({B, T, H, D}).transpose(1, 2), cb, sb},
          {"NeoX k of [q, k, v]", x({B, H, T, 3 * D}).narrow(-1, D, D), c1, s1},
          {"one decoding token", x({B, 1, H, D}).transpose(1, 2), cd, sd},
      };
      for (const auto& c : cases) {
        const auto what =
            c.name + ", " + c10::toString(dtype) + ", D " + std::to_string(D) + ", R " + std::to_string(R);
        EXPECT_TRUE(at::equal(emulated_rope(c.x, c.cos, c.sin, false), hf_rope(c.x, c.cos, c.sin))) << what;
        EXPECT_TRUE(at::equal(emulated_rope(c.x, c.cos, c.sin, true), hf_rope_backward(c.x, c.cos, c.sin)))
            << what << ": backward";
      }
    }
  }
}

// --- glu (SwiGLU, GeGLU) --------------------------------------------------------------------------

/// The leading dimensions' row stride of a (rows, cols) view whose columns are contiguous.
int64_t row_stride(const at::Tensor& t) { return t.dim() == 1 ? t.size(0) : t.stride(-2); }

TEST(EmulatedGlu, KernelEqualsTheCompositionForwardAndBackward) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(22);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  for (auto act : {cuda::GluActivation::kSilu, cuda::GluActivation::kGeluTanh}) {
    const bool silu = act == cuda::GluActivation::kSilu;
    const auto activation = [&](const at::Tensor& t) { return silu ? at::silu(t) : at::gelu(t, "tanh"); };
    const auto activation_backward = [&](const at::Tensor& d, const at::Tensor& t) {
      return silu ? at::silu_backward(d, t) : at::gelu_backward(d, t, "tanh");
    };
    for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const auto x = [&](std::vector<int64_t> shape) { return (at::randn(shape, g, o) * 3).to(dtype); };
      const auto fused = x({9, 48});
      struct Case {
        std::string name;
        at::Tensor gate, up;
      };
      const std::vector<Case> cases{
          {"16-byte packs", x({9, 64}), x({9, 64})},
          {"halves of a fused projection (row stride 48, up at 24)", fused.narrow(-1, 0, 24), fused.narrow(-1, 24, 24)},
          {"odd width", x({5, 13}), x({5, 13})},
      };
      for (const auto& c : cases) {
        const int64_t rows = c.gate.size(0), cols = c.gate.size(1);
        const auto what = c.name + ", " + c10::toString(dtype) + (silu ? ", silu" : ", gelu tanh");
        auto out = at::empty({rows, cols}, c.gate.options());
        ASSERT_EQ(cuda::glu(c.gate.data_ptr(), row_stride(c.gate), c.up.data_ptr(), row_stride(c.up), rows, cols,
                            nullptr, out.data_ptr(), nullptr, nullptr, act, dtype_of(dtype), nullptr),
                  0);
        // Each value within one rounding of its own size, plus 1e-6 of the largest: glibc's expf and tanhf
        // here and ATen's vectorised ones (Sleef) differ in their last float bits, which the activation's
        // derivative magnifies near its zero (silu's at x = -1.28, GELU's at -0.75; on a GPU both sides use
        // CUDA's functions).
        const auto agree = [&](const at::Tensor& a, const at::Tensor& b) {
          const double eps = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.2e-7;
          const auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
          const auto allowed = bd.abs() * eps + 1e-6 * bd.abs().max();
          return ((ad - bd).abs() <= allowed).all().item<bool>();
        };
        EXPECT_TRUE(agree(out, activation(c.gate) * c.up)) << what;
        const auto dy = x({rows, cols});
        auto dg = at::empty_like(out), du = at::empty_like(out);
        ASSERT_EQ(cuda::glu(c.gate.data_ptr(), row_stride(c.gate), c.up.data_ptr(), row_stride(c.up), rows, cols,
                            dy.data_ptr(), nullptr, dg.data_ptr(), du.data_ptr(), act, dtype_of(dtype), nullptr),
                  0);
        // What autograd computes for act(gate) * up.
        EXPECT_TRUE(agree(dg, activation_backward(dy * c.up, c.gate))) << what << ": gate";
        EXPECT_TRUE(agree(du, dy * activation(c.gate))) << what << ": up";
      }
    }
  }
}

// --- layer_norm's backward ----------------------------------------------------------------------

TEST(EmulatedLayerNorm, BackwardKernelEqualsTheFormulaInDouble) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(23);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  struct Case {
    at::ScalarType dtype;
    int64_t rows, cols;
  };
  // 1, 3 and 4 packs a lane; more rows than the emulated device's 4 blocks of 8 warps take at once.
  for (const auto& c : std::vector<Case>{{at::kBFloat16, 37, 256},
                                         {at::kBFloat16, 300, 768},
                                         {at::kHalf, 21, 1024},
                                         {at::kFloat, 45, 128},
                                         {at::kFloat, 9, 512}}) {
    const auto what =
        std::string(c10::toString(c.dtype)) + ", " + std::to_string(c.rows) + " x " + std::to_string(c.cols);
    ASSERT_TRUE(cuda::layer_norm_backward_fits(c.cols, dtype_of(c.dtype))) << what;
    const auto x = (at::randn({c.rows, c.cols}, g, o) * 2 + 0.5).to(c.dtype);
    const auto dy = at::randn({c.rows, c.cols}, g, o).to(c.dtype);
    const auto w = (at::randn({c.cols}, g, o) * 0.1 + 1).to(c.dtype);
    // The forward's statistics, in float as CUDA's native_layer_norm keeps them.
    const auto xd = x.to(at::kDouble), dyd = dy.to(at::kDouble), wd = w.to(at::kDouble);
    const auto mean = xd.mean(1).to(at::kFloat);
    const auto rstd = (xd.var(1, /*unbiased=*/false) + 1e-5).rsqrt().to(at::kFloat);
    const int64_t partials = cuda::layer_norm_backward_partials(c.rows);
    EXPECT_EQ(partials, std::min<int64_t>((c.rows + 7) / 8, 4)) << what;
    auto partial = at::full({partials, 2, c.cols}, NAN, at::kFloat);
    auto dx = at::empty_like(x), dw = at::empty_like(w), db = at::empty_like(w);
    ASSERT_EQ(cuda::layer_norm_backward(dy.data_ptr(), x.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                        w.data_ptr(), c.rows, c.cols, dx.data_ptr(), dw.data_ptr(), db.data_ptr(),
                                        partial.data_ptr<float>(), dtype_of(c.dtype), nullptr),
              0);
    // The published backward: dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), dw = sum dy xhat, db = sum dy.
    const auto xhat = (xd - mean.to(at::kDouble).unsqueeze(1)) * rstd.to(at::kDouble).unsqueeze(1);
    const auto gw = dyd * wd;
    const auto want_dx = rstd.to(at::kDouble).unsqueeze(1) * (gw - gw.mean(1, true) - xhat * (gw * xhat).mean(1, true));
    const auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return ((a.to(at::kDouble) - b).abs().max() / b.abs().max()).item<double>();
    };
    const double tol = c.dtype == at::kFloat ? 1e-5 : c.dtype == at::kHalf ? 2e-3 : 1e-2;
    EXPECT_LE(rel(dx, want_dx), tol) << what << ": dx";
    EXPECT_LE(rel(dw, (dyd * xhat).sum(0)), tol) << what << ": d weight";
    EXPECT_LE(rel(db, dyd.sum(0)), tol) << what << ": d bias";
  }
}

}  // namespace
