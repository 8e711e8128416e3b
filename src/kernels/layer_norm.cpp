#include "kernels/layer_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#if ANVIL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/device.h"
#include "kernels/dispatch.h"
#include "kernels/fallback.h"
#include "kernels/layer_norm_launch.h"
#endif

namespace anvil::kernels {
namespace {

#if ANVIL_WITH_CUDA_KERNELS
bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

std::atomic<bool> kernel_off{false};

/// The kernel's gradients, or nothing where it does not apply.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> backward_kernel(const at::Tensor& grad,
                                                                              const at::Tensor& x,
                                                                              const at::Tensor& mean,
                                                                              const at::Tensor& rstd,
                                                                              const at::Tensor& weight, bool bias) {
  const auto dtype = kernel_dtype(x);
  const int64_t C = x.size(-1);
  if (kernel_off.load() || !x.is_cuda() || !unverified_cuda_allowed() || !dtype || !x.is_contiguous() ||
      weight.scalar_type() != x.scalar_type() || !weight.is_contiguous() || weight.numel() != C ||
      mean.scalar_type() != at::kFloat || rstd.scalar_type() != at::kFloat ||
      !cuda::layer_norm_backward_fits(C, *dtype))
    return std::nullopt;
  const c10::cuda::CUDAGuard guard(x.device());
  const auto dy = grad.to(x.scalar_type()).contiguous();
  if (!aligned16(x) || !aligned16(dy) || !aligned16(weight)) return std::nullopt;
  const auto m = mean.contiguous(), r = rstd.contiguous();
  const int64_t rows = x.numel() / C;
  auto dx = at::empty(x.sizes(), x.options());
  auto dw = at::empty({C}, weight.options());
  auto db = bias ? at::empty({C}, weight.options()) : at::Tensor();
  auto partial = at::empty({cuda::layer_norm_backward_partials(rows), 2, C}, x.options().dtype(at::kFloat));
  const int rc = cuda::layer_norm_backward(dy.data_ptr(), x.data_ptr(), m.data_ptr<float>(), r.data_ptr<float>(),
                                           weight.data_ptr(), rows, C, dx.data_ptr(), dw.data_ptr(),
                                           bias ? db.data_ptr() : nullptr, partial.data_ptr<float>(), *dtype,
                                           c10::cuda::getCurrentCUDAStream().stream());
  if (rc == 0) return std::tuple{dx, dw, db};
  if (!detail::no_code_for_this_gpu(rc, "layer_norm_backward", kernel_off))
    TORCH_CHECK(false, "layer_norm_backward: the CUDA kernel failed to launch (cudaError ", rc, ")");
  return std::nullopt;
}
#endif

/// With a bias (its gradient too), or without (autograd takes no undefined inputs).
struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    auto [y, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, weight, bias, eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto s = ctx->get_saved_variables();
    auto [dx, dw, db] = layer_norm_backward(grads[0], s[0], s[2], s[3], s[1], /*bias=*/true);
    return {dx, dw, db, at::Tensor()};
  }
};

struct LayerNormNoBiasFunction : public torch::autograd::Function<LayerNormNoBiasFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    auto [y, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, weight, at::Tensor(), eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto s = ctx->get_saved_variables();
    auto [dx, dw, db] = layer_norm_backward(grads[0], s[0], s[2], s[3], s[1], /*bias=*/false);
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_reference(const at::Tensor& grad,
                                                                             const at::Tensor& x,
                                                                             const at::Tensor& mean,
                                                                             const at::Tensor& rstd,
                                                                             const at::Tensor& weight, bool bias) {
  // native_layer_norm_backward reads the bias only for its gradient's shape and dtype: no values needed.
  const auto b = bias ? at::empty_like(weight) : at::Tensor();
  return at::native_layer_norm_backward(grad, x, {x.size(-1)}, mean, rstd, weight, b, {true, true, bias});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                   const at::Tensor& mean, const at::Tensor& rstd,
                                                                   const at::Tensor& weight, bool bias) {
#if ANVIL_WITH_CUDA_KERNELS
  if (auto r = backward_kernel(grad, x, mean, rstd, weight, bias)) return *r;
#endif
  return layer_norm_backward_reference(grad, x, mean, rstd, weight, bias);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(weight.defined() && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
                  (!bias.defined() || bias.sizes() == weight.sizes()),
              "layer_norm: a weight (and bias) of x's last dimension expected, got x ", x.sizes(), ", weight ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  return bias.defined() ? LayerNormFunction::apply(x, weight, bias, eps)
                        : LayerNormNoBiasFunction::apply(x, weight, eps);
}

}  // namespace anvil::kernels
