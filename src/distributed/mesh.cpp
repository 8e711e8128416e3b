#include "distributed/mesh.h"

#include <c10/util/Exception.h>

#include "anvil/core/error.h"

namespace anvil::distributed {

MeshLayout::MeshLayout(int64_t world, MeshShape shape) : world_(world), shape_(std::move(shape)) {
  TORCH_CHECK(world >= 1, "MeshLayout: world size ", world);
  if (shape_.tp < 1) throw ConfigError(concat(shape_.tp_key, ": expected a positive integer, got ", shape_.tp));
  if (shape_.cp < 1) throw ConfigError(concat(shape_.cp_key, ": expected a positive integer, got ", shape_.cp));
  if (world % (shape_.tp * shape_.cp) != 0)
    throw ConfigError(concat(shape_.tp_key, " (", shape_.tp, ") x ", shape_.cp_key, " (", shape_.cp,
                             ") must divide the world size, ", world,
                             " ranks; FSDP takes the ranks left over (world / (tensor x context parallel))"));
}

MeshCoordinates MeshLayout::coordinates(int64_t rank) const {
  TORCH_CHECK(rank >= 0 && rank < world_, "MeshLayout: rank ", rank, " of ", world_);
  return {rank % shape_.tp, (rank / shape_.tp) % shape_.cp, rank / (shape_.tp * shape_.cp)};
}

int64_t MeshLayout::rank_of(const MeshCoordinates& c) const {
  TORCH_CHECK(c.tp >= 0 && c.tp < shape_.tp && c.cp >= 0 && c.cp < shape_.cp && c.dp >= 0 && c.dp < dp(),
              "MeshLayout: coordinates (tp ", c.tp, ", cp ", c.cp, ", dp ", c.dp, ") outside the mesh");
  return (c.dp * shape_.cp + c.cp) * shape_.tp + c.tp;
}

std::vector<int64_t> MeshLayout::group(int64_t rank, const std::string& dim) const {
  auto c = coordinates(rank);
  int64_t MeshCoordinates::*axis = dim == "tp"   ? &MeshCoordinates::tp
                                   : dim == "cp" ? &MeshCoordinates::cp
                                   : dim == "dp" ? &MeshCoordinates::dp
                                                 : nullptr;
  TORCH_CHECK(axis != nullptr, "MeshLayout::group: no dimension \"", dim, "\" (tp, cp or dp)");
  const int64_t n = dim == "tp" ? tp() : dim == "cp" ? cp() : dp();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    c.*axis = i;
    out.push_back(rank_of(c));
  }
  return out;
}

Mesh::Mesh(std::shared_ptr<Communicator> world_comm, const MeshShape& shape)
    : layout(world_comm->world_size(), shape), at(layout.coordinates(world_comm->rank())), world(world_comm) {
  // A group's color is the rank of its first member: unique per group, equal within it.
  const auto r = world->rank();
  tp = world->split(static_cast<int>(layout.group(r, "tp").front()), static_cast<int>(at.tp), "tensor parallel");
  cp = world->split(static_cast<int>(layout.group(r, "cp").front()), static_cast<int>(at.cp), "context parallel");
  dp = world->split(static_cast<int>(layout.group(r, "dp").front()), static_cast<int>(at.dp), "data parallel");
  // The ranks holding the same tensor-parallel share: every rank of the same tp coordinate, ordered as the world.
  shard = layout.cp() == 1 ? dp : world->split(static_cast<int>(at.tp), static_cast<int>(r), "fsdp (data x context)");
}

}  // namespace anvil::distributed
