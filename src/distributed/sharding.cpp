#include "distributed/sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "anvil/core/error.h"
#include "core/tensor_bytes.h"
#include "models/activation_checkpointing.h"
#include "models/init.h"

namespace anvil::distributed {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

PeerOutOfMemory::PeerOutOfMemory(const std::string& what)
    : c10::OutOfMemoryError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, what) {}

Sharding parse_sharding(const std::string& name) {
  if (name == "no_shard") return Sharding::NoShard;
  if (name == "shard_grad_op") return Sharding::ShardGradOp;
  if (name == "full_shard") return Sharding::FullShard;
  throw ConfigError(concat("dist.sharding: expected no_shard, shard_grad_op or full_shard, got \"", name, "\""));
}

std::string to_string(Sharding s) {
  switch (s) {
    case Sharding::NoShard:
      return "no_shard";
    case Sharding::ShardGradOp:
      return "shard_grad_op";
    case Sharding::FullShard:
      return "full_shard";
  }
  return "?";
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw ConfigError(concat("expected float32, bfloat16 or float16, got \"", name, "\""));
}

namespace {

// Freeing a buffer swaps its storage's memory out in place (the storage
// object, and so every view of it autograd saved, stays); gathering swaps
// fresh memory back in before writing into it.
void free_storage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// On the CPU, a unit's buffers (its gathered parameters, its flat gradient
// and reduced shard) come and go every step in the same few sizes. glibc
// keeps buffers below its growing mmap threshold (up to 32 MB) in its heap,
// where blocks of many sizes freed and taken in turn leave holes it never
// returns: on 4 ranks of a 77 M LLaMA that was about 0.45 GB per rank, a
// third of the model's state. So these buffers come from a cache of freed
// blocks of their exact size instead (at most two per size), as a GPU's
// caching allocator serves them there.
struct CachedBlock {
  void* ptr;
  size_t bytes;
};

class UnitBufferCache {
 public:
  static UnitBufferCache& get() {
    static auto* cache = new UnitBufferCache;  // never destroyed: tensors may outlive static destruction
    return *cache;
  }
  c10::DataPtr allocate(size_t bytes) {
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[bytes];
      if (!free.empty()) {
        ptr = free.back();
        free.pop_back();
      }
    }
    // 64-byte aligned, as LibTorch's own CPU buffers.
    if (!ptr) ptr = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    TORCH_CHECK(ptr != nullptr, "sharding: out of host memory allocating ", bytes, " bytes");
    return c10::DataPtr(ptr, new CachedBlock{ptr, bytes}, &UnitBufferCache::release, at::Device(at::kCPU));
  }

 private:
  static void release(void* ctx) {
    auto* block = static_cast<CachedBlock*>(ctx);
    get().put(block->ptr, block->bytes);
    delete block;
  }
  void put(void* ptr, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[bytes];
      if (free.size() < 2) {
        free.push_back(ptr);
        return;
      }
    }
    std::free(ptr);
  }
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
};

void alloc_storage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  const auto nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() >= nbytes) return;
  TORCH_CHECK(s->allocator() != nullptr, "sharding: buffer without an allocator");
  s->set_data_ptr_noswap(t.is_cpu() ? UnitBufferCache::get().allocate(nbytes) : s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

/// A buffer of `numel` elements: on the CPU from UnitBufferCache.
at::Tensor unit_buffer(int64_t numel, const at::TensorOptions& options) {
  if (!options.device().is_cpu()) return at::empty({numel}, options);
  const auto bytes = static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, UnitBufferCache::get().allocate(bytes), nullptr, false);
  return at::empty({0}, options).set_(storage, 0, {numel}, {1});
}

}  // namespace

// ---- units ------------------------------------------------------------------

std::unordered_set<std::string> input_embedding_unit(models::CausalLM& model) {
  const auto names = model.input_embedding_parameters();
  std::unordered_map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) params.emplace(p.key(), p.value());
  const auto head = model.output_head().weight;
  std::unordered_set<std::string> out;
  for (const auto& n : names) {
    const auto it = params.find(n);
    if (it == params.end()) return {};  // tied under another name, or absent: the root keeps them
    if (head.defined() && it->second.unsafeGetTensorImpl() == head.unsafeGetTensorImpl()) return {};  // tied
    out.insert(n);
  }
  return out;
}

