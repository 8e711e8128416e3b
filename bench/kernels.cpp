// Anvil's kernels (src/kernels/) on a device against an independent
// reference, then timed against the ATen composition they replace
// (bench/gpu/run.sh check; on the CPU, --smoke). One PASS / FAIL line per
// comparison, then one JSON line per timing; exit status 1 on a FAIL.
//
// cross_entropy_rows: loss and gradient against ATen's cross_entropy and its
// autograd in double on the CPU, for float / float16 / bfloat16 logits of
// aligned and odd widths (padding columns, ignored rows).
// inverse_cdf_draw: a chi-square test of the drawn tokens against the
// softmax's probabilities, tokens at -inf never drawn; on CUDA, the tokens of
// the kernel against the ATen reference's on the same uniforms.
// packed attention: layers::attention over packed documents, which on CUDA
// runs flash attention with cumulative lengths, against the block-diagonal
// mask in float32 on the same bfloat16 values (output and the gradients of q,
// k, v, with and without a sliding window), then on CUDA both timed, forward
// and backward.
// rope, glu (silu and GELU-tanh gates), layer_norm: the fused ops (on CUDA
// their kernels) forward and backward against HF's ATen composition in double
// on the CPU, and on CUDA against the composition in the same dtype on the
// device (rope and glu within one rounding, layer_norm's reordered sums within
// a relative bound); then on CUDA both timed, forward and backward, at the
// 1.1B LLaMA's shapes (rope, glu) and GPT-2 124M's (layer_norm).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_util.h"
#include "core/device.h"
#include "data/collate.h"
#include "kernels/cross_entropy.h"
#include "kernels/dispatch.h"
#include "kernels/draw.h"
#include "kernels/glu.h"
#include "kernels/layer_norm.h"
#include "kernels/rope.h"
#include "models/layers.h"

