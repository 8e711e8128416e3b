#pragma once
// The device mesh of a run: its ranks laid out as FSDP x context parallel x
// tensor parallel, tensor parallelism innermost (consecutive ranks: one
// node's GPUs under torchrun, where the per-layer all-reduces stay on
// NVLink), then context parallelism, then FSDP (and data parallelism) over
// the rest, as torchtitan's and Megatron's meshes order them. Rank r sits at
//
//   tp rank   r % tp
//   cp rank   (r / tp) % cp
//   dp rank   r / (tp * cp)
//
// and each rank belongs to one group per dimension: its tensor-parallel
// group (the tp ranks with its cp and dp ranks), its context-parallel group
// and its data-parallel group (the ranks holding the same tensor and context
// shares, over which FSDP shards and data is split). docs/distributed.md.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"

namespace anvil::distributed {

struct MeshShape {
  int64_t tp = 1;
  int64_t cp = 1;
  /// What each dimension is set by in messages ("dist.tensor_parallel").
  std::string tp_key = "dist.tensor_parallel";
  std::string cp_key = "dist.context_parallel";
};

/// Where one rank sits.
struct MeshCoordinates {
  int64_t tp = 0, cp = 0, dp = 0;
};

class MeshLayout {
 public:
  /// Throws ConfigError naming the keys when tp * cp does not divide
  /// `world` or a size is below 1.
  MeshLayout(int64_t world, MeshShape shape);
  int64_t world() const { return world_; }
  int64_t tp() const { return shape_.tp; }
  int64_t cp() const { return shape_.cp; }
  /// The data-parallel (FSDP) size: world / (tp * cp).
  int64_t dp() const { return world_ / (shape_.tp * shape_.cp); }
  MeshCoordinates coordinates(int64_t rank) const;
  int64_t rank_of(const MeshCoordinates& c) const;
  /// The ranks of `rank`'s group along one dimension ("tp", "cp" or "dp"),
  /// in the order of their coordinate along it.
  std::vector<int64_t> group(int64_t rank, const std::string& dim) const;

 private:
  int64_t world_;
  MeshShape shape_;
};

/// The mesh with its communicators, each a split of the run's (every rank
/// creates every group, in the same order: tp, cp, dp, then shard when cp >
/// 1). `shard` is what FSDP shards the tensor-parallel share over and sums
/// gradients over: the dp x cp ranks of the same tp coordinate (torchtitan's
/// dp_shard_cp), since the ranks of a context-parallel group hold the same
/// parameters and each the gradient of its share of the rows; `dp` when cp
/// is 1.
struct Mesh {
  Mesh(std::shared_ptr<Communicator> world, const MeshShape& shape);
  MeshLayout layout;
  MeshCoordinates at;
  std::shared_ptr<Communicator> world, tp, cp, dp, shard;
};

}  // namespace anvil::distributed
