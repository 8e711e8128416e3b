#include "distributed/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"
#include "models/init.h"
#include "models/layers.h"
#include "models/lora.h"

namespace anvil::distributed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Communicator* comm_of(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());  // the group outlives the graph
}

at::Tensor summed(const at::Tensor& t, Communicator& comm, const char* what) {
  auto out = t.contiguous().clone();
  comm.all_reduce_sum(out, what);
  return out;
}

/// Identity forward; the gradient summed over the group.
struct EnterFunction : public torch::autograd::Function<EnterFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], *comm_of(ctx), "tensor parallel: a column-parallel layer's input gradient"), at::Tensor()};
  }
};

/// Summed over the group forward; identity backward.
struct ReduceFunction : public torch::autograd::Function<ReduceFunction> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& y, int64_t comm) {
    return summed(y, *reinterpret_cast<Communicator*>(comm), "tensor parallel: a row-parallel layer's output");
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

// Sequence parallelism: rows of T positions split into `size` parts of P = ceil(T / size) (models/tensor_parallel.h).

int64_t part_length(int64_t length, int64_t size) { return (length + size - 1) / size; }

/// (B, T, ...) -> (B, size * P, ...), zeros after T.
at::Tensor padded(const at::Tensor& x, int64_t length, int64_t size) {
  const int64_t total = part_length(length, size) * size;
  if (total == x.size(1)) return x;
  auto sizes = x.sizes().vec();
  sizes[1] = total - x.size(1);
  return at::cat({x, at::zeros(sizes, x.options())}, 1);
}

enum SequenceOp : int64_t { kKeepMine, kGather, kReduceScatter };

/// One of the three moves of a sequence-parallel activation over `comm`: kKeepMine (B, T, ...) -> (B, P, ...) this
/// rank's positions; kGather (B, P, ...) -> (B, T, ...) every rank's; kReduceScatter (B, T, ...) partial sums ->
/// (B, P, ...) this rank's positions of their sum.
at::Tensor sequence_op(SequenceOp op, const at::Tensor& x, int64_t length, Communicator& comm, const char* what) {
  const int64_t size = comm.world_size(), P = part_length(length, size), B = x.size(0);
  auto rest = x.sizes().slice(2).vec();
  auto part_sizes = rest;
  part_sizes.insert(part_sizes.begin(), {B, P});
  if (op == kKeepMine) return padded(x, length, size).narrow(1, comm.rank() * P, P).contiguous();
  if (op == kGather) {
    const auto in = x.contiguous();
    auto all = at::empty({size * in.numel()}, in.options());
    comm.all_gather(all, in.view(-1), what).wait();
    auto by_rank = rest;
    by_rank.insert(by_rank.begin(), {size, B, P});
    auto whole = rest;
    whole.insert(whole.begin(), {B, size * P});
    return all.view(by_rank).movedim(0, 1).reshape(whole).narrow(1, 0, length).contiguous();
  }
  auto by_rank = rest;
  by_rank.insert(by_rank.begin(), {B, size, P});
  const auto in = padded(x, length, size).reshape(by_rank).movedim(1, 0).contiguous();
  auto out = at::empty(part_sizes, x.options());
  comm.reduce_scatter_sum(out, in.view(-1), what).wait();
  return out;
}

/// An autograd function of two sequence moves, forward and backward; inputs: the activation, the group (by address)
/// and the rows' length.
template <SequenceOp Forward, SequenceOp Backward>
struct SequenceFunction : public torch::autograd::Function<SequenceFunction<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t length) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["length"] = length;
    return sequence_op(Forward, x, length, *reinterpret_cast<Communicator*>(comm), "sequence parallel: activations");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {sequence_op(Backward, grad[0], ctx->saved_data["length"].toInt(), *comm_of(ctx),
                        "sequence parallel: gradients"),
            at::Tensor(), at::Tensor()};
  }
};

