#pragma once
// ILQL's micro-batches (internal; ilql.cpp and the tests).

#include <vector>

#include "data/datasets.h"
#include "anvil/train/objective.h"

namespace anvil::train {

/// Response-aligned tensors of offline_rl samples, in ilql_loss_sums' layout:
/// input_ids (B, T) right-padded with `pad_id`; states (B, A + 1) token
/// positions (state j before action j, state n_i at the last token); actions
/// (B, A) the labelled tokens; rewards (B, A); dones (B, A + 1). A scalar
/// reward r becomes (r - mean) · scale on the last action; per-token rewards
/// are multiplied by `scale`, with mean · scale taken off the last one.
/// num_targets counts the actions.
Batch collate_offline(const std::vector<const data::OfflineRlSample*>& samples, int64_t pad_id, double mean,
                      double scale);

}  // namespace anvil::train
