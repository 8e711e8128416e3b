#pragma once
// Samples -> batch tensors, unpacked (one sample per right-padded row) or
// packed (several samples per fixed-length row, documents kept apart).

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "data/datasets.h"

namespace anvil::data {

struct LmBatch {
  at::Tensor input_ids;       // (B, T) int64, padded with pad_id
  at::Tensor labels;          // (B, T) int64, kIgnoreIndex on untrained tokens and padding
  at::Tensor position_ids;    // (B, T) int64, restarting at every document; packed only
  at::Tensor doc_ids;         // (B, T) int64, document number within the row (-1 = padding); packed only
  at::Tensor attention_mask;  // (B, T) bool, true = a real token, false = padding; unpacked only
  int64_t num_targets = 0;    // labels[:, 1:] != kIgnoreIndex: the tokens the loss counts
  int64_t num_tokens = 0;     // non-padding input tokens
};

/// One sample per row, right-padded to the longest, rounded up to a multiple
/// of `multiple` (when > 0) but not past `cap` (when > 0). Right padding
/// never changes what a causal model computes at real positions, so no mask
/// is needed.
LmBatch collate_unpacked(const std::vector<const LmSample*>& samples, int64_t pad_id, int64_t multiple = 0,
                         int64_t cap = 0);

/// Each row holds the samples of rows[b] end to end, padded to `row_len`.
/// Every document (a sample, or a document inside a sample) gets positions
/// from 0 and a doc id; its first token is not a target, so the loss equals
/// running each document on its own.
LmBatch collate_packed(const std::vector<std::vector<const LmSample*>>& rows, int64_t row_len, int64_t pad_id);

/// Packed rows' documents as one variable-length batch of the B * T
/// flattened tokens (flash attention's cumulative lengths): document i covers
/// tokens [cu_seqlens[i], cu_seqlens[i + 1]); the padding after a row's last
/// document counts as one more. cu_seqlens is (N + 1) int32 on the host.
struct DocumentOffsets {
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
};
/// doc_ids (B, T) int64 on the host (collate_packed's) -> their offsets;
/// nullopt when an id does not cover one run of its row's tokens, which the
/// block-diagonal mask allows and the offsets cannot express.
std::optional<DocumentOffsets> document_offsets(const at::Tensor& doc_ids);

}  // namespace anvil::data
