#pragma once
// Rotary position embeddings in HF's rotate_half form as one op with its own
// backward. On CUDA (float, float16, bfloat16) each direction is one kernel
// (kernels/rope.cu) that reads x once and writes once, where ATen's
// composition launches six kernels and writes four intermediates; elsewhere,
// and as the reference the kernel is checked against, ATen's composition.
// Either way the results are the composition's bit for bit.

#include <ATen/core/Tensor.h>

namespace anvil::kernels {

/// x * cos + rotate_half(x) * sin over the first R = cos.size(-1) features of
/// x (B, H, T, D), the other D - R passed through; cos and sin are
/// (B or 1, 1, T, R) in x's dtype. Differentiable in x: its backward keeps
/// only cos and sin. Other shapes, or tables that take a gradient, run the
/// reference under ATen's autograd.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// The forward and the backward (x's gradient given the output's) without
/// autograd: the kernel where it applies, else the reference.
at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_backward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin);

/// The same through ATen operations (what the CPU runs), for any shapes that
/// broadcast as HF's apply_rotary_pos_emb's do.
at::Tensor rope_forward_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_backward_reference(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace anvil::kernels