struct ShardedModel::Unit {
  size_t index = 0;  // in units_ and layouts_
  size_t slot = 0;   // its block, or the root (the last slot)
  bool frozen = false;
  std::vector<at::Tensor> params;
  int64_t numel = 0, padded = 0, shard = 0;  // shard = elements this rank owns (padded)
  at::Tensor master;                         // float32 (shard), the optimizer's parameter
  at::Tensor whole;                          // param_dtype (padded); the module's parameters are views of it
  at::Tensor local;                          // cpu_offload: the shard in param_dtype on the device
  // Tensor parallelism: the master shard's ranges (begin, length) that hold cut parameters.
  std::vector<std::pair<int64_t, int64_t>> cut;
  bool resident = true;
  bool needs_reduce = false;
  // An all-gather in flight (a prefetch): its work and its input.
  Work gather_work;
  at::Tensor gather_src;
  bool gathering = false;
};

struct ShardedModel::Pending {
  Work work;
  at::Tensor in, out;
  Unit* unit = nullptr;
};

struct PostBackwardAccess {
  static void done(ShardedModel* m, size_t layer) { m->on_block_backward_done(layer); }
};

namespace {

/// The identity on a block's input; its backward runs once the block's whole
/// backward has (the input's gradient is the block's last one), which is
/// when the block's parameter gradients are complete.
struct PostBackward : public torch::autograd::Function<PostBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t layer, int64_t model) {
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["model"] = model;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* m = reinterpret_cast<ShardedModel*>(static_cast<intptr_t>(ctx->saved_data["model"].toInt()));
    PostBackwardAccess::done(m, static_cast<size_t>(ctx->saved_data["layer"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ShardedModel::ShardedModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<Communicator> comm,
                           ShardingOptions options)
    : model_(std::move(model)), comm_(std::move(comm)), options_(options) {
  // A frozen model needs no master: only full_shard holds less than the whole.
  if (options_.frozen && options_.strategy != Sharding::FullShard) options_.strategy = Sharding::NoShard;
  // Hybrid sharding: replica groups of consecutive ranks shard within themselves (no_shard replicates anyway).
  if (options_.strategy == Sharding::NoShard) options_.replicate = 1;
  group_ = comm_;
  TORCH_CHECK(!options_.data_parallel || options_.tensor_parallel, "ShardedModel: a data-parallel group alone");
  if (options_.data_parallel) group_ = options_.data_parallel;
  if (options_.replicate > 1) {
    const auto parent = group_;  // the ranks that hold the same parameters: all, or one tensor-parallel share's
    const int64_t all = parent->world_size(), r = parent->rank();
    if (all % options_.replicate != 0)
      throw ConfigError(concat("dist.replicate: ", options_.replicate, " replica groups do not divide the ", all,
                               options_.data_parallel ? " ranks that hold each tensor-parallel share" : " ranks"));
    const int64_t per = all / options_.replicate;
    group_ = parent->split(static_cast<int>(r / per), static_cast<int>(r), concat("shard group ", r / per));
    replicas_ = parent->split(static_cast<int>(r % per), static_cast<int>(r), concat("replicas of shard ", r % per));
  }
  // A model built without storage (models/init.h): under full_shard each rank reads its ranges below; the
  // other strategies keep whole parameters anyway.
  if (options_.strategy != Sharding::FullShard) models::materialize_deferred(*model_);
  device_ = model_->parameters().front().device();
  offload_ = options_.cpu_offload && options_.strategy == Sharding::FullShard && !options_.frozen;
  const int64_t world = group_->world_size(), rank = group_->rank();
  const auto L = model_->num_layers();
  // Slots: the blocks, the input embeddings when apart (input_embedding_unit), the root.
  const auto embeddings = input_embedding_unit(*model_);
  blocks_ = static_cast<size_t>(L);
  if (!embeddings.empty()) embed_slot_ = blocks_;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> members(static_cast<size_t>(L) + 1 +
                                                                       (embeddings.empty() ? 0 : 1));
  std::unordered_set<const void*> seen;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied
    size_t u = embeddings.count(item.key()) ? embed_slot_ : members.size() - 1;
    for (int64_t i = 0; i < L; ++i)
      if (item.key().rfind(model_->block_prefix(i) + ".", 0) == 0) {
        u = static_cast<size_t>(i);
        break;
      }
    members[u].emplace_back(item.key(), item.value());
  }
  const bool sharded = options_.strategy != Sharding::NoShard;
  slots_.resize(members.size());
  for (size_t slot = 0; slot < members.size(); ++slot) {
    // A trained model's frozen parameters (options_.trains) form a unit of their own after the trained one.
    std::vector<std::pair<std::string, at::Tensor>> parts[2];
    for (auto& m : members[slot])
      parts[!options_.frozen && options_.trains && !options_.trains(m.first) ? 1 : 0].push_back(std::move(m));
    for (int part = 0; part < 2; ++part) {
      if (parts[part].empty()) continue;
      UnitLayout layout;
      layout.name = slot < static_cast<size_t>(L) ? model_->block_prefix(static_cast<int64_t>(slot))
                    : slot == embed_slot_         ? "embed"
                                                  : "root";
      if (part == 1) layout.name += ".frozen";
      layout.frozen = options_.frozen || part == 1;
      auto unit = std::make_unique<Unit>();
      unit->index = units_.size();
      unit->slot = slot;
      unit->frozen = layout.frozen;
      for (const auto& [name, p] : parts[part]) {
        layout.params.push_back({name, p.sizes().vec(), layout.numel, p.numel()});
        layout.numel += p.numel();
        unit->params.push_back(p);
      }
      build_unit(std::move(unit), std::move(layout), sharded, world, rank);
    }
  }
  if (options_.tensor_parallel) {  // the whole model's shapes of the cut parameters
    tensor_parallel_ = true;
    whole_layouts_ =
        whole_unit_layouts(layouts_, options_.tensor_parallel_cuts, options_.tensor_parallel->world_size());
  }
  model_->parameter_source.reset();  // every parameter is now a view of a unit's buffer; the files close
  model_->sharded_parameters = this;
  model_->set_block_runner(
      [this](size_t layer, const at::Tensor& x, const models::BlockFn& block) { return run_block(layer, x, block); });
  model_->set_forward_begin([this] { begin_forward(); });
}

void ShardedModel::begin_forward() {
  if (options_.strategy != Sharding::FullShard || pinned_) return;
  // An evaluation's root, whole since the last forward: nothing reads it until this one's last block has run
  // (no backward follows). In a step it stays: the backward of an earlier forward's head reads it.
  if (evaluating_ && embed_slot_ != kNoSlot)
    for (auto* u : root()) release(*u);
  // The input embeddings: their own unit, or the root's part.
  for (auto* u : embed_slot_ == kNoSlot ? root() : slots_[embed_slot_]) gather(*u);
  if (blocks_ == 0) {
    for (auto* u : root()) gather(*u);
    return;
  }
  for (auto* u : slots_[0]) start_gather(*u);  // the first block's, while the embeddings compute
}

void ShardedModel::build_unit(std::unique_ptr<Unit> unit, UnitLayout layout, bool sharded, int64_t world,
                              int64_t rank) {
  unit->numel = layout.numel;
  unit->padded = sharded ? (layout.numel + world - 1) / world * world : layout.numel;
  unit->shard = sharded ? unit->padded / world : unit->padded;
  slots_[unit->slot].push_back(unit.get());
  layouts_.push_back(std::move(layout));
  units_.push_back(std::move(unit));
  Unit& u = *units_.back();
  const UnitLayout& l = layouts_.back();
  if (std::any_of(u.params.begin(), u.params.end(), [](const at::Tensor& p) { return models::is_deferred(p); }))
    return build_from_source(u, l);
  const auto device = u.params.front().device();
  auto flat = at::zeros({u.padded}, at::TensorOptions().dtype(at::kFloat).device(device));
  {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < u.params.size(); ++k)
      flat.narrow(0, l.params[k].offset, l.params[k].numel).copy_(u.params[k].reshape(-1));
  }
  group_->broadcast(flat, 0, concat("initial parameters of ", l.name));
  if (replicas_) replicas_->broadcast(flat, 0, concat("initial parameters of ", l.name, " across replicas"));
  // Float32 whole parameters that stay between uses hold the master too:
  // all of it (no_shard) or this rank's slice of it (shard_grad_op, whose
  // all-gather then runs in place). full_shard frees the whole buffer, so
  // its master is a copy.
  const bool fp32 = options_.param_dtype == at::kFloat;
  u.whole = flat.to(options_.param_dtype);  // `flat` itself when float32
  // A frozen unit's master is never stepped: in param_dtype, and a view of the whole buffer where that stays
  // (unsharded, shard_grad_op, a frozen model's root).
  const bool whole_stays = options_.strategy != Sharding::FullShard || stays_whole(u);
  if (u.frozen && !whole_stays)
    u.master = u.whole.narrow(0, rank * u.shard, u.shard).clone();
  else if (u.frozen)
    u.master = sharded ? u.whole.narrow(0, rank * u.shard, u.shard) : u.whole;
  else if (!sharded && fp32)
    u.master = u.whole;
  else if (!sharded)
    u.master = flat;
  else if (fp32 && options_.strategy == Sharding::ShardGradOp)
    u.master = u.whole.narrow(0, rank * u.shard, u.shard);
  else
    u.master = to_master_home(flat.narrow(0, rank * u.shard, u.shard).clone());
  if (offload_ && !u.frozen) u.local = u.master.to(device_, options_.param_dtype);
  if (!u.frozen) u.master.mutable_grad() = at::zeros_like(u.master);
  if (!u.frozen && options_.tensor_parallel)
    u.cut = cut_ranges(l, options_.tensor_parallel_cuts, sharded ? rank * u.shard : 0, u.master.numel());
  for (size_t k = 0; k < u.params.size(); ++k) {
    const auto& fp = l.params[k];
    u.params[k].set_data(u.whole.narrow(0, fp.offset, fp.numel).view(fp.shape));
    if (u.frozen) u.params[k].set_requires_grad(false);
  }
  // Freed before the next unit is built, so the constructor holds one unit's whole buffers at a time
  // beyond the model it was given (a frozen model's root stays: release() keeps it).
  if (options_.strategy == Sharding::FullShard) release(u);
}

bool ShardedModel::stays_whole(const Unit& u) const {
  return options_.frozen && u.slot + 1 == slots_.size();  // the root of a frozen model
}

void ShardedModel::build_from_source(Unit& unit, const UnitLayout& layout) {
  // full_shard over a model built without storage: this rank's shard straight from the source, range by
  // range; the whole buffer gets memory only when gathered. Real parameters among them (a score head, LoRA
  // adapters, the tensor-parallel cut layers' shares) are rank 0's, as in the constructor.
  const int64_t rank = group_->rank();
  const auto device = unit.params.front().device();
  const int64_t begin = std::min<int64_t>(rank * unit.shard, unit.numel);
  const int64_t end = std::min<int64_t>(begin + unit.shard, unit.numel);
  const auto dtype = unit.frozen ? options_.param_dtype : at::kFloat;
  auto master = at::zeros({unit.shard}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const auto& fp = layout.params[k];
    auto& p = unit.params[k];
    const bool deferred = models::is_deferred(p);
    if (!deferred) group_->broadcast(p, 0, concat("initial parameter ", fp.name));
    if (!deferred && replicas_) replicas_->broadcast(p, 0, concat("initial parameter ", fp.name, " across replicas"));
    const int64_t lo = std::max(begin, fp.offset), hi = std::min(end, fp.offset + fp.numel);
    if (lo >= hi) continue;
    const auto values = deferred ? model_->parameter_source->read(fp.name, lo - fp.offset, hi - lo)
                                 : p.reshape(-1).narrow(0, lo - fp.offset, hi - lo);
    TORCH_CHECK(values.numel() == hi - lo, "sharding: ", fp.name, ": the source gave ", values.numel(),
                " elements for ", hi - lo);
    master.narrow(0, lo - begin, hi - lo).copy_(values.reshape(-1));
  }
  unit.master = unit.frozen ? master.to(dtype) : to_master_home(master);
  if (!unit.frozen && options_.tensor_parallel)
    unit.cut = cut_ranges(layout, options_.tensor_parallel_cuts, rank * unit.shard, unit.master.numel());
  if (offload_ && !unit.frozen) unit.local = unit.master.to(device_, options_.param_dtype);
  if (!unit.frozen) unit.master.mutable_grad() = at::zeros_like(unit.master);
  // The whole buffer's memory, never touched, only while the views are cut (they check their storage's
  // bounds); it holds values once gathered.
  unit.whole = at::empty({unit.padded}, at::TensorOptions().dtype(options_.param_dtype).device(device));
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const auto& fp = layout.params[k];
    unit.params[k].set_data(unit.whole.narrow(0, fp.offset, fp.numel).view(fp.shape));
    if (unit.frozen) unit.params[k].set_requires_grad(false);
  }
  free_storage(unit.whole);
  unit.resident = false;
  if (stays_whole(unit)) gather(unit);
}

