#include "kernels/rope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#if ANVIL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/device.h"
#include "kernels/dispatch.h"
#include "kernels/fallback.h"
#include "kernels/rope_launch.h"
#endif

namespace anvil::kernels {
namespace {

bool shapes_fit(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (x.dim() != 4 || cos.dim() != 4 || cos.sizes() != sin.sizes()) return false;
  const int64_t R = cos.size(-1);
  return R > 0 && R % 2 == 0 && R <= x.size(3) && cos.size(2) == x.size(2) && cos.size(1) == 1 &&
         (cos.size(0) == 1 || cos.size(0) == x.size(0));
}

void check_shapes(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(shapes_fit(x, cos, sin), "rope: x (B, H, T, D) and cos, sin (B or 1, 1, T, R) with R even and at ",
              "most D expected, got ", x.sizes(), ", ", cos.sizes(), ", ", sin.sizes());
}

/// The rotary part's result joined to the passed-through features of `x`.
at::Tensor join(const at::Tensor& rotated, const at::Tensor& x, int64_t R) {
  const int64_t D = x.size(-1);
  return R == D ? rotated : at::cat({rotated, x.narrow(-1, R, D - R)}, -1);
}

#if ANVIL_WITH_CUDA_KERNELS
cuda::View4 view4(const at::Tensor& t) {
  cuda::View4 v{};
  for (int d = 0; d < 4; ++d) v.size[d] = t.size(d);
  for (int d = 0; d < 3; ++d) v.stride[d] = t.stride(d);
  return v;
}

/// The kernel's result, or an undefined tensor where it does not apply.
at::Tensor rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  static std::atomic<bool> off{false};
  const auto dtype = kernel_dtype(x);
  if (off.load() || !x.is_cuda() || !unverified_cuda_allowed() || !dtype || x.stride(3) != 1 ||
      cos.scalar_type() != x.scalar_type() || sin.scalar_type() != x.scalar_type() || cos.device() != x.device() ||
      sin.device() != x.device())
    return {};
  const c10::cuda::CUDAGuard guard(x.device());
  const auto c = cos.contiguous(), s = sin.contiguous();
  const int64_t R = c.size(-1), table_batch = c.size(0) == 1 ? 0 : c.size(2) * R;
  // Same layout as x where x is dense (a transposed projection), else contiguous.
  auto out = at::empty_like(x);
  if (out.stride(3) != 1) out = at::empty(x.sizes(), x.options());
  const int rc = cuda::rope(x.data_ptr(), view4(x), out.data_ptr(), view4(out), c.data_ptr(), s.data_ptr(), table_batch,
                            R, *dtype, backward, c10::cuda::getCurrentCUDAStream().stream());
  if (rc == 0) return out;
  if (!detail::no_code_for_this_gpu(rc, "rope", off))
    TORCH_CHECK(false, "rope: the CUDA kernel failed to launch (cudaError ", rc, ")");
  return {};
}
#endif

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_forward(x, cos, sin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    return {rope_backward(grads[0], saved[0], saved[1]), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rope_forward_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t R = cos.size(-1);
  const auto rot = R == x.size(-1) ? x : x.narrow(-1, 0, R);
  const auto halves = rot.chunk(2, -1);
  const auto rotated = at::cat({-halves[1], halves[0]}, -1);  // HF rotate_half
  return join(rot * cos + rotated * sin, x, R);
}

at::Tensor rope_backward_reference(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  // rotate_half is a signed permutation; its transpose maps (a, b) to (b, -a).
  const int64_t R = cos.size(-1);
  const auto g = R == grad.size(-1) ? grad : grad.narrow(-1, 0, R);
  const auto halves = (g * sin).chunk(2, -1);
  return join(g * cos + at::cat({halves[1], -halves[0]}, -1), grad, R);
}

namespace {
/// The forward (of x) or the backward (of the output's gradient): the kernel where it applies, else the reference.
at::Tensor rotate(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  check_shapes(t, cos, sin);
#if ANVIL_WITH_CUDA_KERNELS
  if (auto out = rope_kernel(t, cos, sin, backward); out.defined()) return out;
#endif
  return backward ? rope_backward_reference(t, cos, sin) : rope_forward_reference(t, cos, sin);
}
}  // namespace

at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotate(x, cos, sin, /*backward=*/false);
}

at::Tensor rope_backward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  return rotate(grad, cos, sin, /*backward=*/true);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Other shapes, and tables that take a gradient (nothing in Anvil makes them), go through ATen's autograd.
  if (!shapes_fit(x, cos, sin) || cos.requires_grad() || sin.requires_grad())
    return rope_forward_reference(x, cos, sin);
  return RopeFunction::apply(x, cos, sin);
}

}  // namespace anvil::kernels