namespace {

using namespace anvil;
constexpr int64_t kIgnore = -100;

int report(bool ok, const std::string& name, const std::string& detail) {
  std::printf("%s %s: %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

void sync(const at::Device& d) {
  if (d.is_cuda()) at::empty({1}, at::TensorOptions().device(d)).cpu();  // waits for the stream
}

int check_cross_entropy(const at::Device& device, at::ScalarType dtype, int64_t rows, int64_t width, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const auto x = (at::randn({rows, width}, gen, at::TensorOptions().dtype(at::kDouble)) * 4).to(dtype);
  auto y = at::randint(vocab, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  y.narrow(0, 0, rows / 4).fill_(kIgnore);
  // The reference: ATen's cross_entropy in double on the values the kernel reads.
  auto ref_x = x.to(at::kDouble).narrow(1, 0, vocab).clone().set_requires_grad(true);
  const auto ref = at::cross_entropy_loss(ref_x, y, {}, at::Reduction::None, kIgnore);
  torch::autograd::backward({ref.sum()});
  auto logits = x.to(device);
  const auto loss = kernels::cross_entropy_rows(logits, y.to(device), vocab, kIgnore, true).cpu().to(at::kDouble);
  const auto grad = logits.cpu().to(at::kDouble);
  const double loss_diff = (loss - ref.detach()).abs().max().item<double>();
  const double grad_diff = (grad.narrow(1, 0, vocab) - ref_x.grad()).abs().max().item<double>();
  const double pad = width > vocab ? grad.narrow(1, vocab, width - vocab).abs().max().item<double>() : 0.0;
  // float: float round-off over the row; 16-bit: the gradient is rounded once to its type (2^-8 relative for
  // bfloat16, of values at most 1).
  const double loss_tol = 2e-5, grad_tol = dtype == at::kFloat ? 4e-6 : dtype == at::kHalf ? 1e-3 : 4e-3;
  char detail[256];
  std::snprintf(detail, sizeof detail,
                "%ld x %ld (vocab %ld), max |loss diff| %.3g (allowed %g), max |grad diff| %.3g "
                "(allowed %g), padding gradient %g",
                static_cast<long>(rows), static_cast<long>(width), static_cast<long>(vocab), loss_diff, loss_tol,
                grad_diff, grad_tol, pad);
  return report(loss_diff <= loss_tol && grad_diff <= grad_tol && pad == 0,
                std::string("cross_entropy_rows on ") + device.str() + ", " + c10::toString(dtype) +
                    " = ATen cross_entropy (double)",
                detail);
}

int check_draw(const at::Device& device) {
  int failed = 0;
  // 8 tokens of known probabilities (one masked), 400,000 rows: counts against the expectation.
  const int64_t rows = 400000, V = 8;
  const auto p = at::tensor({0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.07, 0.0}, at::kDouble);
  const auto scores = p.log().to(at::kFloat).unsqueeze(0).expand({rows, V}).contiguous().to(device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto u = (at::rand({rows}, gen, at::TensorOptions().dtype(at::kDouble)).clamp(1e-12, 1 - 1e-12)).to(device);
  const auto drawn = kernels::inverse_cdf_draw(scores, u).cpu();
  const auto counts = at::bincount(drawn, {}, V).to(at::kDouble);
  const auto expected = p * rows;
  const auto live = p.gt(0);
  const double chi2 = ((counts - expected).square() / expected.clamp_min(1)).masked_select(live).sum().item<double>();
  const double masked = counts[V - 1].item<double>();
  char detail[256];
  // 6 degrees of freedom: P(chi-square > 22.46) = 0.001.
  std::snprintf(detail, sizeof detail,
                "%ld rows over 8 tokens, chi-square %.2f (allowed 22.46, p = 0.001, 6 dof), "
                "masked token drawn %g times",
                static_cast<long>(rows), chi2, masked);
  failed += report(chi2 <= 22.46 && masked == 0,
                   "inverse_cdf_draw on " + device.str() + ": tokens follow the softmax's probabilities", detail);
  if (device.is_cuda()) {
    // GPT-2's vocabulary, random scores with a quarter of the tokens masked: the kernel's tokens against ATen's.
    const int64_t n = 4096, vocab = 50257;
    auto x = at::randn({n, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 3;
    x.masked_fill_(at::rand({n, vocab}, gen) < 0.25, -INFINITY);
    const auto uu = at::rand({n}, gen, at::TensorOptions().dtype(at::kDouble));
    const auto mine = kernels::inverse_cdf_draw(x.to(device), uu.to(device)).cpu();
    const auto ref = kernels::inverse_cdf_draw_reference(x.to(device), uu.to(device)).cpu();
    const auto differ = mine.ne(ref).sum().item<int64_t>();
    const bool masked_drawn = at::isinf(x.gather(1, mine.unsqueeze(1))).any().item<bool>();
    std::snprintf(detail, sizeof detail,
                  "%ld rows x %ld, %ld tokens differ (allowed 0.5 %%: float rounding at bin "
                  "edges), masked token drawn: %s",
                  static_cast<long>(n), static_cast<long>(vocab), static_cast<long>(differ),
                  masked_drawn ? "yes" : "no");
    failed += report(differ * 200 <= n && !masked_drawn, "inverse_cdf_draw CUDA kernel = ATen reference", detail);
  }
  return failed;
}

/// Median seconds of `f` over `reps` runs after 3 warm-ups.
template <typename F>
double time_it(const at::Device& device, int reps, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    sync(device);
    const double t0 = bench::now_s();
    f();
    sync(device);
    t.push_back(bench::now_s() - t0);
  }
  return bench::median(t);
}

/// Packed rows' documents: 4 rows of 1024 tokens cut at random, padding after the last document of each row.
at::Tensor random_documents(at::Generator& gen, int64_t rows, int64_t len) {
  auto doc = at::full({rows, len}, -1, at::kLong);
  for (int64_t b = 0; b < rows; ++b) {
    int64_t t = 0, d = 0;
    const int64_t end = len - at::randint(0, 64, {1}, gen).item<int64_t>();
    while (t < end) {
      const int64_t n = std::min(end - t, at::randint(1, len / 2, {1}, gen).item<int64_t>());
      doc[b].narrow(0, t, n).fill_(d++);
      t += n;
    }
  }
  return doc;
}

struct AttentionRun {
  at::Tensor y, dq, dk, dv;
  std::string node;  // the autograd node under the output's view
};

AttentionRun run_attention(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& w,
                           const models::ForwardArgs& args, const models::layers::AttentionOptions& o) {
  auto q = q0.detach().clone().set_requires_grad(true), k = k0.detach().clone().set_requires_grad(true),
       v = v0.detach().clone().set_requires_grad(true);
  AttentionRun r;
  r.y = models::layers::attention(q, k, v, args, 0, o);
  for (auto fn = r.y.grad_fn(); fn && r.node.size() < 200;
       fn = fn->next_edges().empty() ? nullptr : fn->next_edges()[0].function)
    r.node += fn->name() + " ";
  torch::autograd::backward({(r.y * w.to(r.y.scalar_type())).sum()});
  r.y = r.y.detach();
  r.dq = q.grad(), r.dk = k.grad(), r.dv = v.grad();
  return r;
}

int check_packed_attention(const at::Device& device, int64_t window) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(29);
  const int64_t B = 4, T = 1024, Hq = 8, Hk = 2, D = 64;
  const auto doc = random_documents(gen, B, T);
  const auto offsets = data::document_offsets(doc);
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const auto q = at::randn({B, Hq, T, D}, gen).to(bf), k = at::randn({B, Hk, T, D}, gen).to(bf),
             v = at::randn({B, Hk, T, D}, gen).to(bf), w = at::randn({B, T, Hq * D}, gen).to(device);
  models::ForwardArgs packed, masked;
  packed.documents.doc_ids = doc.to(device);
  packed.documents.cu_seqlens = offsets->cu_seqlens.to(device);
  packed.documents.max_seqlen = offsets->max_seqlen;
  masked.attention_mask = models::layers::document_causal_mask(doc.to(device));
  models::layers::AttentionOptions o;
  o.sliding_window = window;
  const auto flash = run_attention(q, k, v, w, packed, o);
  const auto ref = run_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), w, masked, o);
  // Relative to the reference's largest value: bfloat16 keeps 8 bits, and flash attention rounds its
  // output and gradients once to it.
  const auto rel = [](const at::Tensor& a, const at::Tensor& b) {
    return (a.to(at::kFloat) - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  const double dy = rel(flash.y, ref.y), dq = rel(flash.dq, ref.dq), dk = rel(flash.dk, ref.dk),
               dv = rel(flash.dv, ref.dv), tol = 2e-2;
  // On CUDA the packed path must be flash attention's; on the CPU (--smoke) both attend through the mask.
  const bool took_flash = flash.node.find("FlashAttentionBackward") != std::string::npos || !device.is_cuda();
  char detail[512];
  std::snprintf(detail, sizeof detail,
                "%ld documents in %ld x %ld tokens, %ld/%ld heads of %ld, window %ld: max relative diff "
                "y %.3g, dq %.3g, dk %.3g, dv %.3g (allowed %g); autograd: %s",
                static_cast<long>(offsets->cu_seqlens.size(0) - 1), static_cast<long>(B), static_cast<long>(T),
                static_cast<long>(Hq), static_cast<long>(Hk), static_cast<long>(D), static_cast<long>(window), dy, dq,
                dk, dv, tol, flash.node.c_str());
  int failed =
      report(took_flash && dy <= tol && dq <= tol && dk <= tol && dv <= tol,
             "packed attention on " + device.str() +
                 ": documents (on CUDA, flash attention with cumulative lengths) = the block-diagonal mask (float32)",
             detail);
  if (window == 0 && device.is_cuda()) {
    // Both in bfloat16, forward and backward: what packed rows cost a layer with and without the mask.
    const auto qb = q.detach().clone().set_requires_grad(true);
    const auto step = [&](const models::ForwardArgs& args) {
      auto y = models::layers::attention(qb, k, v, args, 0, o);
      torch::autograd::backward({y.sum()});
    };
    const double t_flash = time_it(device, 20, [&] { step(packed); });
    const double t_mask = time_it(device, 20, [&] { step(masked); });
    std::printf("%s\n", nlohmann::json({{"kernel", "packed_attention"},
                                        {"device", device.str()},
                                        {"dtype", "bfloat16"},
                                        {"shape", "4 x 1024, 8/2 heads of 64, fwd + bwd"},
                                        {"cuda_ms", t_flash * 1e3},
                                        {"aten_ms", t_mask * 1e3},
                                        {"speedup", t_mask / t_flash}})
                            .dump()
                            .c_str());
  }
  return failed;
}

/// The output and the inputs' gradients of f for the loss sum(out * w).
template <typename F>
std::vector<at::Tensor> forward_backward(F&& f, const std::vector<at::Tensor>& inputs, const at::Tensor& w) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().set_requires_grad(true));
  auto out = f(leaves);
  torch::autograd::backward({(out * w.to(out.scalar_type())).sum()});
  std::vector<at::Tensor> r{out.detach()};
  for (const auto& l : leaves) r.push_back(l.grad());
  return r;
}

/// max |a - b| / max |b| over the pairs of tensors (b: the reference).
double max_rel(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto bd = b[i].cpu().to(at::kDouble);
    worst = std::max(worst, (a[i].cpu().to(at::kDouble) - bd).abs().max().item<double>() /
                                std::max(bd.abs().max().item<double>(), 1e-30));
  }
  return worst;
}

/// The largest difference in units of the reference dtype's rounding at each value's magnitude.
double max_ulps(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto dt = b[i].scalar_type();
    const double eps = dt == at::kBFloat16 ? 1.0 / 128 : dt == at::kHalf ? 1.0 / 1024 : 1.2e-7;
    const auto bd = b[i].cpu().to(at::kDouble);
    worst = std::max(worst,
                     ((a[i].cpu().to(at::kDouble) - bd).abs() / (bd.abs().clamp_min(1e-3) * eps)).max().item<double>());
  }
  return worst;
}

/// One fused op against the composition it replaces: in double on the CPU (relative, allowed `tol`), and on
/// CUDA in the same dtype on the device: at most one rounding apart, or with `device_tol` > 0 (sums taken in
/// another order), relative to the largest value at most that.
template <typename Fused, typename Composed>
int check_fused(const at::Device& device, at::ScalarType dtype, const std::string& name, Fused&& fused,
                Composed&& composed, const std::vector<at::Tensor>& cpu_inputs, double tol, double device_tol = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(41);
  // The loss's weights (the output's gradient) held exactly in `dtype`, so both sides see the same gradient.
  const auto w =
      at::randn(cpu_inputs[0].sizes(), gen, at::TensorOptions().dtype(at::kDouble)).to(dtype).to(at::kDouble);
  std::vector<at::Tensor> on_device, in_double;
  for (const auto& t : cpu_inputs)
    on_device.push_back(t.to(device, dtype)), in_double.push_back(t.to(dtype).to(at::kDouble));
  const auto mine = forward_backward(fused, on_device, w.to(device));
  const auto ref = forward_backward(composed, in_double, w);
  const double rel = max_rel(mine, ref);
  double same = 0;
  if (device.is_cuda()) {
    const auto there = forward_backward(composed, on_device, w.to(device));
    same = device_tol > 0 ? max_rel(mine, there) : max_ulps(mine, there);
  }
  const double same_tol = device_tol > 0 ? device_tol : 1.0;
  char detail[256];
  std::snprintf(detail, sizeof detail,
                "output and gradients: max relative diff %.3g vs double (allowed %g); vs the composition in %s "
                "on the device: %.3g %s (allowed %g)",
                rel, tol, c10::toString(dtype), same, device_tol > 0 ? "relative" : "roundings", same_tol);
  return report(rel <= tol && same <= same_tol,
                name + " on " + device.str() + ", " + c10::toString(dtype) + " = HF's ATen composition", detail);
}

at::Tensor hf_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t R = cos.size(-1), D = x.size(-1);
  const auto rot = x.narrow(-1, 0, R);
  const auto rotate_half = at::cat({-rot.narrow(-1, R / 2, R / 2), rot.narrow(-1, 0, R / 2)}, -1);
  return at::cat({rot * cos + rotate_half * sin, x.narrow(-1, R, D - R)}, -1);
}

