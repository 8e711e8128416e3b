#pragma once
// Tensor parallelism installed from outside the model, as sharding is: the
// family's plan (models/tensor_parallel.h) names each block layer's style;
// apply_tensor_parallel() cuts those weights to this rank's share and gives
// the layers the group's collectives (Megatron's identity / all-reduce
// pairs as autograd functions; with sequence parallelism, all-gather /
// reduce-scatter along the sequence). Every other parameter (norms, MoE
// experts, and unless vocabulary parallelism cuts their rows the embedding
// and the LM head) stays whole on every rank of the group, so the logits
// are whole and everything downstream of the forward is unchanged.
// FSDP then shards the shares over the data-parallel group (distributed/mesh.h).
// docs/distributed.md.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"
#include "models/tensor_parallel.h"

namespace anvil::models {
class CausalLM;
}

namespace anvil::distributed {

/// How one parameter is cut: dimension `dim` of its whole shape holds the
/// fused `parts` back to back; each part is cut evenly across the group and
/// rank t holds the t-th piece of every part, concatenated.
struct ParallelShard {
  int64_t dim = 0;
  std::vector<int64_t> parts;
};

/// Rank `rank` of `size`'s share of `whole`.
at::Tensor share_of(const at::Tensor& whole, const ParallelShard& cut, int64_t rank, int64_t size);
/// The whole tensor from every rank's share, in rank order (share_of's inverse).
at::Tensor whole_from_shares(const std::vector<at::Tensor>& shares, const ParallelShard& cut);

/// The layers' view of a tensor-parallel group over `comm` (the autograd
/// functions of models::TensorParallelGroup).
std::shared_ptr<models::TensorParallelGroup> tensor_parallel_group(std::shared_ptr<Communicator> comm);

/// Cuts `model`'s block layers to this rank's share across `comm` per the
/// family's plan and installs the group on them; returns each cut
/// parameter's ParallelShard by name (empty on a group of one rank, which
/// changes nothing). The model must hold its whole parameters (before
/// sharding, none deferred). Throws ConfigError naming `key` when the group's
/// size does not divide a layer's heads or features, when the model has
/// LoRA adapters, or when its config has dropout (the ranks of a group would
/// draw different masks: there is no per-rank generator yet).
/// With `sequence_parallel` the model's blocks also split their activations'
/// positions over the group (CausalLM::sequence_parallel): every norm inside
/// a block sums its weights' gradient over the group; a block parameter that
/// is neither cut, a norm's nor a row-parallel layer's bias, and MoE
/// families, are refused naming dist.sequence_parallel.
/// With `vocab_parallel`, the input embedding's and an untied LM head's
/// vocabulary rows are cut too (CausalLM::vocab_parallel); a vocabulary the
/// group's size does not divide is refused naming dist.vocab_parallel.
std::map<std::string, ParallelShard> apply_tensor_parallel(models::CausalLM& model, std::shared_ptr<Communicator> comm,
                                                           const std::string& key = "dist.tensor_parallel",
                                                           bool sequence_parallel = false, bool vocab_parallel = false);

/// Cross entropy of logits whose vocabulary is split across `comm`'s ranks
/// (Megatron's vocab-parallel cross entropy): `logits` (N, V / tp) are this
/// rank's columns [rank * V / tp, (rank + 1) * V / tp), `targets` (N) global
/// ids. Per row, log(sum_v exp(z_v)) - z_target from the row's max (an
/// all-gather of each rank's), sum of exponentials and target logit (one
/// all-reduce of both); rows whose target is `ignore_index` give 0. Returns
/// (N) float32 losses. The backward needs no collective: each rank's
/// softmax columns minus the target's one-hot, times the row's gradient.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        std::shared_ptr<Communicator> comm, int64_t ignore_index = -100);

/// Collective over `comm` (the group): the whole tensor from this rank's share.
at::Tensor gather_whole(const at::Tensor& share, const ParallelShard& cut, Communicator& comm);

}  // namespace anvil::distributed