at::Tensor ShardedModel::to_master_home(const at::Tensor& t) const {
  if (!offload_) return t;
  // Pinned on CUDA, so the copies to and from the device are DMA transfers.
  auto host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(device_.is_cuda()));
  host.copy_(t);
  return host;
}

ShardedModel::~ShardedModel() {
  model_->set_block_runner(nullptr);
  model_->set_forward_begin(nullptr);
  if (model_->sharded_parameters == this) model_->sharded_parameters = nullptr;
}

std::vector<at::Tensor> ShardedModel::master_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : units_) out.push_back(u->master);
  return out;
}

std::vector<at::Tensor> ShardedModel::trained_master_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : units_)
    if (!u->frozen) out.push_back(u->master);
  return out;
}

bool ShardedModel::has_frozen_units() const {
  return !options_.frozen && std::any_of(units_.begin(), units_.end(), [](const auto& u) { return u->frozen; });
}

std::pair<int64_t, int64_t> ShardedModel::shard_range(size_t u) const {
  const auto& unit = *units_.at(u);
  if (options_.strategy == Sharding::NoShard) return {0, unit.numel};
  const int64_t begin = std::min<int64_t>(group_->rank() * unit.shard, unit.numel);
  return {begin, std::min<int64_t>(begin + unit.shard, unit.numel)};
}

