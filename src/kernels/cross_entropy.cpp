#include "kernels/cross_entropy.h"

#include <ATen/ATen.h>

#include <limits>

#include "anvil/core/error.h"

#if ANVIL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cross_entropy_launch.h"
#include "kernels/fallback.h"
#endif

namespace anvil::kernels {

at::Tensor cross_entropy_rows_reference(at::Tensor& logits, const at::Tensor& targets, int64_t vocab,
                                        int64_t ignore_index, bool grad, const at::Tensor& grad_scale) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) && vocab > 0 &&
                  vocab <= logits.size(1),
              "cross_entropy_rows: logits (rows, >= vocab) and targets (rows) expected");
  const auto acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto real = logits.narrow(1, 0, vocab);
  const auto logp = at::_log_softmax(real.to(acc), 1, /*half_to_float=*/false);
  const auto valid = targets.ne(ignore_index);
  const auto in_range = targets.ge(0) & targets.lt(vocab);
  const auto safe = targets.masked_fill(in_range.logical_not(), 0).unsqueeze(1);
  auto loss = logp.gather(1, safe).squeeze(1).neg();
  loss.masked_fill_(valid & in_range.logical_not(), std::numeric_limits<double>::quiet_NaN());
  loss.masked_fill_(valid.logical_not(), 0);
  if (grad) {
    // d (-log p[y]) / d x = softmax - onehot; nothing from ignored rows or padding columns.
    auto g = logp.exp();
    g.scatter_add_(1, safe, in_range.to(acc).neg().unsqueeze(1));
    g.masked_fill_(valid.logical_not().unsqueeze(1), 0);
    if (grad_scale.defined()) g.mul_(grad_scale.to(g.device(), acc).unsqueeze(1));
    if (logits.size(1) > vocab) logits.narrow(1, vocab, logits.size(1) - vocab).zero_();
    logits.narrow(1, 0, vocab).copy_(g);
  }
  return loss;
}

at::Tensor cross_entropy_rows(at::Tensor& logits, const at::Tensor& targets, int64_t vocab, int64_t ignore_index,
                              bool grad, const at::Tensor& grad_scale) {
#if ANVIL_WITH_CUDA_KERNELS
  static std::atomic<bool> off{false};
  const auto dtype = logits.scalar_type();
  if (!off.load() && logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() &&
      (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16) && targets.dim() == 1 &&
      targets.size(0) == logits.size(0) && vocab > 0 && vocab <= logits.size(1)) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const auto y = targets.to(logits.device(), at::kLong).contiguous();
    auto loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
    const auto scale =
        grad && grad_scale.defined() ? grad_scale.to(logits.device(), at::kFloat).contiguous() : at::Tensor();
    TORCH_CHECK(!scale.defined() || scale.numel() == logits.size(0),
                "cross_entropy_rows: one grad_scale per row expected");
    const auto code = dtype == at::kFloat  ? cuda::Dtype::kFloat
                      : dtype == at::kHalf ? cuda::Dtype::kHalf
                                           : cuda::Dtype::kBFloat16;
    const int rc = cuda::cross_entropy_rows(logits.data_ptr(), code, logits.size(0), logits.size(1), vocab,
                                            y.data_ptr<int64_t>(), ignore_index, loss.data_ptr<float>(), grad,
                                            scale.defined() ? scale.data_ptr<float>() : nullptr,
                                            c10::cuda::getCurrentCUDAStream().stream());
    if (rc == 0) return loss;
    if (!detail::no_code_for_this_gpu(rc, "cross_entropy_rows", off))
      throw Error(concat("cross_entropy_rows: the CUDA kernel failed to launch (cudaError ", rc, ")"));
  }
#endif
  return cross_entropy_rows_reference(logits, targets, vocab, ignore_index, grad, grad_scale);
}

}  // namespace anvil::kernels
