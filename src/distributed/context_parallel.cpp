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

/// Which keys of a share (slots `keys`, T_k) the queries at slots `queries` (T_q) see, as ContextShare::ring_attention
/// says: (B | 1, 1, T_q, T_k).
at::Tensor ring_mask(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& given, int64_t window,
                     int64_t length) {
  const auto qi = queries.unsqueeze(1), kj = keys.unsqueeze(0);
  at::Tensor band;
  if (window > 0 && length > window) band = (kj <= qi).logical_and(kj > qi - window);
  at::Tensor m;
  if (given.defined()) {
    m = given.index_select(-1, keys);
    if (band.defined()) m = m.logical_and(band);
  } else {
    m = band.defined() ? band : kj <= qi;
  }
  while (m.dim() < 4) m = m.unsqueeze(0);
  return m;
}

/// A share's keys or values (B, H_kv, T_k, D) repeated for the query heads each serves: (B, H_q, T_k, D).
at::Tensor for_queries(const at::Tensor& x, int64_t rep) { return rep > 1 ? x.repeat_interleave(rep, 1) : x; }
/// The gradient of for_queries' result folded back onto the key/value heads.
at::Tensor to_kv_heads(const at::Tensor& g, int64_t rep) {
  return rep > 1 ? g.view({g.size(0), g.size(1) / rep, rep, g.size(2), g.size(3)}).sum(2) : g;
}

/// ATen's fused CPU flash attention takes a share when no soft cap is asked: it never holds a (T_q, T_k) score
/// matrix per head, and returns the log-sum-exp the merge needs (its backward takes the merged output and
/// log-sum-exp: flash attention's backward, a share at a time). Elsewhere (a soft cap; CUDA, where the
/// fused kernels that take a mask and return the log-sum-exp have not been run yet) scores by matmul in float32.
bool fused_share(const at::Tensor& q, double softcap) {
  const auto t = q.scalar_type();
  return q.device().is_cpu() && softcap == 0 && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

/// The additive form of a boolean mask, in q's dtype (what the fused kernel takes).
at::Tensor additive_mask(const at::Tensor& mask, const at::Tensor& q) {
  return at::zeros(mask.sizes(), q.options()).masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
}

/// One share's scores in float32: q (B, H, T_q, D) against k (B, H, T_k, D) -> (B, H, T_q, T_k), soft-capped when
/// `softcap` > 0 (`capped`: tanh(raw / cap), for the backward), masked to -inf where `mask` is false. Soft-capped
/// scores lie in [-cap, cap], and are masked to -(cap + 1e4) instead: a weight of exactly 0 beside any seen key,
/// while a query that sees none attends to every key evenly, as transformers' eager attention (masked with the
/// dtype's lowest value) does.
at::Tensor share_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale, double softcap,
                        at::Tensor* capped = nullptr) {
  auto s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * scale;
  if (softcap > 0) {
    auto t = at::tanh(s / softcap);
    s = t * softcap;
    if (capped) *capped = std::move(t);
  }
  return s.masked_fill(mask.logical_not(), softcap > 0 ? -(softcap + 1e4) : -std::numeric_limits<double>::infinity());
}

/// One share's attention: (output (B, H, T_q, D) float32, log-sum-exp (B, H, T_q) float32, -inf for a query
/// that sees none of the share's keys).
std::pair<at::Tensor, at::Tensor> share_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& mask, double scale, double softcap) {
  if (fused_share(q, softcap)) {
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(q, k.to(q.scalar_type()), v.to(q.scalar_type()), 0.0,
                                                                  false, additive_mask(mask, q), scale);
    // A query that sees no key gets output 0 and log-sum-exp 0 from the kernel: -inf, for the merge.
    l = at::where(mask.any(-1), l, -std::numeric_limits<double>::infinity());
    return {o.to(at::kFloat), l.to(at::kFloat)};
  }
  const auto s = share_scores(q, k, mask, scale, softcap);
  const auto l = at::logsumexp(s, -1);
  const auto p = (s - at::where(at::isfinite(l), l, at::zeros_like(l)).unsqueeze(-1)).exp();
  return {at::matmul(p, v.to(at::kFloat)), l};
}

/// Passes `x` one step around the ring (to rank r + 1, from rank r - 1): what this rank receives.
at::Tensor pass_on(Communicator& comm, const at::Tensor& x, const char* what) {
  const int n = comm.world_size(), r = comm.rank();
  auto received = at::empty_like(x);
  comm.send_recv(x.contiguous(), (r + 1) % n, received, (r + n - 1) % n, what);
  return received;
}

