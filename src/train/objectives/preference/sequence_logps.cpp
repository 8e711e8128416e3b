// Log-probabilities of labelled tokens under a model, per row or per token,
// through the fused head or the whole logits, with the token statistics TRL's
// trainers log beside them (preference_data.h: TokenStats). Read by dpo, kto
// and the reference caches.
#include <ATen/ATen.h>

#include "anvil/chat/chat.h"
#include "anvil/train/preference.h"
#include "train/objectives/lm_loss.h"
#include "train/objectives/preference/preference_data.h"

namespace anvil::train {

std::pair<at::Tensor, at::Tensor> sequence_logps(const at::Tensor& logits, const at::Tensor& labels) {
  const auto T = logits.size(1);
  auto shift_logits = logits.narrow(1, 0, T - 1).to(at::kFloat);  // (B, T-1, V)
  auto shift_labels = labels.narrow(1, 1, T - 1);                 // (B, T-1)
  auto mask = shift_labels.ne(chat::kIgnoreIndex);
  auto safe = at::where(mask, shift_labels, at::zeros_like(shift_labels));
  auto logp = shift_logits.log_softmax(-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1);
  return {(logp * mask).sum(-1), mask.sum(-1)};
}

namespace {

/// Per-position values (B, T) summed per row over the positions that predict a labelled token: (B) float32.
at::Tensor sum_at_targets(const at::Tensor& per_position, const at::Tensor& labels) {
  const auto predicts = next_token_targets(labels, chat::kIgnoreIndex).ne(chat::kIgnoreIndex);  // (B, T)
  return (per_position.to(at::kFloat) * predicts).sum(-1);
}

/// sequence_logps from the final hidden states (B, T, C) through the fused
/// head (train.fused_loss): no (B, T, V) logits; `stats`' entropy and top-1
/// counts from the same chunks.
std::pair<at::Tensor, at::Tensor> fused_sequence_logps(models::CausalLM& model, const at::Tensor& hidden,
                                                       const at::Tensor& labels, TokenStats* stats) {
  const auto B = labels.size(0), T = labels.size(1);
  const auto shifted = next_token_targets(labels, chat::kIgnoreIndex);
  const auto head = model.output_head();
  FusedLossOptions o;
  o.ignore_index = chat::kIgnoreIndex;
  at::Tensor entropy, top1;
  const bool want_entropy = stats && stats->want_entropy, want_top1 = stats && stats->want_top1;
  const auto logp =
      fused_linear_logprobs(hidden.reshape({-1, hidden.size(-1)}), head.weight, head.bias, shifted.reshape({-1}), 1.0,
                            o, want_entropy ? &entropy : nullptr, want_top1 ? &top1 : nullptr)
          .view({B, T});
  if (want_entropy) stats->entropy_sums = sum_at_targets(entropy.view({B, T}), labels);
  if (want_top1) stats->top1_counts = sum_at_targets(top1.view({B, T}), labels);
  return {logp.sum(-1), shifted.ne(chat::kIgnoreIndex).sum(-1)};
}

/// The mean over the vocabulary of each position's logits, (B, T) float32, from the hidden states (B, T, C)
/// of a head without a soft cap: mean_v (h . W_v + b_v) = h . mean_v W_v + mean_v b_v. The float sums read
/// a low-precision weight in place on CUDA (no float copy of the (V, C) matrix).
at::Tensor vocab_mean_logits(const models::CausalLM::OutputHead& head, const at::Tensor& hidden) {
  const auto vocab = static_cast<double>(head.weight.size(0));
  const auto w = head.weight.detach().sum(0, false, at::kFloat) / vocab;  // (C)
  auto mean = at::matmul(hidden.detach().to(at::kFloat), w);              // (B, T)
  if (head.bias.defined()) mean = mean + head.bias.detach().sum(0, false, at::kFloat) / vocab;
  return mean;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> model_sequence_logps(models::CausalLM& model, const at::Tensor& ids,
                                                       const at::Tensor& labels, bool fused,
                                                       const at::Tensor& token_mask, TokenStats* stats) {
  models::ForwardArgs args;
  if (model.num_experts() > 0 && token_mask.defined()) args.token_mask = token_mask.to(ids.device());
  if (fused && model.final_logit_softcap() == 0) {  // soft-capped logits (Gemma) take the plain head
    const auto hidden = model.hidden_states(ids, args);
    if (stats && stats->want_mean_logits)
      stats->mean_logit_sums = sum_at_targets(vocab_mean_logits(model.output_head(), hidden), labels);
    return fused_sequence_logps(model, hidden, labels, stats);
  }
  const auto logits = model.forward(ids, args);  // (B, T, V)
  if (stats && stats->want_mean_logits)
    stats->mean_logit_sums =
        sum_at_targets(logits.detach().sum(-1, false, at::kFloat) / static_cast<double>(logits.size(-1)), labels);
  if (stats && stats->want_entropy) {
    const auto logp = logits.detach().to(at::kFloat).log_softmax(-1);
    stats->entropy_sums = sum_at_targets(-(logp.exp() * logp.masked_fill(logp.isneginf(), 0)).sum(-1), labels);
  }
  if (stats && stats->want_top1) {
    const auto shifted = next_token_targets(labels, chat::kIgnoreIndex);
    stats->top1_counts = sum_at_targets(logits.detach().argmax(-1).eq(shifted), labels);
  }
  return sequence_logps(logits, labels);
}

std::pair<at::Tensor, at::Tensor> model_token_logps(models::CausalLM& model, const at::Tensor& ids,
                                                    const at::Tensor& labels, bool fused,
                                                    const at::Tensor& token_mask) {
  models::ForwardArgs args;
  if (model.num_experts() > 0 && token_mask.defined()) args.token_mask = token_mask.to(ids.device());
  const auto shifted = next_token_targets(labels, chat::kIgnoreIndex);  // (B, T)
  const auto B = labels.size(0), T = labels.size(1);
  if (fused && model.final_logit_softcap() == 0) {
    const auto hidden = model.hidden_states(ids, args);
    const auto head = model.output_head();
    FusedLossOptions o;
    o.ignore_index = chat::kIgnoreIndex;
    return {fused_linear_logprobs(hidden.reshape({-1, hidden.size(-1)}), head.weight, head.bias, shifted.reshape({-1}),
                                  1.0, o)
                .view({B, T}),
            shifted};
  }
  const auto logits = model.forward(ids, args).to(at::kFloat);  // (B, T, V)
  const auto keep = shifted.ne(chat::kIgnoreIndex);
  const auto safe = at::where(keep, shifted, at::zeros_like(shifted));
  return {logits.log_softmax(-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1) * keep, shifted};
}

}  // namespace anvil::train
