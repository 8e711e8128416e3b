#pragma once
// Context parallelism as attention sees it (ForwardArgs::context): each rank
// of a context-parallel group holds a share of every row's positions (two
// chunks of 2 x cp, head and tail: distributed/context_parallel.h) and runs
// the whole model on them. Everything but attention is position-wise; the
// attention of a rank's queries needs every position's keys and values, which
// the share gathers from the group (all-gather first, as torchtitan's
// allgather mode: keys and values gathered after the rotary embedding, and
// the masks built from global positions).

#include <ATen/core/Tensor.h>

namespace anvil::models {

class ContextShare {
 public:
  virtual ~ContextShare() = default;
  /// The row slots (positions within the whole row, ascending) of this
  /// rank's share: (T_share) int64 on the model's device.
  virtual const at::Tensor& slots() const = 0;
  /// The whole row's keys or values from every rank's share: (B, H, T_share,
  /// D) -> (B, H, T, D) in row order. Backward: the gradient summed over the
  /// group, this rank's share of it.
  virtual at::Tensor gather(const at::Tensor& x) const = 0;
  /// The largest of every rank's `value` (a collective): what depends on the
  /// whole row, as Phi-3's longrope choice on its furthest position.
  virtual int64_t max_over_group(int64_t value) const = 0;
};

}  // namespace anvil::models
