#pragma once
// FSDP-style sharding of a built model, applied from outside: the units are
// the model's transformer blocks (CausalLM::block_prefix), the input
// embeddings when they are not tied to the LM head ("embed"), and one root
// unit for everything else (final norm, heads; the embeddings when tied), as
// torchtitan cuts them. A trained model's frozen parameters form units of
// their own beside these (ShardingOptions::trains). Each unit's
// parameters are flattened back to back into one buffer, padded to a multiple
// of the world size; rank r owns elements [r * n, (r + 1) * n) of it.
//
//   no_shard       every rank keeps the whole flat buffer; gradients are
//                  all-reduced once per optimizer step (DDP).
//   shard_grad_op  parameters stay whole; gradients are reduce-scattered and
//                  master weights and optimizer state are sharded; the updated
//                  shards are all-gathered after each step (ZeRO-2).
//   full_shard     only the shard stays between uses: a block's parameters are
//                  all-gathered before its forward and freed after it,
//                  gathered again before its backward, and its gradients are
//                  reduce-scattered and freed as soon as its backward ends
//                  (ZeRO-3 / FSDP). The input embeddings are gathered for
//                  the start of each forward and freed when the first block
//                  runs (their backward reads no weights); the root is
//                  gathered when the last block has run and freed after the
//                  micro-batch's backward (whole for the step when it holds
//                  tied embeddings).
//                  The next block's gather is issued before the current
//                  block computes (forward and backward), so on NCCL it
//                  overlaps compute.
//
// The optimizer steps float32 master shards (`master_parameters()`); forward
// and backward run in `param_dtype` (mixed precision when not float32) and
// gradients are reduced in `reduce_dtype`. The module's parameters become
// views of the unit buffers, so the model's code is unchanged; freeing and
// re-gathering swap the buffer's storage in place, which keeps the views
// autograd saved valid. docs/distributed.md.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "distributed/comm.h"
#include "distributed/tensor_parallel.h"
#include "anvil/models/causal_lm.h"