/// cos and sin tables (1, 1, T, R) of positions 0..T-1, in double.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t T, int64_t R) {
  const auto inv = at::pow(10000.0, -at::arange(0, R, 2, at::kDouble) / static_cast<double>(R));
  const auto f = at::arange(T, at::kDouble).unsqueeze(1) * inv;
  const auto emb = at::cat({f, f}, -1).view({1, 1, T, R});
  return {emb.cos(), emb.sin()};
}

int check_rope(const at::Device& device, at::ScalarType dtype) {
  // q as the families hand it over: (B, T, H, D) transposed to (B, H, T, D); a partial rotary (NeoX).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(37);
  const int64_t B = 2, T = 96, H = 4, D = 64, R = 48;
  const auto [cos, sin] = rope_tables(T, R);
  const auto x = at::randn({B, T, H, D}, gen, at::TensorOptions().dtype(at::kDouble)).transpose(1, 2);
  const auto c = cos.to(device, dtype), s = sin.to(device, dtype);
  const auto cd = cos.to(dtype).to(at::kDouble), sd = sin.to(dtype).to(at::kDouble);
  return check_fused(
      device, dtype, "rope", [&](const auto& in) { return kernels::rope(in[0], c, s); },
      [&](const auto& in) {
        return in[0].scalar_type() == at::kDouble ? hf_rope(in[0], cd, sd) : hf_rope(in[0], c, s);
      },
      {x}, dtype == at::kFloat ? 1e-6 : 2e-2);
}