/// (..., in) x w: w (out, in) when output_dim is 0, Conv1D's (in, out) when 1; plus b when defined.
at::Tensor apply_weight(const at::Tensor& in, const at::Tensor& w, const at::Tensor& b, int64_t output_dim) {
  if (output_dim == 0) return at::linear(in, w, b);
  auto out_shape = in.sizes().vec();
  out_shape.back() = w.size(1);
  const auto flat = in.reshape({-1, in.size(-1)});
  return (b.defined() ? at::addmm(b, flat, w) : at::mm(flat, w)).view(out_shape);
}

/// models::TensorParallelGroup::gathered_linear's function. Inputs: this rank's positions x, their gather `whole`
/// (made by the caller, so layers reading the same input share it; not saved), the weight and bias (empty for
/// none), the group (by address), the rows' length and the weight's output dimension.
struct GatheredLinearFunction : public torch::autograd::Function<GatheredLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& whole, const at::Tensor& w,
                            const at::Tensor& b, int64_t comm, int64_t length, int64_t output_dim) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["length"] = length;
    ctx->saved_data["output_dim"] = output_dim;
    const bool bias = b.numel() > 0;  // an empty tensor for none: a function's inputs must be defined
    ctx->saved_data["bias"] = bias;
    return apply_weight(whole, w, bias ? b : at::Tensor(), output_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    auto& comm = *comm_of(ctx);
    const int64_t length = ctx->saved_data["length"].toInt();
    const bool out_first = ctx->saved_data["output_dim"].toInt() == 0;
    const auto whole = sequence_op(kGather, x, length, comm, "sequence parallel: a column-parallel input, again");
    const auto g = grad[0].contiguous();
    const auto g2 = g.view({-1, g.size(-1)}), h2 = whole.reshape({-1, whole.size(-1)});
    const auto gw = out_first ? g2.t().mm(h2) : h2.t().mm(g2);
    const auto gin = at::matmul(g, out_first ? w : w.t());
    const auto gb = ctx->saved_data["bias"].toBool() ? g2.sum(0) : at::Tensor();
    return {sequence_op(kReduceScatter, gin, length, comm, "sequence parallel: a column-parallel input's gradient"),
            at::Tensor(),
            gw,
            gb,
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

/// Per row of z (n, V / size): float32 logits of this rank's vocabulary columns, the log of the sum of
/// exponentials over every rank's columns and the target's logit (0 on the ranks that do not hold it), through one
/// all-gather (the rows' maxima) and one all-reduce over `comm` (Megatron's vocab-parallel cross entropy).
struct VocabRows {
  at::Tensor lse, target_logit, index, here, valid;
};
VocabRows vocab_rows(const at::Tensor& z, const at::Tensor& targets, Communicator& comm, int64_t ignore_index) {
  const int64_t n = z.size(0), width = z.size(1), tp = comm.world_size();
  // The row max over every rank's columns: an all-gather of each rank's (all-reduce has no max here).
  const auto mine = std::get<0>(z.max(1)).contiguous();
  auto all = at::empty({tp * n}, mine.options());
  comm.all_gather(all, mine, "vocab-parallel cross entropy: row maxima").wait();
  const auto m = std::get<0>(all.view({tp, n}).max(0));
  const auto local = targets - comm.rank() * width;
  VocabRows r;
  r.valid = targets != ignore_index;
  r.here = (local >= 0) & (local < width) & r.valid;
  r.index = at::where(r.here, local, at::zeros_like(local)).unsqueeze(1);
  const auto target_logit = z.gather(1, r.index).squeeze(1) * r.here.to(at::kFloat);
  auto sums = at::stack({(z - m.unsqueeze(1)).exp().sum(1), target_logit}).contiguous();  // one all-reduce for both
  comm.all_reduce_sum(sums, "vocab-parallel cross entropy: sums of exponentials and target logits");
  r.lse = sums[0].log() + m;
  r.target_logit = sums[1];
  return r;
}

/// The cross entropy's gradient with respect to this rank's logits z: softmax over every rank's columns (from the
/// rows' lse) minus the target's one-hot where this rank holds it, times `scale` per row (0 for ignored rows).
at::Tensor vocab_rows_gradient(const at::Tensor& z, const VocabRows& r, const at::Tensor& scale) {
  auto g = (z - r.lse.unsqueeze(1)).exp();
  g.scatter_add_(1, r.index, -r.here.to(at::kFloat).unsqueeze(1));
  return g.mul_((scale * r.valid.to(at::kFloat)).unsqueeze(1));
}

/// vocab_parallel_cross_entropy's function: inputs the logits' shard, the targets, the group and ignore_index.
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, int64_t handle,
                            int64_t ignore_index) {
    const auto z = logits.to(at::kFloat);
    const auto r = vocab_rows(z, targets, *reinterpret_cast<Communicator*>(handle), ignore_index);
    ctx->save_for_backward({z, r.lse, r.index, r.here, r.valid});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return (r.lse - r.target_logit) * r.valid.to(at::kFloat);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    VocabRows r;
    r.lse = s[1], r.index = s[2], r.here = s[3], r.valid = s[4];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {vocab_rows_gradient(s[0], r, grad[0].to(at::kFloat)).to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// models::TensorParallelGroup::vocab_parallel_loss_sum's function. Inputs: the hidden states (N, C), this rank's
/// head rows and bias (empty for none), the targets, the group (by address), the rows per chunk and ignore_index.
/// Saves no logits: the backward recomputes each chunk's.
struct VocabParallelLossFunction : public torch::autograd::Function<VocabParallelLossFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& b,
                            const at::Tensor& targets, int64_t handle, int64_t chunk, int64_t ignore_index) {
    auto& comm = *reinterpret_cast<Communicator*>(handle);
    const int64_t n = h.size(0);
    auto total = at::zeros({}, h.options().dtype(at::kFloat));
    for (int64_t row = 0; row < n; row += chunk) {
      const auto len = std::min(chunk, n - row);
      const auto z = at::linear(h.narrow(0, row, len), w, b.numel() ? b : at::Tensor()).to(at::kFloat);
      const auto r = vocab_rows(z, targets.narrow(0, row, len), comm, ignore_index);
      total += ((r.lse - r.target_logit) * r.valid.to(at::kFloat)).sum();
    }
    ctx->save_for_backward({h, w, b, targets});
    ctx->saved_data["comm"] = handle;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["ignore"] = ignore_index;
    return total;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const auto &h = s[0], &w = s[1], &b = s[2], &targets = s[3];
    auto& comm = *comm_of(ctx);
    const int64_t n = h.size(0), chunk = ctx->saved_data["chunk"].toInt(), ignore = ctx->saved_data["ignore"].toInt();
    const bool bias = b.numel() > 0;
    auto dh = at::empty_like(h);
    auto dw = at::zeros(w.sizes(), w.options().dtype(at::kFloat));
    auto db = at::zeros({w.size(0)}, dw.options());
    const auto scale = grad[0].to(at::kFloat);
    for (int64_t row = 0; row < n; row += chunk) {
      const auto len = std::min(chunk, n - row);
      const auto hc = h.narrow(0, row, len);
      const auto z = at::linear(hc, w, bias ? b : at::Tensor()).to(at::kFloat);
      // The forward's statistics again (the same collectives, in the same order on every rank of the group).
      const auto r = vocab_rows(z, targets.narrow(0, row, len), comm, ignore);
      const auto dz = vocab_rows_gradient(z, r, scale.expand({len}));
      dh.narrow(0, row, len).copy_(dz.to(w.scalar_type()).mm(w));
      dw.add_(dz.t().mm(hc.to(at::kFloat)));
      db.add_(dz.sum(0));
    }
    // Every rank's columns depend on the whole hidden states: their gradient is the sum of the ranks' parts.
    comm.all_reduce_sum(dh, "vocab-parallel cross entropy: the hidden states' gradient");
    return {dh,           dw.to(w.scalar_type()), bias ? db.to(b.scalar_type()) : at::Tensor(),
            at::Tensor(), at::Tensor(),           at::Tensor(),
            at::Tensor()};
  }
};

/// (..., V / size) -> (..., V): every rank's columns in rank order; backward, this rank's columns.
at::Tensor gather_columns_of(const at::Tensor& x, Communicator& comm) {
  const auto in = x.contiguous();
  auto all = at::empty({comm.world_size() * in.numel()}, in.options());
  comm.all_gather(all, in.view(-1), "vocab parallel: logits").wait();
  auto sizes = in.sizes().vec();
  sizes.insert(sizes.begin(), comm.world_size());
  return at::cat(all.view(sizes).unbind(0), -1);
}
struct ColumnsFunction : public torch::autograd::Function<ColumnsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t handle) {
    ctx->saved_data["comm"] = handle;
    ctx->saved_data["width"] = x.size(-1);
    return gather_columns_of(x, *reinterpret_cast<Communicator*>(handle));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t width = ctx->saved_data["width"].toInt();
    return {grad[0].narrow(-1, comm_of(ctx)->rank() * width, width).contiguous(), at::Tensor()};
  }
};

