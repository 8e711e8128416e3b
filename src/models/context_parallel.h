#pragma once
// Context parallelism as attention sees it (ForwardArgs::context): each rank
// of a context-parallel group holds a share of every row's positions (two
// chunks of 2 x cp, head and tail: distributed/context_parallel.h) and runs
// the whole model on them. Everything but attention is position-wise; the
// attention of a rank's queries needs every position's keys and values, which
// the share gathers from the group (all-gather first, as torchtitan's
// allgather mode: keys and values gathered after the rotary embedding, and
// the masks built from global positions), or, in ring mode
// (dist.context_parallel_mode: ring), attention passes the shares of keys and
// values around the group and merges each share's partial attention.

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
  /// Ring mode: attention calls ring_attention instead of gathering.
  virtual bool ring() const = 0;
  /// Ring attention of this rank's queries q (B, Hq, T_share, D) over the
  /// whole row, its keys and values k, v (B, Hkv, T_share, D) passed around
  /// the group a share at a time: (B, Hq, T_share, D). Query slot i sees key
  /// slot j when j <= i and, with `sliding_window` W > 0 shorter than the
  /// row, j > i - W; and, where `given_mask` (broadcastable to (B, 1, T_share,
  /// T), over the whole row's keys, true = may attend) is defined, only where
  /// it allows (it is then the whole rule when no window binds). `scale` 0:
  /// 1 / sqrt(D); `softcap` > 0: Gemma 2's cap * tanh(score / cap).
  virtual at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& given_mask, int64_t sliding_window, double scale,
                                    double softcap) const = 0;
};

}  // namespace anvil::models