namespace anvil::distributed {

enum class Sharding { NoShard, ShardGradOp, FullShard };

/// "no_shard" | "shard_grad_op" | "full_shard".
Sharding parse_sharding(const std::string& name);
std::string to_string(Sharding s);
/// "float32" | "bfloat16" | "float16".
at::ScalarType parse_dtype(const std::string& name);

struct ShardingOptions {
  Sharding strategy = Sharding::NoShard;
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  bool activation_checkpointing = false;
  /// A frozen model (a reference, a reward model, a critic's target): forward
  /// only, no optimizer. Its parameters stay in `param_dtype` with no float32
  /// master and no gradients. Under full_shard each rank keeps its shard of
  /// every block and gathers a block only for its forward; the root unit stays
  /// whole. Other strategies keep the whole model on every rank.
  bool frozen = false;
  /// full_shard, trained models only: each unit's float32 master shard and
  /// its gradient live in host memory (pinned on CUDA), so AdamW's moments
  /// and step do too; the device keeps the unit's shard in param_dtype (the
  /// all-gather's source, refreshed after each optimizer step) and the
  /// reduce-scattered gradients are added to the host's master gradient.
  bool cpu_offload = false;
  /// Hybrid sharding (HSDP): the world's ranks form `replicate` groups of
  /// world / replicate consecutive ranks; the strategy shards within a group
  /// and the groups hold the same shards (reduced gradients all-reduced
  /// across them). 1 = one group of every rank.
  int64_t replicate = 1;
  /// Tensor parallelism (distributed/tensor_parallel.h, distributed/mesh.h):
  /// the model's block layers are already cut across `tensor_parallel`'s
  /// ranks (`tensor_parallel_cuts`, apply_tensor_parallel's result, by
  /// parameter name). The strategy then shards over `data_parallel` (the
  /// ranks that hold the same shares) instead of every rank, and the
  /// gradient norm counts the cut parameters' squares on every rank of the
  /// group and the whole ones' once. With replicate > 1 the replica groups
  /// split `data_parallel` (its ranks in groups of data_parallel / replicate
  /// consecutive ones).
  std::shared_ptr<Communicator> tensor_parallel, data_parallel;
  std::map<std::string, ParallelShard> tensor_parallel_cuts;
  /// A trained model's parameters the run trains (empty: all). The others
  /// (LoRA's base, ILQL's target heads) form frozen units of their own beside
  /// each block's and the root's trained one: a frozen unit holds its shard in
  /// param_dtype only (no float32 master, gradient or optimizer state), is
  /// gathered and freed with its block, and keeps requires_grad false.
  std::function<bool(const std::string&)> trains;
  /// train.micro_batch_size: auto on several ranks: before each collective
  /// of a forward or backward the ranks agree, by an all-reduce of a flag
  /// over the world, that none ran out of memory, so one rank's error never
  /// leaves the others waiting in a collective it will not join (composer's
  /// sync hooks for FSDP auto micro-batching). A rank that did joins the
  /// next agreement through announce_out_of_memory(); the others throw
  /// PeerOutOfMemory there, and every rank runs the step again, split.
  bool agree_on_out_of_memory = false;
};

/// Thrown on every rank at an agreement where another rank said it ran out
/// of memory (ShardingOptions::agree_on_out_of_memory): an out-of-memory
/// error of the step, caught as the rank's own is.
class PeerOutOfMemory : public c10::OutOfMemoryError {
 public:
  explicit PeerOutOfMemory(const std::string& what);
};

/// The parameters ShardedModel puts in a unit of their own, "embed": the
/// model's input_embedding_parameters(), unless one of them is the LM head's
/// weight (tied embeddings) or absent; then none (the root keeps them).
std::unordered_set<std::string> input_embedding_unit(models::CausalLM& model);

/// One parameter's place in its unit's flat buffer.
struct FlatParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

/// A unit: its name ("transformer.h.3" or "root") and parameters, back to
/// back. A trained model's frozen parameters form a unit of their own, named
/// "<name>.frozen" ("transformer.h.3.frozen", "root.frozen").
struct UnitLayout {
  std::string name;
  std::vector<FlatParam> params;
  int64_t numel = 0;
  /// Never stepped: its master is the param_dtype shard, with no gradient
  /// and no optimizer state (a frozen model's units, a trained model's frozen ones).
  bool frozen = false;
};

/// Byte counts of distinct tensor storages held right now.
struct MemoryBytes {
  int64_t parameters = 0;  // master shards and whole (gathered) parameters
  int64_t gradients = 0;
  /// The most bytes of whole (gathered) parameters held at once since the
  /// last begin_step(), evaluations apart (end_evaluation() returns theirs):
  /// under full_shard, the root unit plus the block that runs and the one
  /// being prefetched, or a forward's input embeddings and first block.
  int64_t peak_gathered = 0;
  /// The most gradient reductions in flight at once since the last
  /// begin_step() (each holds a unit's flat gradient): at most 2.
  int64_t peak_reductions_in_flight = 0;
  /// Under cpu_offload: the master shards and their gradients, in host memory.
  int64_t offloaded = 0;
};

/// `local` (a tensor-parallel model's units) with the cut parameters' whole
/// shapes across `tp` ranks and the offsets that follow.
std::vector<UnitLayout> whole_unit_layouts(const std::vector<UnitLayout>& local,
                                           const std::map<std::string, ParallelShard>& cuts, int64_t tp);

/// The ranges (begin, length) of elements [begin, begin + length) of a unit
/// that hold parameters `cuts` names, relative to `begin`.
std::vector<std::pair<int64_t, int64_t>> cut_ranges(const UnitLayout& layout,
                                                    const std::map<std::string, ParallelShard>& cuts, int64_t begin,
                                                    int64_t length);

class ShardedModel : public models::ShardedParameters {
 public:
  /// Flattens `model`'s parameters (rank 0's values win: they are broadcast)
  /// and installs the block runner. The model must already be on its device.
  ShardedModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<Communicator> comm, ShardingOptions options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  models::CausalLM& model() { return *model_; }
  /// Every rank of the run (barriers, who writes what).
  Communicator& comm() { return *comm_; }
  /// The ranks this rank shards with: comm() unless hybrid sharding or
  /// tensor parallelism; shard ranges, shard files and gathers are this group's.
  Communicator& shard_comm() { return *group_; }
  /// Hybrid sharding: which replica group this rank is in, and how many there are.
  int64_t replica() const { return comm_->rank() / group_->world_size(); }
  int64_t replicas() const { return options_.replicate; }
  const ShardingOptions& options() const { return options_; }