at::Tensor ShardedModel::slice_for_rank(size_t u, const at::Tensor& whole) const {
  const auto& unit = *units_.at(u);
  TORCH_CHECK(whole.numel() == unit.numel, "slice_for_rank: expected ", unit.numel, " elements for ", layouts_[u].name,
              ", got ", whole.numel());
  auto out = at::zeros({unit.shard}, whole.options());
  const auto [b, e] = shard_range(u);
  if (e > b) out.narrow(0, 0, e - b).copy_(whole.reshape(-1).narrow(0, b, e - b));
  return out;
}

at::Tensor ShardedModel::gather_master(size_t u) { return gather_master(u, units_.at(u)->master); }

at::Tensor ShardedModel::gather_master(size_t u, const at::Tensor& shard) {
  auto& unit = *units_.at(u);
  TORCH_CHECK(shard.sizes() == unit.master.sizes(), "gather_master: expected a tensor shaped like the master shard");
  if (options_.strategy == Sharding::NoShard) return shard.narrow(0, 0, unit.numel).to(at::kFloat);
  auto whole = unit_buffer(unit.padded, shard.options().device(device_));
  group_->all_gather(whole, shard.to(device_).contiguous(), concat("master values of ", layouts_[u].name)).wait();
  return whole.narrow(0, 0, unit.numel).to(at::kFloat);  // a frozen unit's param_dtype values, as float32
}

