#pragma once
// The pieces generate() chooses tokens with, usable alone: penalties and
// warpers in transformers' order, and a counter-based draw. Everything runs on
// the device the scores are on (no host copies, no syncs), so a decode step can
// be captured in a CUDA graph.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "anvil/generation/generate.h"  // SamplingOptions

namespace anvil::generation {

/// Penalties on (B, V) float scores: `seen` (B, V) bool marks the tokens of
/// each row's prompt and output (repetition: a positive score is divided by the
/// penalty, a negative one multiplied); `counts` (B, V) float counts each
/// row's produced tokens (score -= presence * [count > 0] + frequency * count).
/// Either may be undefined when its penalties are off.
at::Tensor apply_penalties(const at::Tensor& scores, const at::Tensor& seen, const at::Tensor& counts,
                           const WarpOptions& o);

/// transformers' sampling warpers in its order: temperature, top-k, top-p,
/// min-p. (B, V) float -> (B, V) float, removed tokens at -inf; the likeliest
/// token always stays.
at::Tensor warp(const at::Tensor& scores, const WarpOptions& o);

/// A 64-bit key for a row from a seed (splitmix64's finaliser): rows drawn with
/// different keys are independent streams.
uint64_t row_key(uint64_t seed);

/// (B, V) uniforms in (0, 1), float64, a pure function of (row key, step,
/// vocabulary index): `keys` (B) int64 and `step` a 0-dim int64 tensor, both on
/// the scores' device. The same on every device and for any batch a row is in.
at::Tensor counter_uniform(const at::Tensor& keys, const at::Tensor& step, int64_t vocab);

/// Draws one token per row from softmax(scores) by inverting its cumulative
/// distribution at one counter_uniform value per row (the row's key, `step`):
/// a few passes over (B, V), not a noise value per token. (B) int64, on the
/// scores' device. Tokens at -inf are never drawn.
at::Tensor draw(const at::Tensor& scores, const at::Tensor& keys, const at::Tensor& step);

bool is_greedy(const SamplingOptions& opt);
bool wants_penalties(const SamplingOptions& opt);

/// The scores a token is chosen from: warped when sampling, as they are when greedy.
at::Tensor final_scores(const at::Tensor& scores, const SamplingOptions& opt);

/// Each row's token from its final scores: the argmax when greedy, else draw().
at::Tensor choose(const at::Tensor& final, const SamplingOptions& opt, const at::Tensor& keys, const at::Tensor& step);

}  // namespace anvil::generation
