#pragma once
// Cross-entropy over rows of logits, with the gradient written over the
// logits: the inner step of the fused linear cross-entropy (train/lm_loss).
// On CUDA (float, float16, bfloat16) one kernel reads each row in its own
// dtype (kernels/cross_entropy.cu); elsewhere, and as the reference the
// kernel is checked against, an ATen composition.

#include <ATen/core/Tensor.h>

namespace anvil::kernels {

/// loss[r] = logsumexp(logits[r, :vocab]) - logits[r, targets[r]] in float
/// (double for double logits), 0 where targets[r] == ignore_index. With
/// `grad`, `logits` (rows, >= vocab) is overwritten by d loss[r] / d logits[r]
/// = softmax - onehot over the first `vocab` columns, 0 on the rest and on
/// ignored rows, each row times grad_scale[r] when `grad_scale` (rows, float)
/// is given. A target outside [0, vocab) gives a NaN loss.
at::Tensor cross_entropy_rows(at::Tensor& logits, const at::Tensor& targets, int64_t vocab, int64_t ignore_index,
                              bool grad, const at::Tensor& grad_scale = {});

/// The same through ATen operations (what the CPU runs).
at::Tensor cross_entropy_rows_reference(at::Tensor& logits, const at::Tensor& targets, int64_t vocab,
                                        int64_t ignore_index, bool grad, const at::Tensor& grad_scale = {});

}  // namespace anvil::kernels
