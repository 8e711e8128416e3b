#include "kernels/glu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#if ANVIL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/device.h"
#include "kernels/dispatch.h"
#include "kernels/fallback.h"
#endif

namespace anvil::kernels {
namespace {

void check_shapes(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() && gate.dim() >= 1,
              "glu: gate and up of one shape and dtype expected, got ", gate.sizes(), " ", gate.scalar_type(), " and ",
              up.sizes(), " ", up.scalar_type());
}

#if ANVIL_WITH_CUDA_KERNELS
/// The distance between rows of t seen as (numel / cols) x cols with
/// contiguous columns, or -1 when its leading dimensions do not collapse
/// into one row stride.
int64_t row_stride(const at::Tensor& t) {
  const int64_t n = t.dim(), cols = t.size(n - 1);
  if (cols > 1 && t.stride(n - 1) != 1) return -1;
  int64_t stride = cols, prev = -1;  // prev: the last dimension of more than one row seen
  for (int64_t d = n - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (prev < 0)
      stride = t.stride(d);
    else if (t.stride(d) != t.stride(prev) * t.size(prev))
      return -1;
    prev = d;
  }
  return stride;
}

bool usable(const at::Tensor& t) { return t.is_cuda() && kernel_dtype(t) && row_stride(t) >= 0; }

std::atomic<bool> kernel_off{false};

/// Runs the kernel: forward when `grad` is undefined (into outs[0]), else backward (into outs[0], outs[1]).
bool run_kernel(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& grad, GluActivation act,
                const std::vector<at::Tensor>& outs) {
  const c10::cuda::CUDAGuard guard(gate.device());
  const int64_t cols = gate.size(-1), rows = cols == 0 ? 0 : gate.numel() / cols;
  const int rc = cuda::glu(gate.data_ptr(), row_stride(gate), up.data_ptr(), row_stride(up), rows, cols,
                           grad.defined() ? grad.data_ptr() : nullptr, grad.defined() ? nullptr : outs[0].data_ptr(),
                           grad.defined() ? outs[0].data_ptr() : nullptr, grad.defined() ? outs[1].data_ptr() : nullptr,
                           act, *kernel_dtype(gate), c10::cuda::getCurrentCUDAStream().stream());
  if (rc == 0) return true;
  if (!detail::no_code_for_this_gpu(rc, "glu", kernel_off))
    TORCH_CHECK(false, "glu: the CUDA kernel failed to launch (cudaError ", rc, ")");
  return false;
}

bool kernel_applies(const at::Tensor& gate, const at::Tensor& up) {
  return !kernel_off.load() && unverified_cuda_allowed() && usable(gate) && usable(up) && up.device() == gate.device();
}
#endif

/// Whether glu_forward's kernel takes these inputs.
bool kernel_runs(const at::Tensor& gate, const at::Tensor& up) {
#if ANVIL_WITH_CUDA_KERNELS
  return kernel_applies(gate, up);
#else
  (void)gate, (void)up;
  return false;
#endif
}

at::Tensor act_reference(const at::Tensor& x, GluActivation act) {
  return act == GluActivation::kSilu ? at::silu(x) : at::gelu(x, "tanh");
}

/// The gradient of act's input given its output's, as ATen's autograd computes it.
at::Tensor act_backward_reference(const at::Tensor& grad, const at::Tensor& x, GluActivation act) {
  return act == GluActivation::kSilu ? at::silu_backward(grad, x) : at::gelu_backward(grad, x, "tanh");
}

/// With the kernel, backward keeps gate and up and recomputes act(gate) inside its kernel; where the
/// reference runs, it keeps what ATen's autograd keeps (act(gate) too), so the CPU recomputes nothing.
struct GluFunction : public torch::autograd::Function<GluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            int64_t act) {
    const auto a = static_cast<GluActivation>(act);
    ctx->saved_data["act"] = act;
    if (kernel_runs(gate, up)) {
      ctx->save_for_backward({gate, up});
      return glu_forward(gate, up, a);
    }
    check_shapes(gate, up);
    auto s = act_reference(gate, a);
    ctx->save_for_backward({gate, up, s});
    return s * up;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto a = static_cast<GluActivation>(ctx->saved_data["act"].toInt());
    const auto saved = ctx->get_saved_variables();
    if (saved.size() == 3)
      return {act_backward_reference(grads[0] * saved[1], saved[0], a), grads[0] * saved[2], at::Tensor()};
    auto [d_gate, d_up] = glu_backward(grads[0], saved[0], saved[1], a);
    return {d_gate, d_up, at::Tensor()};
  }
};

}  // namespace

std::optional<GluActivation> glu_activation(const std::string& hf_name) {
  if (hf_name == "silu" || hf_name == "swish") return GluActivation::kSilu;
  if (hf_name == "gelu_pytorch_tanh" || hf_name == "gelu_new") return GluActivation::kGeluTanh;
  return std::nullopt;
}

at::Tensor glu_forward_reference(const at::Tensor& gate, const at::Tensor& up, GluActivation act) {
  check_shapes(gate, up);
  return act_reference(gate, act) * up;
}

std::pair<at::Tensor, at::Tensor> glu_backward_reference(const at::Tensor& grad, const at::Tensor& gate,
                                                         const at::Tensor& up, GluActivation act) {
  check_shapes(gate, up);
  // What autograd runs for act(gate) * up: mul's two products, then the activation's backward.
  return {act_backward_reference(grad * up, gate, act), grad * act_reference(gate, act)};
}

at::Tensor glu_forward(const at::Tensor& gate, const at::Tensor& up, GluActivation act) {
  check_shapes(gate, up);
#if ANVIL_WITH_CUDA_KERNELS
  if (kernel_applies(gate, up)) {
    auto out = at::empty(gate.sizes(), gate.options());
    if (run_kernel(gate, up, {}, act, {out})) return out;
  }
#endif
  return glu_forward_reference(gate, up, act);
}

std::pair<at::Tensor, at::Tensor> glu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                               GluActivation act) {
  check_shapes(gate, up);
  TORCH_CHECK(grad.sizes() == gate.sizes(), "glu: the gradient's shape ", grad.sizes(), " is not gate's ",
              gate.sizes());
#if ANVIL_WITH_CUDA_KERNELS
  if (kernel_applies(gate, up) && grad.device() == gate.device()) {
    const auto dy = grad.to(gate.scalar_type()).contiguous();
    auto d_gate = at::empty(gate.sizes(), gate.options()), d_up = at::empty(gate.sizes(), gate.options());
    if (run_kernel(gate, up, dy, act, {d_gate, d_up})) return {d_gate, d_up};
  }
#endif
  return glu_backward_reference(grad, gate, up, act);
}

at::Tensor glu(const at::Tensor& gate, const at::Tensor& up, GluActivation act) {
  return GluFunction::apply(gate, up, static_cast<int64_t>(act));
}

}  // namespace anvil::kernels
