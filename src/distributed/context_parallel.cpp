#include "distributed/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "anvil/core/error.h"
#include "distributed/comm.h"
#include "models/context_parallel.h"

namespace anvil::distributed {

at::Tensor context_parallel_positions(int64_t length, int64_t rank, int64_t cp, const std::string& key) {
  TORCH_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context_parallel_positions: rank ", rank, " of ", cp);
  if (length % (2 * cp) != 0)
    throw ConfigError(concat(key, ": rows of ", length, " positions do not split into 2 x ", cp,
                             " chunks (context parallelism gives each rank a head and a tail chunk); expected a "
                             "multiple of ",
                             2 * cp));
  const int64_t chunk = length / (2 * cp);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, at::kLong),
                  at::arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, at::kLong)});
}

at::Tensor context_parallel_share(const at::Tensor& x, int64_t rank, int64_t cp, int64_t dim) {
  const auto positions = context_parallel_positions(x.size(dim), rank, cp).to(x.device());
  return x.index_select(dim, positions);
}

at::Tensor context_parallel_whole(const std::vector<at::Tensor>& shares, int64_t dim) {
  TORCH_CHECK(!shares.empty(), "context_parallel_whole: no shares");
  const auto cp = static_cast<int64_t>(shares.size());
  const int64_t chunk = shares[0].size(dim) / 2;
  std::vector<at::Tensor> chunks(2 * cp);
  for (int64_t r = 0; r < cp; ++r) {
    chunks[r] = shares[r].narrow(dim, 0, chunk);
    chunks[2 * cp - 1 - r] = shares[r].narrow(dim, chunk, chunk);
  }
  return at::cat(chunks, dim);
}

std::pair<at::Tensor, at::Tensor> attention_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& mask, double scale) {
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * s;
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  const auto lse = at::logsumexp(scores, -1);  // -inf where no key may be seen
  const auto seen = at::isfinite(lse);
  // exp(scores - lse) with the unseen rows' lse taken as 0: their scores are all -inf, so their weights are 0.
  const auto weights = (scores - at::where(seen, lse, at::zeros_like(lse)).unsqueeze(-1)).exp();
  return {at::matmul(weights, v.to(at::kFloat)).to(q.scalar_type()), lse};
}

std::pair<at::Tensor, at::Tensor> merge_attention(const at::Tensor& out_a, const at::Tensor& lse_a,
                                                  const at::Tensor& out_b, const at::Tensor& lse_b) {
  const auto lse = at::logaddexp(lse_a, lse_b);
  const auto seen = at::isfinite(lse);
  const auto base = at::where(seen, lse, at::zeros_like(lse));  // unseen: both weights exp(-inf) = 0
  const auto wa = (lse_a - base).exp().unsqueeze(-1), wb = (lse_b - base).exp().unsqueeze(-1);
  return {(out_a.to(at::kFloat) * wa + out_b.to(at::kFloat) * wb).to(out_a.scalar_type()), lse};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The gather of GroupShare: all-gather of the shares, put in row order; backward, a reduce-scatter of the
/// gradient: each rank receives the sum over the group of its own slots' rows. Inputs: the share, the group (by
/// address: it lives as long as the run's mesh, past any graph), the inverse order of the gathered slots and the
/// gathered slots themselves (every rank's, in rank order).
struct GatherFunction : public torch::autograd::Function<GatherFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t handle, const at::Tensor& order,
                            const at::Tensor& gathered) {
    auto& comm = *reinterpret_cast<Communicator*>(handle);
    ctx->saved_data["comm"] = handle;
    ctx->saved_data["gathered"] = gathered;
    const auto in = x.contiguous();
    const int64_t cp = comm.world_size();
    auto out = at::empty({cp * in.numel()}, in.options());
    comm.all_gather(out, in, "context parallel: keys and values").wait();
    auto sizes = in.sizes().vec();
    sizes.insert(sizes.begin(), cp);                                      // (cp, B, H, T_share, D)
    return at::cat(out.view(sizes).unbind(0), 2).index_select(2, order);  // (B, H, T, D) in row order
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto& comm = *reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    const auto& g = grad[0];  // (B, H, T, D)
    const int64_t cp = comm.world_size(), B = g.size(0), H = g.size(1), T = g.size(2), D = g.size(3);
    // Rank r's slots' rows side by side, rank by rank: (cp, B, H, T_share, D), flat.
    const auto by_rank = g.index_select(2, ctx->saved_data["gathered"].toTensor())
                             .view({B, H, cp, T / cp, D})
                             .permute({2, 0, 1, 3, 4})
                             .contiguous();
    auto mine = at::empty({B, H, T / cp, D}, g.options());
    comm.reduce_scatter_sum(mine, by_rank.view({-1}), "context parallel: gradients of keys and values").wait();
    return {mine, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class GroupShare final : public models::ContextShare {
 public:
  GroupShare(std::shared_ptr<Communicator> comm, int64_t length, const at::Device& device) : comm_(std::move(comm)) {
    const int64_t cp = comm_->world_size();
    slots_ = context_parallel_positions(length, comm_->rank(), cp, "dist.context_parallel").to(device);
    // The gathered shares, in rank order, hold these slots: their inverse puts the row in order.
    std::vector<at::Tensor> all;
    for (int64_t r = 0; r < cp; ++r) all.push_back(context_parallel_positions(length, r, cp));
    gathered_ = at::cat(all).to(device);
    order_ = at::argsort(gathered_, /*stable=*/true);
  }
  const at::Tensor& slots() const override { return slots_; }
  at::Tensor gather(const at::Tensor& x) const override {
    return GatherFunction::apply(x, reinterpret_cast<int64_t>(comm_.get()), order_, gathered_);
  }
  int64_t max_over_group(int64_t value) const override {
    const auto mine = at::full({1}, value, slots_.options());
    auto all = at::empty({comm_->world_size()}, mine.options());
    comm_->all_gather(all, mine, "context parallel: the row's furthest position").wait();
    return all.max().item<int64_t>();
  }

 private:
  std::shared_ptr<Communicator> comm_;
  at::Tensor slots_, gathered_, order_;
};

}  // namespace

std::shared_ptr<const models::ContextShare> context_share(std::shared_ptr<Communicator> cp, int64_t length,
                                                          const at::Device& device) {
  TORCH_CHECK(cp, "context_share: no group");
  return std::make_shared<GroupShare>(std::move(cp), length, device);
}

}  // namespace anvil::distributed