void ShardedModel::load_unit(size_t u, const at::Tensor& values) { load_unit_shard(u, slice_for_rank(u, values)); }

void ShardedModel::load_unit_shard(size_t u, const at::Tensor& shard) {
  auto& unit = *units_.at(u);
  TORCH_CHECK(shard.numel() == unit.master.numel(), "load_unit_shard: expected ", unit.master.numel(), " elements for ",
              layouts_[u].name, ", got ", shard.numel());
  at::NoGradGuard no_grad;
  unit.master.copy_(shard.reshape(unit.master.sizes()).to(unit.master.device(), unit.master.scalar_type()));
  refresh_whole(unit);
}

void ShardedModel::start_gather(Unit& u) {
  if (u.resident || u.gathering) return;
  alloc_storage(u.whole);
  at::NoGradGuard no_grad;
  u.gather_src = u.local.defined() ? u.local : u.master.to(options_.param_dtype);
  agree_none_out_of_memory();
  u.gather_work = group_->all_gather(u.whole, u.gather_src, concat("parameters of ", layouts_[u.index].name));
  u.gathering = true;
  int64_t held = 0;
  for (const auto& v : units_) held += static_cast<int64_t>(v->whole.storage().nbytes());
  (evaluating_ ? eval_peak_ : peak_gathered_) = std::max(evaluating_ ? eval_peak_ : peak_gathered_, held);
}

void ShardedModel::gather(Unit& u) {
  if (u.resident) return;
  start_gather(u);
  u.gather_work.wait();
  u.gather_src = at::Tensor();
  u.gathering = false;
  u.resident = true;
}

