#pragma once
// The language-model head and its cross-entropy computed together, chunk by
// chunk (Liger's fused linear cross-entropy, in ATen): the loss and the
// gradients of the hidden states, of the head's weight and of its bias are
// all computed in the forward pass, one chunk of rows at a time, so neither
// the (N, V) logits nor their float copy exist for the whole batch. Backward
// only scales the stored gradients by the incoming one.

#include <ATen/ATen.h>

#include <cstdint>

namespace anvil::train {

struct FusedLossOptions {
  /// Rows projected at a time; 0 = as few chunks of equal size as keep each
  /// chunk's float32 logits within `auto_chunk_bytes`.
  int64_t chunk = 0;
  int64_t auto_chunk_bytes = int64_t{1} << 30;
  /// Pad the vocabulary to a multiple of this for the GEMMs (zero rows,
  /// excluded from the softmax); 0 = 64 on CUDA, none elsewhere.
  int64_t pad_to = 0;
  int64_t ignore_index = -100;
};

/// Sum over rows with target != ignore_index of -log softmax(hidden W^T + b)[target],
/// in float32. hidden (N, C), weight (V, C), bias (V) or undefined, targets (N).
/// Differentiable in hidden, weight and bias (whichever require grad).
at::Tensor fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                      const at::Tensor& targets, const FusedLossOptions& o = {});

/// Per-row log-probabilities of `targets` under softmax((hidden W^T + b) / temperature),
/// in float32, computed a chunk of rows at a time; backward recomputes each
/// chunk's logits, so no (N, V) tensor outlives its chunk. Rows whose target
/// is ignore_index get 0. With `entropy`, also each row's entropy (no grad);
/// with `top1`, whether the row's most likely token is its target (bool,
/// false where the target is ignore_index).
/// hidden (N, C), weight (V, C), bias (V) or undefined, targets (N).
at::Tensor fused_linear_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                 const at::Tensor& targets, double temperature = 1.0, const FusedLossOptions& o = {},
                                 at::Tensor* entropy = nullptr, at::Tensor* top1 = nullptr);

/// The rows per chunk `o` gives for N rows of a vocabulary of V.
int64_t fused_loss_chunk_rows(int64_t rows, int64_t vocab, const FusedLossOptions& o);

/// The target of each position of (B, T) labels: position t predicts label
/// t + 1; the last position has none (`ignore_index`).
at::Tensor next_token_targets(const at::Tensor& labels, int64_t ignore_index);

}  // namespace anvil::train