  /// Every unit's master shard, in layouts() order: float32 for trained
  /// units, param_dtype for frozen ones.
  std::vector<at::Tensor> master_parameters() const;
  /// The float32 master shards the optimizer steps: the trained units' ones.
  std::vector<at::Tensor> trained_master_parameters() const;
  /// Whether some unit is frozen while the model trains (LoRA's base).
  bool has_frozen_units() const;
  /// Where the model computes and the collectives run.
  at::Device device() const { return device_; }
  /// Where the masters, their gradients and the optimizer state live: the
  /// host under cpu_offload, else device().
  at::Device master_device() const { return offload_ ? at::Device(at::kCPU) : device_; }
  bool offloaded() const { return offload_; }
  const std::vector<UnitLayout>& layouts() const { return layouts_; }
  /// The units as the whole model lays them out: under tensor parallelism the
  /// cut parameters' whole shapes (and the offsets that follow), which
  /// checkpoints use so that they do not depend on the mesh; layouts()
  /// otherwise.
  const std::vector<UnitLayout>& whole_layouts() const { return tensor_parallel_ ? whole_layouts_ : layouts_; }
  /// Collective over the tensor-parallel group: unit `u`'s flat values in
  /// layouts() order (numel() elements, float32) -> whole_layouts()'s. The
  /// input itself without tensor parallelism.
  at::Tensor to_whole_layout(size_t u, const at::Tensor& flat);
  /// The inverse, no collective: this rank's shares of whole_layouts()'s flat values.
  at::Tensor from_whole_layout(size_t u, const at::Tensor& whole) const;
  /// This rank's share of parameter `name`'s whole tensor (the tensor itself
  /// unless tensor parallelism cuts it).
  at::Tensor share_of_whole(const std::string& name, const at::Tensor& whole) const;
  /// The tensor-parallel group, or null.
  Communicator* tensor_parallel() const { return options_.tensor_parallel.get(); }
  /// This rank's elements [begin, end) of unit `u`'s flat parameters (clipped
  /// to the unit's size, so the last ranks may hold fewer or none).
  std::pair<int64_t, int64_t> shard_range(size_t u) const;

  /// Before a step's first forward: zeroes master gradients (and, under
  /// full_shard with tied embeddings, gathers the root unit). What a step
  /// abandoned by an error left (reductions in flight, gradients of whole
  /// parameters) is dropped, so the step can run again.
  void begin_step();
  /// Whether the coming backward reduces gradients across ranks. Under
  /// no_shard and shard_grad_op the loop syncs only on a step's last
  /// micro-batch (gradients accumulate locally before); full_shard always
  /// syncs, since it keeps no whole gradients.
  void set_grad_sync(bool sync) { sync_ = sync || options_.strategy == Sharding::FullShard; }
  /// After each backward: reduces what the per-block hooks did not and waits
  /// for every reduction; master gradients then hold the sum over ranks.
  void finish_backward();
  /// Under agree_on_out_of_memory: the agreement (throws PeerOutOfMemory
  /// when a rank said it ran out of memory); the engine calls it once more
  /// at the end of a step's backwards, before the step's other collectives.
  /// Does nothing otherwise.
  void agree_none_out_of_memory();
  /// Under agree_on_out_of_memory, on a rank that caught its own
  /// out-of-memory error in a forward or backward: says so at the other
  /// ranks' next agreement.
  void announce_out_of_memory();
  /// Global L2 norm of the master gradients (over all ranks); scales them to
  /// `max_norm` when larger (0 = only measure). The norm is returned unread,
  /// a 0-dim float64 tensor on the device: nothing waits for the device.
  at::Tensor clip_grad_norm_on_device(double max_norm);
  /// After the optimizer stepped the masters: refreshes whole parameters
  /// (no_shard, shard_grad_op) or frees the root unit (full_shard).
  void after_optimizer_step();

  /// Makes every parameter whole until release_full_parameters() (eval,
  /// saving a consolidated model); blocks are then neither gathered nor freed.
  void gather_full_parameters() override;  // nests: the outermost release frees
  void release_full_parameters() override;
  /// Evaluation through the shards (Engine::evaluating): under full_shard
  /// the root unit is gathered and stays whole until end_evaluation(); the
  /// blocks are gathered one at a time as the forward reaches them. Other
  /// strategies hold whole parameters anyway.
  void begin_evaluation();
  /// Returns the most parameter bytes held whole at once since
  /// begin_evaluation() (generation's whole model included).
  int64_t end_evaluation();
  int64_t held_parameter_bytes() const override { return memory().parameters; }