void ShardedModel::release(Unit& u) {
  if (u.gathering) gather(u);  // never free memory a collective still writes
  if (!u.resident || pinned_ || options_.strategy != Sharding::FullShard) return;
  if (stays_whole(u)) return;
  free_storage(u.whole);
  u.resident = false;
}

void ShardedModel::refresh_whole(Unit& u) {
  at::NoGradGuard no_grad;
  switch (options_.strategy) {
    case Sharding::NoShard:
      if (!u.whole.is_same(u.master)) u.whole.copy_(u.master);
      break;
    case Sharding::ShardGradOp: {
      // In place when the master is this rank's slice of the whole buffer.
      const auto src = u.master.scalar_type() == options_.param_dtype ? u.master : u.master.to(options_.param_dtype);
      group_->all_gather(u.whole, src, concat("parameters of ", layouts_[u.index].name)).wait();
      break;
    }
    case Sharding::FullShard:
      if (u.gathering) gather(u);
      if (u.local.defined()) u.local.copy_(u.master);
      if (u.resident) {
        u.resident = false;  // stale: gather afresh
        gather(u);
      }
      break;
  }
}

at::Tensor ShardedModel::run_block(size_t layer, const at::Tensor& x, const models::BlockFn& block) {
  auto& units = slots_.at(layer);
  // Backward runs through a block of a trained model even where all its parameters are frozen (the input's
  // gradient needs them), so its units are gathered for it all the same.
  const bool grad = at::GradMode::is_enabled() && !options_.frozen;
  for (auto* u : units) gather(*u);
  const bool sharded = options_.strategy == Sharding::FullShard && !pinned_;
  // The input embeddings are done with: their backward reads no weights, so they are not gathered again.
  if (sharded && layer == 0 && embed_slot_ != kNoSlot)
    for (auto* u : slots_[embed_slot_]) release(*u);
  // Prefetch: the next block's gather (after the last block, the root's: the final norm and the heads) runs
  // while this block computes.
  if (sharded)
    for (auto* u : layer + 1 < blocks_ ? slots_[layer + 1] : root()) start_gather(*u);
  at::Tensor in = x;
  if (grad && x.requires_grad())
    in = PostBackward::apply(x, static_cast<int64_t>(layer), static_cast<int64_t>(reinterpret_cast<intptr_t>(this)));
  auto y = grad && options_.activation_checkpointing ? models::checkpoint_block(block, in) : block(in);
  if (grad)
    for (auto* u : units) u->needs_reduce = !u->frozen;
  if (options_.strategy == Sharding::FullShard && !pinned_) {
    for (auto* u : units) release(*u);
    if (grad && y.requires_grad())
      y.register_hook([this, layer](const at::Tensor& g) {
        for (auto* u : slots_[layer]) gather(*u);  // before the block's backward
        if (layer > 0)
          for (auto* u : slots_[layer - 1]) start_gather(*u);  // the next block backward needs
        return g;
      });
  }
  if (sharded && layer + 1 == blocks_)
    for (auto* u : root()) gather(*u);  // the final norm and the heads read it next
  return y;
}

void ShardedModel::on_block_backward_done(size_t layer) {
  for (auto* u : slots_.at(layer)) {
    if (sync_ && u->needs_reduce) reduce_gradients(*u);
    if (options_.strategy == Sharding::FullShard) release(*u);
  }
}

void ShardedModel::reduce_gradients(Unit& u) {
  const auto& layout = layouts_[u.index];
  auto flat = unit_buffer(u.padded, u.master.options().dtype(options_.reduce_dtype)).zero_();
  {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < u.params.size(); ++k) {
      auto& p = u.params[k];
      if (!p.grad().defined()) continue;
      flat.narrow(0, layout.params[k].offset, layout.params[k].numel).copy_(p.grad().reshape(-1));
      p.mutable_grad().reset();
    }
  }
  u.needs_reduce = false;
  const auto what = concat("gradients of ", layout.name);
  auto pending = std::make_unique<Pending>();
  pending->unit = &u;
  pending->in = flat;
  // Allocated before the agreement: nothing between it and the collective may run out of memory.
  pending->out = options_.strategy == Sharding::NoShard ? flat : unit_buffer(u.shard, flat.options());
  agree_none_out_of_memory();
  if (options_.strategy == Sharding::NoShard)
    group_->all_reduce_sum(flat, what);
  else
    pending->work = group_->reduce_scatter_sum(pending->out, flat, what);
  pending_.push_back(std::move(pending));
  // As FSDP2: each unit's reduction is folded into its master gradient once the next is issued, so at most two
  // are in flight and a backward holds the shards plus two units' flat gradients, not the whole model's.
  while (pending_.size() > 2) fold_oldest_reduction();
  peak_pending_ = std::max(peak_pending_, static_cast<int64_t>(pending_.size()));
}

