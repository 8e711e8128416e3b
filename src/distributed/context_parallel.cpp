#include "distributed/context_parallel.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "anvil/core/error.h"

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

}  // namespace anvil::distributed