  /// Overwrites unit `u`'s master shard from `values` (the unit's whole flat
  /// float32 parameters, numel() elements) and refreshes whole parameters.
  void load_unit(size_t u, const at::Tensor& values);
  /// The same from this rank's slice alone (slice_for_rank's shape: the shard,
  /// zero-padded): a streaming resume reads no more than that.
  void load_unit_shard(size_t u, const at::Tensor& shard);
  /// Collective: unit `u`'s whole master values in float32 (numel() elements,
  /// on device()), gathered from every rank's shard.
  at::Tensor gather_master(size_t u);
  /// Collective: the whole of a tensor shaped like unit `u`'s master shard
  /// (an AdamW moment), numel() elements, gathered from every rank.
  at::Tensor gather_master(size_t u, const at::Tensor& shard);
  /// This rank's slice of a whole flat per-unit tensor, padded to the shard size.
  at::Tensor slice_for_rank(size_t u, const at::Tensor& whole) const;

  MemoryBytes memory() const;

 private:
  struct Unit;
  at::Tensor run_block(size_t layer, const at::Tensor& x, const models::BlockFn& block);
  /// Before each forward (CausalLM::set_forward_begin), under full_shard: gathers the input embeddings and
  /// starts the first block's gather.
  void begin_forward();
  /// A unit whose parameters are deferred (models/init.h): its master shard
  /// read from the model's parameter_source; full_shard only.
  void build_from_source(Unit& unit, const UnitLayout& layout);
  /// The constructor's work for one unit: its flat buffers, master and views.
  void build_unit(std::unique_ptr<Unit> unit, UnitLayout layout, bool sharded, int64_t world, int64_t rank);
  /// A unit that stays whole under full_shard: the root of a frozen model.
  bool stays_whole(const Unit& u) const;
  void start_gather(Unit& u);  // issues the all-gather (async where the backend allows)
  void gather(Unit& u);        // ... and waits for it
  void release(Unit& u);
  void reduce_gradients(Unit& u);
  void fold_oldest_reduction();  // waits for the oldest reduction in flight, adds it to its master gradient
  void refresh_whole(Unit& u);
  /// The master shard's home: the host (pinned on CUDA) under cpu_offload, else where it is.
  at::Tensor to_master_home(const at::Tensor& t) const;
  void on_block_backward_done(size_t layer);
  friend struct PostBackwardAccess;

  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Communicator> group_;     // the shard group (comm_ unless hybrid sharding)
  std::shared_ptr<Communicator> replicas_;  // the same shard index in every replica group (hybrid sharding)
  ShardingOptions options_;
  at::Device device_{at::kCPU};
  bool offload_ = false;
  std::vector<UnitLayout> layouts_;
  bool tensor_parallel_ = false;
  std::vector<UnitLayout> whole_layouts_;     // tensor parallelism: layouts_ with whole shapes
  std::vector<std::unique_ptr<Unit>> units_;  // layouts() order: per slot, the trained unit then the frozen one
  std::vector<std::vector<Unit*>> slots_;     // blocks 0..L-1, then the root: each slot's units
  std::vector<Unit*>& root() { return slots_.back(); }
  static constexpr size_t kNoSlot = static_cast<size_t>(-1);
  size_t blocks_ = 0;            // transformer blocks: slots 0 .. blocks_ - 1
  size_t embed_slot_ = kNoSlot;  // the input embeddings' slot (blocks_), when apart from the root
  struct Pending;
  std::vector<std::unique_ptr<Pending>> pending_;
  bool sync_ = true;
  bool pinned_ = false;
  int pin_depth_ = 0;  // gather_full_parameters() calls not yet released
  bool evaluating_ = false;
  int64_t eval_peak_ = 0;
  int64_t peak_gathered_ = 0;
  int64_t peak_pending_ = 0;
};

/// The frozen model a run holds (train::RunContext::freeze) and its freezing
/// function, as the layers above name them (anvil/models/causal_lm.h).
using models::FreezeFn;
using models::FrozenModel;

}  // namespace anvil::distributed