class Group final : public models::TensorParallelGroup {
 public:
  explicit Group(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int64_t size() const override { return comm_->world_size(); }
  int64_t rank() const override { return comm_->rank(); }
  at::Tensor enter(const at::Tensor& x) const override {
    if (auto* scope = models::SequenceScope::current()) {
      if (grad(x)) return SequenceFunction<kGather, kReduceScatter>::apply(x, handle(), scope->length());
      return sequence_op(kGather, x, scope->length(), *comm_, "sequence parallel: activations");
    }
    return grad(x) ? EnterFunction::apply(x, handle()) : x;
  }
  at::Tensor reduce(const at::Tensor& y) const override {
    if (auto* scope = models::SequenceScope::current()) {
      if (grad(y)) return SequenceFunction<kReduceScatter, kGather>::apply(y, handle(), scope->length());
      return sequence_op(kReduceScatter, y, scope->length(), *comm_, "sequence parallel: a row-parallel output");
    }
    if (grad(y)) return ReduceFunction::apply(y, handle());
    return summed(y, *comm_, "tensor parallel: a row-parallel layer's output");
  }
  at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                             int64_t output_dim) const override {
    auto* scope = models::SequenceScope::current();
    TORCH_CHECK(scope, "gathered_linear: outside a sequence-parallel scope");
    auto whole = scope->remembered(x);
    if (!whole.defined()) {
      whole = sequence_op(kGather, x.detach(), scope->length(), *comm_, "sequence parallel: a column-parallel input");
      scope->remember(x, whole);
    }
    if (!at::GradMode::is_enabled() || !(x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad())))
      return apply_weight(whole, w, b, output_dim);
    return GatheredLinearFunction::apply(x, whole, w, b.defined() ? b : at::empty({0}, w.options()), handle(),
                                         scope->length(), output_dim);
  }
  at::Tensor gather_columns(const at::Tensor& x) const override {
    return grad(x) ? ColumnsFunction::apply(x, handle()) : gather_columns_of(x, *comm_);
  }
  at::Tensor vocab_parallel_loss_sum(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b,
                                     const at::Tensor& targets, int64_t chunk, int64_t ignore_index) const override {
    TORCH_CHECK(h.dim() == 2 && targets.dim() == 1 && targets.size(0) == h.size(0),
                "vocab_parallel_loss_sum: hidden states (N, C) and targets (N), got ", h.sizes(), " and ",
                targets.sizes());
    return VocabParallelLossFunction::apply(h, w, b.defined() ? b : at::empty({0}, w.options()), targets, handle(),
                                            chunk > 0 ? chunk : std::max<int64_t>(h.size(0), 1), ignore_index);
  }
  at::Tensor sum_gradient(const at::Tensor& w) const override {
    return grad(w) ? EnterFunction::apply(w, handle()) : w;
  }
  at::Tensor scatter_sequence(const at::Tensor& x, int64_t length) const override {
    if (grad(x)) return SequenceFunction<kKeepMine, kGather>::apply(x, handle(), length);
    return sequence_op(kKeepMine, x, length, *comm_, "");
  }
  at::Tensor gather_sequence(const at::Tensor& x, int64_t length) const override {
    if (grad(x)) return SequenceFunction<kGather, kKeepMine>::apply(x, handle(), length);
    return sequence_op(kGather, x, length, *comm_, "sequence parallel: the blocks' output");
  }

 private:
  int64_t handle() const { return reinterpret_cast<int64_t>(comm_.get()); }
  static bool grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }
  std::shared_ptr<Communicator> comm_;
};

