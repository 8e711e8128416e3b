#pragma once
// The gated activation of LLaMA-style MLPs, act(gate) * up (SwiGLU with silu,
// GeGLU with GELU's tanh approximation), as one op with its own backward. On
// CUDA (float, float16, bfloat16) each direction is one kernel
// (kernels/glu.cu), where ATen runs two forward and three backward, and
// backward keeps gate and up, not act(gate): one (tokens x intermediate)
// tensor less per layer than ATen's composition holds until backward.
// Elsewhere, and as the reference the kernel is checked against, ATen's
// composition, keeping what its autograd keeps; the CPU's results are the
// composition's bit for bit.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#include "kernels/glu_launch.h"

namespace anvil::kernels {

using cuda::GluActivation;

/// The activation an HF config names, when the op has it: silu and swish
/// (kSilu), gelu_pytorch_tanh and gelu_new (kGeluTanh).
std::optional<GluActivation> glu_activation(const std::string& hf_name);

/// act(gate) * up for gate and up of one shape and dtype (views whose rows
/// are strided, like the halves of a fused gate_up projection, are read in
/// place); differentiable in both.
at::Tensor glu(const at::Tensor& gate, const at::Tensor& up, GluActivation act);

/// The forward, and the backward (the gradients of gate and up given the
/// output's), without autograd: the kernel where it applies, else the reference.
at::Tensor glu_forward(const at::Tensor& gate, const at::Tensor& up, GluActivation act);
std::pair<at::Tensor, at::Tensor> glu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                               GluActivation act);

/// The same through ATen operations (what the CPU runs).
at::Tensor glu_forward_reference(const at::Tensor& gate, const at::Tensor& up, GluActivation act);
std::pair<at::Tensor, at::Tensor> glu_backward_reference(const at::Tensor& grad, const at::Tensor& gate,
                                                         const at::Tensor& up, GluActivation act);

}  // namespace anvil::kernels