int check_glu(const at::Device& device, at::ScalarType dtype, kernels::GluActivation act) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(43);
  const auto g = at::randn({128, 352}, gen, at::TensorOptions().dtype(at::kDouble)) * 3;
  const auto u = at::randn({128, 352}, gen, at::TensorOptions().dtype(at::kDouble));
  const bool silu = act == kernels::GluActivation::kSilu;
  return check_fused(
      device, dtype, silu ? "glu (silu)" : "glu (gelu tanh)",
      [act](const auto& in) { return kernels::glu(in[0], in[1], act); },
      [silu](const auto& in) { return (silu ? at::silu(in[0]) : at::gelu(in[0], "tanh")) * in[1]; }, {g, u},
      dtype == at::kFloat ? 1e-6 : 2e-2,
      // On the device against the largest value (one rounding of it in 16-bit types): the activation's
      // derivative magnifies float's last bits near its zero, where nvcc may fuse differently from ATen.
      dtype == at::kFloat  ? 1e-6
      : dtype == at::kHalf ? 1.0 / 1024
                           : 1.0 / 128);
}

int check_layer_norm(const at::Device& device, at::ScalarType dtype) {
  // GPT-2's width, which the backward kernel takes in every dtype.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(47);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const auto x = at::randn({256, 768}, gen, o) * 2 + 0.5;
  const auto w = at::randn({768}, gen, o) * 0.1 + 1, b = at::randn({768}, gen, o);
  return check_fused(
      device, dtype, "layer_norm", [](const auto& in) { return kernels::layer_norm(in[0], in[1], in[2], 1e-5); },
      [](const auto& in) { return at::layer_norm(in[0], {768}, in[1], in[2], 1e-5); }, {x, w, b},
      // 16-bit against double: ATen's CPU backward, the reference on the CPU, sums the weight's and bias's
      // gradients over 256 rows with 1.5-2.7 % error relative to the largest (float32: 3e-7).
      dtype == at::kFloat ? 1e-5 : 4e-2,
      dtype == at::kFloat  ? 1e-5
      : dtype == at::kHalf ? 2e-3
                           : 1.6e-2);
}

