#pragma once
// Context parallelism's pieces (Liu et al. 2023, ring attention; torchtitan's
// load-balanced split): each of a context-parallel group's cp ranks holds a
// share of every row's positions, cut into 2 * cp equal chunks, rank i
// holding chunks i and 2 * cp - 1 - i. Under causal attention a chunk's work
// grows with its position, so head and tail together give every rank the
// same work. Attention over keys split in blocks merges the blocks' partial
// outputs by their log-sum-exp, which a ring of ranks passing key/value
// blocks (Communicator::send_recv) computes block by block.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace anvil::models {
class ContextShare;
}

namespace anvil::distributed {

class Communicator;

/// The positions (int64, ascending) of a row of `length` that rank `rank` of
/// `cp` holds. Throws ConfigError naming `key` when 2 * cp does not divide
/// `length`.
at::Tensor context_parallel_positions(int64_t length, int64_t rank, int64_t cp,
                                      const std::string& key = "data.max_length");
/// Rank `rank`'s share of `x` along `dim` (its positions, in order).
at::Tensor context_parallel_share(const at::Tensor& x, int64_t rank, int64_t cp, int64_t dim = 1);
/// The whole tensor from every rank's share, in rank order (the inverse).
at::Tensor context_parallel_whole(const std::vector<at::Tensor>& shares, int64_t dim = 1);

/// Attention of queries q (B, H, Tq, D) over one block of keys and values
/// (B, H, Tk, D) where `mask` (broadcastable to (B, H, Tq, Tk), true = may
/// attend) allows: (output (B, H, Tq, D), log-sum-exp of the scaled scores
/// (B, H, Tq) float32, -inf for a query that sees no key of the block, whose
/// output is 0). In float32 by matmul and softmax, differentiable in both.
/// `scale` 0: 1 / sqrt(D).
std::pair<at::Tensor, at::Tensor> attention_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& mask, double scale = 0.0);

/// Two blocks' partial attention merged: the attention over both blocks'
/// keys. lse = log(exp(lse_a) + exp(lse_b)); out = out_a exp(lse_a - lse) +
/// out_b exp(lse_b - lse); a query neither block lets attend keeps lse -inf
/// and output 0.
std::pair<at::Tensor, at::Tensor> merge_attention(const at::Tensor& out_a, const at::Tensor& lse_a,
                                                  const at::Tensor& out_b, const at::Tensor& lse_b);

/// This rank's share of rows of `length` positions across the context-parallel
/// group `cp` for models::ForwardArgs::context: its slots on `device`, and
/// keys and values gathered from the group (an all-gather forward; backward,
/// a reduce-scatter: the gradient of this rank's positions summed over the
/// group). With `ring`, attention runs ring_attention instead: rank r sends
/// the share it holds to rank r + 1 and receives rank r - 1's, cp - 1 times,
/// attending to each share as it arrives (attention_block) and merging
/// (merge_attention); backward recomputes each share's scores from the saved
/// log-sum-exp (flash attention's backward) while the shares travel the ring
/// again with their key/value gradients, which a last step returns to their
/// owners. A rank holds its own share and one travelling share, never the
/// whole row's keys and values.
std::shared_ptr<const models::ContextShare> context_share(std::shared_ptr<Communicator> cp, int64_t length,
                                                          const at::Device& device, bool ring = false);

}  // namespace anvil::distributed
