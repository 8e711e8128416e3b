#pragma once
// Forwards the ranks of a run split among themselves outside evaluation: the
// reference log-prob caches of dpo and kto (dpo.precompute_reference,
// kto.precompute_reference). Batch k is rank k mod W's; the uneven tail (the
// last batches % W) every rank runs and only its owner keeps, since under
// full_shard a frozen model's forwards are collectives (RankContext::runs
// does the same for evaluation). Each rank writes the rows of the batches it
// keeps into zeroed tensors and combine() sums them over ranks, so every rank
// ends with the same tensors, exactly (each entry is one rank's value plus
// zeros).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"

namespace anvil::train {

class ForwardSplit {
 public:
  /// `comm` null (one process) or one rank: nothing is split.
  ForwardSplit(std::shared_ptr<distributed::Communicator> comm, int64_t batches, at::Device device);
  /// Whether this rank runs batch `k`'s forward.
  bool runs(int64_t k) const { return !split_ || k % world_ == rank_ || k >= batches_ / world_ * world_; }
  /// Whether this rank keeps batch `k`'s rows.
  bool keeps(int64_t k) const { return !split_ || k % world_ == rank_; }
  bool split() const { return split_; }
  int64_t world() const { return world_; }
  /// Sums `tensors` (float32, on the host, zero where this rank kept nothing) over the ranks in place; every
  /// rank calls it with tensors of the same sizes. Nothing on one process.
  void combine(const std::vector<at::Tensor>& tensors, const std::string& what) const;

 private:
  std::shared_ptr<distributed::Communicator> comm_;
  int64_t batches_, rank_ = 0, world_ = 1;
  bool split_ = false;
  at::Device device_;
};

}  // namespace anvil::train