/// The fused ops against the composition at the 1.1B LLaMA's shapes (4 x 2048 tokens), forward and backward.
void time_fused_ops(const at::Device& device) {
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const int64_t B = 4, T = 2048, H = 32, D = 64, I = 5632;
  const auto [cos, sin] = rope_tables(T, D);
  const auto c = cos.to(device, at::kBFloat16), s = sin.to(device, at::kBFloat16);
  const auto q = at::randn({B, T, H, D}, bf).transpose(1, 2).detach().requires_grad_(true);
  const auto g = at::randn({B * T, I}, bf).requires_grad_(true), u = at::randn({B * T, I}, bf).requires_grad_(true);
  const auto dq = at::randn({B, H, T, D}, bf), dy = at::randn({B * T, I}, bf);
  const auto timed = [&](const std::string& name, const std::string& shape, auto&& fused, auto&& composed) {
    const double k = time_it(device, 20, fused), a = time_it(device, 20, composed);
    std::printf("%s\n", nlohmann::json({{"kernel", name},
                                        {"device", device.str()},
                                        {"dtype", "bfloat16"},
                                        {"shape", shape},
                                        {"cuda_ms", k * 1e3},
                                        {"aten_ms", a * 1e3},
                                        {"speedup", a / k}})
                            .dump()
                            .c_str());
  };
  timed(
      "rope", "q 4 x 32 x 2048 x 64, fwd + bwd", [&] { torch::autograd::backward({kernels::rope(q, c, s)}, {dq}); },
      [&] { torch::autograd::backward({hf_rope(q, c, s)}, {dq}); });
  // GPT-2 124M's LayerNorm at 16 x 1024 tokens.
  const auto xl = at::randn({16 * 1024, 768}, bf).requires_grad_(true), dl = at::randn({16 * 1024, 768}, bf);
  const auto wl = at::ones({768}, bf).requires_grad_(true), bl = at::zeros({768}, bf).requires_grad_(true);
  timed(
      "layer_norm", "16384 x 768, fwd + bwd",
      [&] { torch::autograd::backward({kernels::layer_norm(xl, wl, bl, 1e-5)}, {dl}); },
      [&] { torch::autograd::backward({at::layer_norm(xl, {768}, wl, bl, 1e-5)}, {dl}); });
  timed(
      "glu (silu)", "8192 x 5632, fwd + bwd",
      [&] { torch::autograd::backward({kernels::glu(g, u, kernels::GluActivation::kSilu)}, {dy}); },
      [&] { torch::autograd::backward({at::silu(g) * u}, {dy}); });
  timed(
      "glu (gelu tanh)", "8192 x 5632, fwd + bwd",
      [&] { torch::autograd::backward({kernels::glu(g, u, kernels::GluActivation::kGeluTanh)}, {dy}); },
      [&] { torch::autograd::backward({at::gelu(g, "tanh") * u}, {dy}); });
}

}  // namespace