/// Ring attention (ContextShare::ring_attention). Inputs beside q, k, v: the group (by address, as GatherFunction),
/// the query slots, the given mask (an empty tensor when none: a custom function's inputs are defined tensors),
/// the window, the row length, the scale and the cap. Saves q, k, v, the float32 output and its log-sum-exp;
/// the backward is flash attention's (dS = P (dP - rowsum(dO O)), P from the saved log-sum-exp), a share at a time.
struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t handle, const at::Tensor& slots, const at::Tensor& given, int64_t window,
                            int64_t length, double scale, double softcap) {
    auto& comm = *reinterpret_cast<Communicator*>(handle);
    TORCH_CHECK(k.sizes() == v.sizes(), "ring attention: keys and values of different shapes");
    TORCH_CHECK(q.size(1) % k.size(1) == 0, "ring attention: key/value heads must divide query heads");
    const int64_t n = comm.world_size(), r = comm.rank(), rep = q.size(1) / k.size(1);
    const auto mask_given = given.numel() > 0 ? given : at::Tensor();
    auto out = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    auto lse = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), out.options());
    auto kv = at::stack({k, v}).contiguous();
    for (int64_t step = 0; step < n; ++step) {
      const int64_t src = (r - step + n) % n;  // whose share the ring has brought
      const auto keys = context_parallel_positions(length, src, n).to(q.device());
      const auto [o, l] = share_attention(q, for_queries(kv[0], rep), for_queries(kv[1], rep),
                                          ring_mask(slots, keys, mask_given, window, length), scale, softcap);
      std::tie(out, lse) = merge_attention(out, lse, o, l);
      if (step + 1 < n) kv = pass_on(comm, kv, "ring attention: keys and values");
    }
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["comm"] = handle;
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["given"] = given;
    ctx->saved_data["window"] = window;
    ctx->saved_data["length"] = length;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["out"] = out;
    ctx->saved_data["lse"] = lse;
    return out.to(q.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto& comm = *reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const auto slots = ctx->saved_data["slots"].toTensor(), given = ctx->saved_data["given"].toTensor();
    const auto out = ctx->saved_data["out"].toTensor(), lse = ctx->saved_data["lse"].toTensor();
    const int64_t window = ctx->saved_data["window"].toInt(), length = ctx->saved_data["length"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble(), softcap = ctx->saved_data["softcap"].toDouble();
    const int64_t n = comm.world_size(), r = comm.rank(), rep = q.size(1) / k.size(1);
    const bool fused = fused_share(q, softcap);
    // A query that saw no key at all: output 0, its scores all -inf; a log-sum-exp of 0 keeps its weights 0.
    const auto base = at::where(at::isfinite(lse), lse, at::zeros_like(lse));
    const auto dout = fused ? grad[0].to(q.scalar_type()).contiguous() : grad[0].to(at::kFloat);
    const auto out_q = fused ? out.to(q.scalar_type()) : out;
    const auto delta = fused ? at::Tensor() : (dout * out).sum(-1, /*keepdim=*/true);  // rowsum(dO O)
    const auto mask_given = given.numel() > 0 ? given : at::Tensor();
    auto dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    auto kv = at::stack({k, v}).contiguous();
    auto dkv = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));  // travels with its share
    for (int64_t step = 0; step < n; ++step) {
      const int64_t src = (r - step + n) % n;
      const auto keys = context_parallel_positions(length, src, n).to(q.device());
      const auto mask = ring_mask(slots, keys, mask_given, window, length);
      const auto kb = for_queries(kv[0], rep), vb = for_queries(kv[1], rep);
      at::Tensor dq_b, dk_b, dv_b;
      if (fused) {
        std::tie(dq_b, dk_b, dv_b) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, kb.to(q.scalar_type()), vb.to(q.scalar_type()), out_q, base, 0.0, false, additive_mask(mask, q),
            scale);
      } else {
        at::Tensor capped;
        const auto s = share_scores(q, kb, mask, scale, softcap, &capped);
        const auto p = (s - base.unsqueeze(-1)).exp();  // 0 where masked but in a query that sees nothing
        // A masked score is a constant: no gradient reaches q or k through it.
        auto ds =
            (p * (at::matmul(dout, vb.to(at::kFloat).transpose(-2, -1)) - delta)).masked_fill(mask.logical_not(), 0);
        if (softcap > 0) ds = ds * (1 - capped * capped);
        dq_b = at::matmul(ds, kb.to(at::kFloat)) * scale;
        dk_b = at::matmul(ds.transpose(-2, -1), q.to(at::kFloat)) * scale;
        dv_b = at::matmul(p.transpose(-2, -1), dout);
      }
      dq.add_(dq_b.to(at::kFloat));
      dkv[0].add_(to_kv_heads(dk_b.to(at::kFloat), rep));
      dkv[1].add_(to_kv_heads(dv_b.to(at::kFloat), rep));
      if (step + 1 < n) kv = pass_on(comm, kv, "ring attention: keys and values (backward)");
      // The share's gradient moves with it; after the last step, on to its owner (rank r + 1's share is here).
      if (n > 1) dkv = pass_on(comm, dkv, "ring attention: gradients of keys and values");
    }
    return {dq.to(q.scalar_type()),
            dkv[0].to(k.scalar_type()),
            dkv[1].to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

class GroupShare final : public models::ContextShare {
 public:
  GroupShare(std::shared_ptr<Communicator> comm, int64_t length, const at::Device& device, bool ring)
      : comm_(std::move(comm)), length_(length), ring_(ring) {
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
  bool ring() const override { return ring_; }
  at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& given_mask,
                            int64_t sliding_window, double scale, double softcap) const override {
    const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const auto given =
        given_mask.defined() ? given_mask.to(at::kBool) : at::empty({0}, slots_.options().dtype(at::kBool));
    return RingAttentionFunction::apply(q, k, v, reinterpret_cast<int64_t>(comm_.get()), slots_, given, sliding_window,
                                        length_, s, softcap);
  }

 private:
  std::shared_ptr<Communicator> comm_;
  int64_t length_;
  bool ring_;
  at::Tensor slots_, gathered_, order_;
};

}  // namespace

std::shared_ptr<const models::ContextShare> context_share(std::shared_ptr<Communicator> cp, int64_t length,
                                                          const at::Device& device, bool ring) {
  TORCH_CHECK(cp, "context_share: no group");
  return std::make_shared<GroupShare>(std::move(cp), length, device, ring);
}

}  // namespace anvil::distributed