void ShardedModel::fold_oldest_reduction() {
  auto p = std::move(pending_.front());
  pending_.erase(pending_.begin());
  p->work.wait();
  // Hybrid sharding: every replica group reduced its own ranks' gradients into the same shard; sum the groups.
  if (replicas_) {
    agree_none_out_of_memory();
    replicas_->all_reduce_sum(p->out, concat("gradients of ", layouts_[p->unit->index].name, " across replicas"));
  }
  at::NoGradGuard no_grad;
  p->unit->master.mutable_grad().add_(p->out.to(p->unit->master.device(), at::kFloat));
}

namespace {
/// One agreement: the sum over the world of each rank's flag (1: it ran out of memory).
bool any_out_of_memory(Communicator& world, const at::Device& device, bool mine) {
  auto flag = at::full({1}, mine ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(device));
  world.all_reduce_sum(flag, "out-of-memory agreement (train.micro_batch_size: auto)");
  return flag.item<float>() > 0;
}
}  // namespace

void ShardedModel::agree_none_out_of_memory() {
  if (!options_.agree_on_out_of_memory || comm_->world_size() == 1) return;
  if (any_out_of_memory(*comm_, device_, false))
    throw PeerOutOfMemory("another rank ran out of device memory in this step's forwards and backwards");
}

void ShardedModel::announce_out_of_memory() {
  if (options_.agree_on_out_of_memory && comm_->world_size() > 1) any_out_of_memory(*comm_, device_, true);
}

void ShardedModel::begin_step() {
  TORCH_CHECK(!options_.frozen, "ShardedModel: a frozen model does not step");
  // What a step abandoned by an error (an out-of-memory error under train.micro_batch_size: auto) left: its
  // reductions in flight and its whole parameters' gradients. A step that ended leaves none.
  while (!pending_.empty()) {
    pending_.front()->work.wait();
    pending_.erase(pending_.begin());
  }
  for (auto& u : units_) {
    u->needs_reduce = false;
    for (auto& p : u->params) p.mutable_grad().reset();
  }
  peak_gathered_ = 0;
  peak_pending_ = 0;
  for (const auto& v : units_) peak_gathered_ += static_cast<int64_t>(v->whole.storage().nbytes());
  for (auto& u : units_) {
    if (u->frozen) continue;
    auto& g = u->master.mutable_grad();
    if (g.defined())
      g.zero_();
    else
      g = at::zeros_like(u->master);  // the optimizer's zero_grad() drops it
  }
  // Without a unit of their own, the input embeddings are the root's: whole for the step, as the LM head
  // (tied to them, or beside them) is. Else the root is gathered when the last block has run.
  if (options_.strategy == Sharding::FullShard && embed_slot_ == kNoSlot)
    for (auto* u : root()) gather(*u);
}

void ShardedModel::finish_backward() {
  if (sync_) {
    // Units whose post-backward hook did not run (e.g. a block whose input
    // needs no gradient) and the root, always in the same order on every rank.
    for (auto& u : units_)
      if (!u->frozen && (u->needs_reduce || u->slot + 1 == slots_.size() || u->slot == embed_slot_))
        reduce_gradients(*u);
  }
  while (!pending_.empty()) fold_oldest_reduction();
  // Every block; the root too where the input embeddings are apart (the next micro-batch gathers it after its
  // last block, as FSDP2 reshards after backward), else it stays whole for the step.
  if (options_.strategy == Sharding::FullShard)
    for (auto& u : units_)
      if (u->slot + 1 < slots_.size() || embed_slot_ != kNoSlot) release(*u);
}

