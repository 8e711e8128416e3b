#pragma once
// Internal (not installed): a PPO rollout's rows and their collation into
// training micro-batches (src/train/objectives/ppo/ppo_rollout.cpp).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/train/objective.h"
#include "anvil/train/ppo.h"

namespace anvil::train {

/// One sequence of a rollout, as every rank holds it after the exchange.
struct RolloutRow {
  std::vector<int64_t> prompt, response;
  bool ended = false;
  std::vector<float> old_logp, ref_logp, values;  // per response token
  double score = 0;
  /// Multi-turn rollouts (ppo.environment): 1 where a response token belongs
  /// to a message the environment appended (no part in the loss or the KL);
  /// empty when every token was generated.
  std::vector<uint8_t> appended;
  /// ppo.async (one-step-off): each response token's truncated importance
  /// weight, min(pi_prox / pi_behaviour, is_cap); empty = 1.
  std::vector<float> is_weight;
  // Multi-turn rollouts, for scoring (on the ranks that score the row):
  std::vector<int64_t> answer;  // the last assistant turn, without its end of turn
  double env_reward = 0;        // the environment's reward at done
  int64_t turns = 1;            // assistant turns taken
  bool is_appended(size_t j) const { return !appended.empty() && appended[j] != 0; }
};

/// Packs rows into doubles for the exchanges between ranks (fixed-width
/// slots): lengths, ended, score, tokens, log-probs, values, the appended
/// marks and an episode's answer, reward and turns.
struct RowCodec {
  int64_t max_prompt, max_response;
  int64_t width() const { return 7 + max_prompt + max_response * 6; }
  void put(const RolloutRow& r, double* out) const;
  RolloutRow get(const double* in) const;
};

/// A rollout's per-token tensors over each row's generated tokens side by
/// side (N x A, A the most generated tokens of a row; tokens an environment
/// appended are no actions, so the formulas skip them): mask, old and
/// reference log-probs and values, float64; `places`, each generated token's
/// index in its response.
struct GeneratedTokens {
  at::Tensor mask, logp, ref, values;
  std::vector<std::vector<int64_t>> places;
  int64_t response_width = 1;  // the longest response, appended tokens included
};
GeneratedTokens generated_tokens(const std::vector<RolloutRow>& rows);
/// (N x A) per-generated-token values back in their places of the
/// (N x response_width) responses: 0 at appended tokens and past the end.
at::Tensor at_response_places(const at::Tensor& x, const GeneratedTokens& g);

/// Right-padded rows of prompt + response (`input_ids`, B x T) and, per
/// response token (B x R, response-aligned): `tokens`, `positions` (the
/// position whose logits predict the token: prompt length - 1 + j), `mask`
/// (1 on generated tokens, 0 on padding and appended tokens; a response ends at its EOS),
/// `old_logp`, `ref_logp`, `old_values`, `is_weight` when a row has one (1 elsewhere), and `advantages` / `returns`
/// taken from rows `index` of the rollout-wide (N x R') tensors when given. How the per-token losses of a step are
/// weighed (ppo.loss_aggregation, ppo.mask_truncated_completions).
struct LossWeighting {
  LossAggregation aggregation = LossAggregation::kTokenMean;
  double constant = 1;          // constant: the divisor per response
  bool mask_truncated = false;  // responses without an end of turn leave the mask
};

/// ... and `weights` (B x R), each token's weight in the loss sum, with
/// num_targets the step's divisor: token_mean: weight 1, num_targets = the
/// masked tokens; sequence_mean: 1 / the response's generated tokens, num_targets =
/// rows; constant: 1 / constant, num_targets = rows. With mask_truncated, a
/// response that did not end has mask and weights 0 (it still counts as a
/// row).
Batch collate_rollout(const std::vector<const RolloutRow*>& rows, int64_t pad_id, const at::Tensor& adv = {},
                      const at::Tensor& ret = {}, const std::vector<int64_t>& index = {},
                      const LossWeighting& weighting = {});

}  // namespace anvil::train