std::vector<int64_t> parts_of(const ParallelShard& cut, int64_t whole) {
  return cut.parts.empty() ? std::vector<int64_t>{whole} : cut.parts;
}

/// The refusal of `key` for a model whose config has dropout (hf_config's *dropout*, *pdrop keys).
void refuse_dropout(const nlohmann::json& c, const std::string& key) {
  for (const auto& [k, v] : c.items())
    if ((k.find("dropout") != std::string::npos || k.find("pdrop") != std::string::npos) && v.is_number() &&
        v.get<double>() > 0)
      throw ConfigError(concat(key, ": tensor parallelism with dropout (the model's ", k, " is ", v.get<double>(),
                               ") is not supported yet: the ranks of a group would draw different masks; set "
                               "model.dropout: 0"));
}

/// A parameter's whole values: its own, or for one built without storage (models/init.h) the model's source's, read
/// now, one parameter at a time: a rank of a model read rank by rank never holds more of the whole model than the
/// parameter it is cutting.
at::Tensor whole_values(const models::CausalLM& model, const std::string& name, const at::Tensor& p) {
  if (!models::is_deferred(p)) return p;
  TORCH_CHECK(model.parameter_source, "apply_tensor_parallel: ", name, " has no weights and the model no source");
  return model.parameter_source->read(name, 0, p.numel()).view(p.sizes()).to(p.device(), at::kFloat);
}

}  // namespace