at::Tensor ShardedModel::clip_grad_norm_on_device(double max_norm) {
  // The squares summed in double over every rank's shards; the coefficient
  // (torch's max_norm / (norm + 1e-6), applied when below 1) stays on the
  // device, so the step is queued whole; the caller reads the norm.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& u : units_)
    if (u->master.grad().defined()) grads.push_back(u->master.grad());
  if (grads.empty()) return at::zeros({}, units_.front()->master.options().dtype(at::kDouble).device(device_));
  std::vector<at::Tensor> squares;
  for (const auto& n : at::_foreach_norm(grads, 2, at::kDouble)) squares.push_back(n.square());
  auto sq = at::stack(squares).sum().view({1}).to(device_);  // offloaded gradients: summed on the host
  if (options_.tensor_parallel) {
    // (cut, whole) squares: the cut parameters' shares differ across the tensor-parallel group and add up; the
    // whole ones are the same on every rank of it and count once.
    auto cut = at::zeros({1}, sq.options());
    for (auto& u : units_)
      if (u->master.grad().defined())
        for (const auto& [b, n] : u->cut)
          cut += u->master.grad().narrow(0, b, n).to(at::kDouble).square().sum().to(device_);
    sq = at::cat({cut, sq - cut});
  }
  if (options_.strategy != Sharding::NoShard) group_->all_reduce_sum(sq, "gradient norm");
  if (options_.tensor_parallel) {
    auto cut = sq.narrow(0, 0, 1).contiguous();
    options_.tensor_parallel->all_reduce_sum(cut, "gradient norm over the tensor-parallel group");
    sq = (cut + sq.narrow(0, 1, 1)).view({1});
  }
  const auto total = sq.sqrt().reshape({});
  if (max_norm > 0) {
    const auto coef =
        at::clamp_max(max_norm / (total + 1e-6), 1.0).to(grads.front().device(), grads.front().scalar_type());
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

void ShardedModel::after_optimizer_step() {
  if (options_.strategy == Sharding::FullShard) {
    for (auto& u : units_) {
      if (u->gathering) gather(*u);
      if (u->local.defined()) u->local.copy_(u->master);  // the stepped master, to the device in param_dtype
      if (u->resident) {
        u->resident = false;  // its values are stale now
        if (pinned_)
          gather(*u);
        else
          free_storage(u->whole);
      }
    }
    return;
  }
  for (auto& u : units_)
    if (!u->frozen) refresh_whole(*u);  // a frozen unit changes only by load_unit, which refreshes it
}

void ShardedModel::gather_full_parameters() {
  if (pin_depth_++ > 0) return;
  for (auto& u : units_) gather(*u);
  pinned_ = true;
}

void ShardedModel::release_full_parameters() {
  if (pin_depth_ == 0 || --pin_depth_ > 0) return;
  pinned_ = false;
  if (options_.strategy == Sharding::FullShard)
    for (auto& u : units_)
      if (!(evaluating_ && u->slot + 1 == slots_.size())) release(*u);  // evaluation keeps the root
}

void ShardedModel::begin_evaluation() {
  evaluating_ = true;
  eval_peak_ = 0;
  for (const auto& v : units_) eval_peak_ += static_cast<int64_t>(v->whole.storage().nbytes());
  // With the input embeddings apart, each forward gathers the root after its last block (begin_forward frees
  // it before the next); else the root, holding them, stays whole through the evaluation.
  if (options_.strategy == Sharding::FullShard && embed_slot_ == kNoSlot)
    for (auto* u : root()) gather(*u);
}

int64_t ShardedModel::end_evaluation() {
  evaluating_ = false;
  if (options_.strategy == Sharding::FullShard)
    for (auto& u : units_)
      if (u->slot + 1 == slots_.size() || u->slot == embed_slot_) release(*u);
  return eval_peak_;
}

MemoryBytes ShardedModel::memory() const {
  std::vector<at::Tensor> params, grads;
  for (const auto& u : units_) {
    params.push_back(u->master);
    params.push_back(u->whole);
    params.push_back(u->local);
    params.insert(params.end(), u->params.begin(), u->params.end());
    grads.push_back(u->master.grad());
    for (const auto& p : u->params) grads.push_back(p.grad());
  }
  std::unordered_set<const void*> seen;
  MemoryBytes m;
  m.parameters = storage_bytes(params, seen);
  m.gradients = storage_bytes(grads, seen);
  m.peak_gathered = peak_gathered_;
  m.peak_reductions_in_flight = peak_pending_;
  if (offload_) {
    std::vector<at::Tensor> host;
    for (const auto& u : units_) {
      host.push_back(u->master);
      host.push_back(u->master.grad());
    }
    std::unordered_set<const void*> counted;
    m.offloaded = storage_bytes(host, counted);
  }
  return m;
}

}  // namespace anvil::distributed
