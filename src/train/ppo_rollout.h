#pragma once
// Internal (not installed): a PPO rollout's rows and their collation into
// training micro-batches (src/train/ppo.cpp).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "anvil/train/objective.h"

namespace anvil::train {

/// One sequence of a rollout, as every rank holds it after the exchange.
struct RolloutRow {
  std::vector<int64_t> prompt, response;
  bool ended = false;
  std::vector<float> old_logp, ref_logp, values;  // per response token
  double score = 0;
};

/// Right-padded rows of prompt + response (`input_ids`, B x T) and, per
/// response token (B x R, response-aligned): `tokens`, `positions` (the
/// position whose logits predict the token: prompt length - 1 + j), `mask`
/// (1 on generated tokens, 0 on padding; a response ends at its EOS),
/// `old_logp`, `ref_logp`, `old_values`, and `advantages` / `returns` taken
/// from rows `index` of the rollout-wide (N x R') tensors when given.
/// num_targets = generated tokens.
Batch collate_rollout(const std::vector<const RolloutRow*>& rows, int64_t pad_id, const at::Tensor& adv = {},
                      const at::Tensor& ret = {}, const std::vector<int64_t>& index = {});

}  // namespace anvil::train