at::Tensor share_of(const at::Tensor& whole, const ParallelShard& cut, int64_t rank, int64_t size) {
  std::vector<at::Tensor> pieces;
  int64_t at = 0;
  for (const auto part : parts_of(cut, whole.size(cut.dim))) {
    TORCH_CHECK(part % size == 0, "share_of: a part of ", part, " does not split over ", size, " ranks");
    pieces.push_back(whole.narrow(cut.dim, at + rank * (part / size), part / size));
    at += part;
  }
  TORCH_CHECK(at == whole.size(cut.dim), "share_of: parts of ", at, " for a dimension of ", whole.size(cut.dim));
  return at::cat(pieces, cut.dim).contiguous();
}

at::Tensor whole_from_shares(const std::vector<at::Tensor>& shares, const ParallelShard& cut) {
  TORCH_CHECK(!shares.empty(), "whole_from_shares: no shares");
  const auto size = static_cast<int64_t>(shares.size());
  const auto parts = parts_of(cut, shares[0].size(cut.dim) * size);
  std::vector<at::Tensor> pieces;
  int64_t at = 0;
  for (const auto part : parts) {
    for (const auto& s : shares) pieces.push_back(s.narrow(cut.dim, at, part / size));
    at += part / size;
  }
  return at::cat(pieces, cut.dim);
}

std::shared_ptr<models::TensorParallelGroup> tensor_parallel_group(std::shared_ptr<Communicator> comm) {
  return std::make_shared<Group>(std::move(comm));
}

