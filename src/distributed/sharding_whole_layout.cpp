// ShardedModel's view of a tensor-parallel model's units in the whole model's layout (sharding.h): what
// checkpoints hold, so that they do not depend on the mesh.
#include <ATen/ATen.h>

#include <algorithm>

#include "distributed/sharding.h"

namespace anvil::distributed {

std::vector<UnitLayout> whole_unit_layouts(const std::vector<UnitLayout>& local,
                                           const std::map<std::string, ParallelShard>& cuts, int64_t tp) {
  std::vector<UnitLayout> out;
  for (const auto& l : local) {
    UnitLayout w = l;
    w.numel = 0;
    for (auto& p : w.params) {
      if (const auto it = cuts.find(p.name); it != cuts.end()) {
        p.shape[static_cast<size_t>(it->second.dim)] *= tp;
        p.numel *= tp;
      }
      p.offset = w.numel;
      w.numel += p.numel;
    }
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> cut_ranges(const UnitLayout& layout,
                                                    const std::map<std::string, ParallelShard>& cuts, int64_t begin,
                                                    int64_t length) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : layout.params) {
    if (!cuts.count(p.name)) continue;
    const int64_t b = std::max(p.offset, begin), e = std::min(p.offset + p.numel, begin + length);
    if (e > b) out.emplace_back(b - begin, e - b);
  }
  return out;
}

at::Tensor ShardedModel::to_whole_layout(size_t u, const at::Tensor& flat) {
  if (!tensor_parallel_) return flat;
  const auto& local = layouts_.at(u);
  const auto& whole = whole_layouts_.at(u);
  TORCH_CHECK(flat.numel() == local.numel, "to_whole_layout: expected ", local.numel, " elements for ", local.name);
  auto out = at::empty({whole.numel}, flat.options());
  for (size_t k = 0; k < local.params.size(); ++k) {
    const auto& p = local.params[k];
    auto part = flat.narrow(0, p.offset, p.numel).view(p.shape);
    if (const auto it = options_.tensor_parallel_cuts.find(p.name); it != options_.tensor_parallel_cuts.end())
      part = gather_whole(part.contiguous(), it->second, *options_.tensor_parallel);
    out.narrow(0, whole.params[k].offset, whole.params[k].numel).copy_(part.reshape(-1));
  }
  return out;
}

at::Tensor ShardedModel::from_whole_layout(size_t u, const at::Tensor& flat) const {
  if (!tensor_parallel_) return flat;
  const auto& local = layouts_.at(u);
  const auto& whole = whole_layouts_.at(u);
  TORCH_CHECK(flat.numel() == whole.numel, "from_whole_layout: expected ", whole.numel, " elements for ", whole.name);
  auto out = at::empty({local.numel}, flat.options());
  for (size_t k = 0; k < local.params.size(); ++k) {
    const auto& p = whole.params[k];
    const auto part = share_of_whole(p.name, flat.narrow(0, p.offset, p.numel).view(p.shape));
    out.narrow(0, local.params[k].offset, local.params[k].numel).copy_(part.reshape(-1));
  }
  return out;
}

at::Tensor ShardedModel::share_of_whole(const std::string& name, const at::Tensor& whole) const {
  if (!tensor_parallel_) return whole;
  const auto it = options_.tensor_parallel_cuts.find(name);
  if (it == options_.tensor_parallel_cuts.end()) return whole;
  return share_of(whole, it->second, options_.tensor_parallel->rank(), options_.tensor_parallel->world_size());
}

}  // namespace anvil::distributed
