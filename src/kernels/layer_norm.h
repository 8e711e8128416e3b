#pragma once
// LayerNorm over the last dimension, with a weight, as one op whose backward
// on CUDA is Anvil's kernel (kernels/layer_norm.cu: one pass over x and dy for
// dx and the weight's and bias's shares, then one sum of the blocks' shares),
// where the GPT-2 profile found ATen's weight/bias-gradient kernel alone at
// about 77 us a call, some 0.65 TB/s of an H200's 4.8. The forward is ATen's. Elsewhere, and as the
// reference the kernel is checked against, ATen's backward, so the CPU's
// results are at::layer_norm's bit for bit.

#include <ATen/core/Tensor.h>

#include <tuple>

namespace anvil::kernels {

/// at::layer_norm(x, {C}, weight, bias, eps) for x (..., C), weight (C) and
/// an optional bias (C); differentiable in all three.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

/// The gradients of x, weight and bias (undefined without a bias) given the
/// output's, from the forward's float mean and rstd (at::native_layer_norm's):
/// the kernel where it applies, else the reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                   const at::Tensor& mean, const at::Tensor& rstd,
                                                                   const at::Tensor& weight, bool bias);

/// The same through at::native_layer_norm_backward (what the CPU runs).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_reference(const at::Tensor& grad,
                                                                             const at::Tensor& x,
                                                                             const at::Tensor& mean,
                                                                             const at::Tensor& rstd,
                                                                             const at::Tensor& weight, bool bias);

}  // namespace anvil::kernels