namespace {

/// apply_tensor_parallel's sequence-parallel part, once the layers are cut: the blocks' norms sum their gradients
/// over the group; what would see a share of the positions without that is refused.
void install_sequence_parallel(models::CausalLM& model, const std::shared_ptr<models::TensorParallelGroup>& group,
                               const std::vector<std::string>& prefixes,
                               const std::map<std::string, ParallelShard>& cuts) {
  const char* key = "dist.sequence_parallel";
  if (model.num_experts() > 0)
    throw ConfigError(concat(key, ": sequence parallelism with a mixture-of-experts model (", model.family(), ", ",
                             model.num_experts(),
                             " experts: their routers and load-balancing statistics would see a share of the "
                             "positions) is not supported yet; set dist.sequence_parallel: false"));
  const auto in_block = [&](const std::string& name) {
    for (const auto& prefix : prefixes)
      if (name.rfind(prefix, 0) == 0) return true;
    return false;
  };
  std::map<std::string, torch::nn::Module*> modules;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    modules[item.key()] = item.value().get();
    if (!in_block(item.key())) continue;
    if (auto* norm = dynamic_cast<models::ParallelPartialGradient*>(item.value().get());
        norm && !norm->has_parallel_group())
      norm->set_parallel(group, /*sequence_only=*/true);
  }
  for (const auto& p : model.named_parameters()) {
    const auto& name = p.key();
    if (!in_block(name) || cuts.count(name)) continue;
    const auto dot = name.rfind('.');
    auto* owner = modules[name.substr(0, dot)];
    if (dynamic_cast<models::ParallelPartialGradient*>(owner)) continue;
    const auto* linear = dynamic_cast<models::ParallelLinear*>(owner);
    if (linear && linear->parallel_style() == models::ParallelStyle::kRow && name.substr(dot + 1) == "bias") continue;
    throw ConfigError(concat(key, ": ", name, " would see a share of the positions but is neither cut by the ",
                             model.family(),
                             " family's tensor-parallel plan nor a norm's or a row-parallel layer's "
                             "bias; sequence parallelism does not support it; set dist.sequence_parallel: false"));
  }
  model.sequence_parallel = group;
}

/// apply_tensor_parallel's vocabulary-parallel part: the input embedding's rows and an untied LM head's cut across
/// the group (rank t holds rows [t V / T, (t + 1) V / T)), the embedding looking up its own rows.
void install_vocab_parallel(models::CausalLM& model, const std::shared_ptr<models::TensorParallelGroup>& group,
                            int64_t rank, int64_t tp, std::map<std::string, ParallelShard>& cuts) {
  const char* key = "dist.vocab_parallel";
  const int64_t V = model.vocab_size();
  if (V % tp != 0)
    throw ConfigError(concat(key, ": ", tp, " ranks do not divide the vocabulary of ", V,
                             " tokens; choose a tensor-parallel size that divides it or set dist.vocab_parallel: "
                             "false"));
  const auto token = model.token_embedding_parameter();
  std::vector<std::string> names{token};
  for (const auto& n : model.lm_head_parameters()) names.push_back(n);
  auto params = model.named_parameters();
  const ParallelShard rows{0, {}};
  for (const auto& name : names) {
    auto* p = params.find(name);
    TORCH_CHECK(p != nullptr && p->dim() >= 1 && p->size(0) == V, "apply_tensor_parallel: no parameter ", name, " of ",
                V, " vocabulary rows");
    p->set_data(share_of(whole_values(model, name, *p), rows, rank, tp));
    cuts[name] = rows;
  }
  const auto module = token.substr(0, token.rfind('.'));
  models::layers::EmbeddingImpl* embedding = nullptr;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (item.key() == module) embedding = dynamic_cast<models::layers::EmbeddingImpl*>(item.value().get());
  if (embedding == nullptr)
    throw ConfigError(concat(key, ": the ", model.family(), " family's input embedding ", module,
                             " is not a layers::Embedding, which vocabulary parallelism splits"));
  embedding->set_vocab_parallel(group, rank * (V / tp));
  model.vocab_parallel = group;
}

}  // namespace