int main(int argc, char** argv) {
  auto a = bench::parse_args(argc, argv, {{"device", "cpu"}, {"time-rows", "8192"}, {"vocab", "50257"}});
  const at::Device device(a["device"]);
  // This program is how the kernels and packed attention get checked on a device: it runs them whether or not
  // they have passed before (train.unverified_cuda's paths).
  set_unverified_cuda_allowed(true);
  int failed = 0;
  std::vector<at::ScalarType> dtypes{at::kFloat, at::kBFloat16};
  if (device.is_cuda()) dtypes.push_back(at::kHalf);
  for (auto dtype : dtypes) {
    failed += check_cross_entropy(device, dtype, 64, 1024, 1000);  // aligned rows
    failed += check_cross_entropy(device, dtype, 33, 517, 515);    // odd widths
  }
  failed += check_draw(device);
  for (int64_t window : {0, 256}) failed += check_packed_attention(device, window);
  for (auto dtype : dtypes)
    failed += check_rope(device, dtype) + check_glu(device, dtype, kernels::GluActivation::kSilu) +
              check_glu(device, dtype, kernels::GluActivation::kGeluTanh) + check_layer_norm(device, dtype);
  if (device.is_cuda()) {
    if (!kernels::cuda_kernels_built())
      failed += report(false, "rope, glu and layer_norm CUDA kernels", "this build has no CUDA kernels");
    else
      time_fused_ops(device);
  }
  if (device.is_cuda()) {
    if (!kernels::cuda_kernels_built()) {
      failed += report(false, "cross_entropy_rows CUDA kernel", "this build has no CUDA kernels");
    } else {
      // Against the ATen composition it replaces: a GPT-2 chunk of bf16 logits (vocabulary padded to 64).
      const int64_t rows = std::stol(a["time-rows"]), vocab = std::stol(a["vocab"]);
      const int64_t width = (vocab + 63) / 64 * 64;
      const auto x = at::randn({rows, width}, at::TensorOptions().dtype(at::kBFloat16).device(device));
      const auto y = at::randint(vocab, {rows}, at::TensorOptions().dtype(at::kLong).device(device));
      auto work = x.clone();
      const double kernel = time_it(device, 20, [&] {
        work.copy_(x);
        kernels::cross_entropy_rows(work, y, vocab, kIgnore, true);
      });
      const double aten = time_it(device, 20, [&] {
        work.copy_(x);
        kernels::cross_entropy_rows_reference(work, y, vocab, kIgnore, true);
      });
      const double copy = time_it(device, 20, [&] { work.copy_(x); });
      // A sampling step at batch 128 over float scores.
      const auto scores = at::randn({128, vocab}, at::TensorOptions().dtype(at::kFloat).device(device));
      const auto u = at::rand({128}, at::TensorOptions().dtype(at::kDouble).device(device));
      const double draw_kernel = time_it(device, 50, [&] { kernels::inverse_cdf_draw(scores, u); });
      const double draw_aten = time_it(device, 50, [&] { kernels::inverse_cdf_draw_reference(scores, u); });
      std::printf("%s\n", nlohmann::json({{"kernel", "inverse_cdf_draw"},
                                          {"device", device.str()},
                                          {"dtype", "float32"},
                                          {"rows", 128},
                                          {"width", vocab},
                                          {"cuda_ms", draw_kernel * 1e3},
                                          {"aten_ms", draw_aten * 1e3},
                                          {"speedup", draw_aten / draw_kernel}})
                              .dump()
                              .c_str());
      std::printf("%s\n", nlohmann::json({{"kernel", "cross_entropy_rows"},
                                          {"device", device.str()},
                                          {"dtype", "bfloat16"},
                                          {"rows", rows},
                                          {"width", width},
                                          {"cuda_ms", (kernel - copy) * 1e3},
                                          {"aten_ms", (aten - copy) * 1e3},
                                          {"speedup", (aten - copy) / (kernel - copy)}})
                              .dump()
                              .c_str());
    }
  }
  return failed ? 1 : 0;
}
