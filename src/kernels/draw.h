#pragma once
// Inverse-CDF sampling of one token per row (generation's draw): on CUDA one
// kernel per step (kernels/draw.cu); elsewhere, and as its reference, ATen's
// softmax, cumulative sum in float64 and searchsorted.

#include <ATen/core/Tensor.h>

namespace anvil::kernels {

/// (B, V) scores, (B) float64 uniforms in (0, 1) -> (B) int64: for each row
/// the first token whose cumulative probability (softmax in float, summed in
/// float64) exceeds the row's uniform times the total. Tokens at -inf have
/// empty bins and are never drawn.
at::Tensor inverse_cdf_draw(const at::Tensor& scores, const at::Tensor& uniforms);

/// The same through ATen operations (what the CPU runs).
at::Tensor inverse_cdf_draw_reference(const at::Tensor& scores, const at::Tensor& uniforms);

}  // namespace anvil::kernels
