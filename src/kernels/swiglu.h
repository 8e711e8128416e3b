#pragma once
// The gated activation of LLaMA-style MLPs, silu(gate) * up, as one op with
// its own backward. On CUDA (float, float16, bfloat16) each direction is one
// kernel (kernels/swiglu.cu), where ATen runs two forward and three backward,
// and backward keeps gate and up, not silu(gate): one (tokens x intermediate)
// tensor less per layer than ATen's composition holds until backward.
// Elsewhere, and as the reference the kernel is checked against, ATen's
// composition, keeping what its autograd keeps; the CPU's results are the
// composition's bit for bit.

#include <ATen/core/Tensor.h>

#include <utility>

namespace anvil::kernels {

/// silu(gate) * up for gate and up of one shape and dtype (views whose rows
/// are strided, like the halves of a fused gate_up projection, are read in
/// place); differentiable in both.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

/// The forward, and the backward (the gradients of gate and up given the
/// output's), without autograd: the kernel where it applies, else the reference.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);

/// The same through ATen operations (what the CPU runs).
at::Tensor swiglu_forward_reference(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward_reference(const at::Tensor& grad, const at::Tensor& gate,
                                                            const at::Tensor& up);

}  // namespace anvil::kernels
