#pragma once
// Padding a list of samples into batch tensors.

#include <ATen/core/Tensor.h>

#include <vector>

#include "anvil/data/sft_dataset.h"

namespace anvil::data {

struct SftBatch {
  at::Tensor input_ids;  // (B, T) int64, right-padded with pad_id
  at::Tensor labels;     // (B, T) int64, kIgnoreIndex on prompt and padding
  int64_t num_targets = 0;  // labels[:, 1:] != kIgnoreIndex: the tokens the loss counts
  int64_t num_tokens = 0;   // non-padding input tokens
};

/// Right-pads to the longest sample. Right padding never changes what a
/// causal model computes at real positions, so no attention mask is needed.
SftBatch collate_sft(const std::vector<const SftSample*>& samples, int64_t pad_id);

}  // namespace anvil::data