std::map<std::string, ParallelShard> apply_tensor_parallel(models::CausalLM& model, std::shared_ptr<Communicator> comm,
                                                           const std::string& key, bool sequence_parallel,
                                                           bool vocab_parallel) {
  std::map<std::string, ParallelShard> cuts;
  const int64_t tp = comm->world_size(), rank = comm->rank();
  if (tp == 1) return cuts;
  if (models::has_lora(model))
    throw ConfigError(concat(key, ": tensor parallelism with LoRA adapters is not supported yet"));
  refuse_dropout(model.hf_config(), key);
  const auto plan = models::tensor_parallel_plan(model);
  std::vector<std::string> prefixes;
  for (int64_t i = 0; i < model.num_layers(); ++i) prefixes.push_back(model.block_prefix(i) + ".");
  const auto group = tensor_parallel_group(comm);
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto& name = item.key();
    const models::ParallelRule* rule = nullptr;
    for (const auto& prefix : prefixes)
      if (name.rfind(prefix, 0) == 0)
        for (const auto& r : plan)
          if (name.substr(prefix.size()) == r.name) rule = &r;
    if (rule == nullptr) continue;  // whole on every rank (an expert)
    if (rule->style == models::ParallelStyle::kPartialGradient) {
      auto* norm = dynamic_cast<models::ParallelPartialGradient*>(item.value().get());
      TORCH_CHECK(norm != nullptr, "tensor parallel plan: ", name, " cannot sum its gradient over the group");
      norm->set_parallel(group);
      continue;
    }
    auto* layer = dynamic_cast<models::ParallelLinear*>(item.value().get());
    TORCH_CHECK(layer != nullptr, "tensor parallel plan: ", name, " is not a linear layer that splits");
    auto params = item.value()->named_parameters(/*recurse=*/false);
    auto& weight = params["weight"];
    const bool column = rule->style == models::ParallelStyle::kColumn;
    const int64_t dim = column ? layer->output_dim() : 1 - layer->output_dim();
    ParallelShard cut{dim, column ? rule->parts : std::vector<int64_t>{}};
    const auto parts = parts_of(cut, weight.size(dim));
    TORCH_CHECK(std::accumulate(parts.begin(), parts.end(), int64_t{0}) == weight.size(dim),
                "tensor parallel plan: ", name, "'s parts do not add up to its ", weight.size(dim), " features");
    for (const auto part : parts)
      if (part % (rule->granule * tp) != 0)
        throw ConfigError(concat(key, ": ", tp, " ranks do not divide the ", part / rule->granule, " ", rule->unit,
                                 " of ", name, parts.size() > 1 ? " (a fused part)" : "",
                                 "; choose a tensor-parallel size that divides them"));
    weight.set_data(share_of(whole_values(model, name + ".weight", weight), cut, rank, tp));
    cuts[name + ".weight"] = cut;
    if (column && params.contains("bias") && params["bias"].defined()) {
      auto& bias = params["bias"];
      const ParallelShard bias_cut{0, cut.parts};
      bias.set_data(share_of(whole_values(model, name + ".bias", bias), bias_cut, rank, tp));
      cuts[name + ".bias"] = bias_cut;
    }
    layer->set_parallel(group, rule->style);
  }
  if (sequence_parallel) install_sequence_parallel(model, group, prefixes, cuts);
  if (vocab_parallel) install_vocab_parallel(model, group, rank, tp, cuts);
  return cuts;
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        std::shared_ptr<Communicator> comm, int64_t ignore_index) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
              "vocab_parallel_cross_entropy: logits (N, V / tp) and targets (N), got ", logits.sizes(), " and ",
              targets.sizes());
  return VocabParallelCrossEntropy::apply(logits, targets, reinterpret_cast<int64_t>(comm.get()), ignore_index);
}

at::Tensor gather_whole(const at::Tensor& share, const ParallelShard& cut, Communicator& comm) {
  const auto n = comm.world_size();
  auto flat = share.contiguous();
  auto all = at::empty({n * flat.numel()}, flat.options());
  comm.all_gather(all, flat.view(-1), "tensor parallel: gather a parameter").wait();
  std::vector<at::Tensor> shares;
  for (int64_t r = 0; r < n; ++r) shares.push_back(all.narrow(0, r * flat.numel(), flat.numel()).view(flat.sizes()));
  return whole_from_shares(shares, cut);
}

}  // namespace anvil::distributed
