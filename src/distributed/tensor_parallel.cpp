#include "distributed/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"
#include "models/init.h"
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

/// vocab_parallel_cross_entropy's function: inputs the logits' shard, the targets, the group and ignore_index.
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, int64_t handle,
                            int64_t ignore_index) {
    auto& comm = *reinterpret_cast<Communicator*>(handle);
    const int64_t n = logits.size(0), width = logits.size(1), tp = comm.world_size();
    const auto z = logits.to(at::kFloat);
    // The row max over every rank's columns: an all-gather of each rank's (all-reduce has no max here).
    const auto mine = std::get<0>(z.max(1)).contiguous();
    auto all = at::empty({tp * n}, mine.options());
    comm.all_gather(all, mine, "vocab-parallel cross entropy: row maxima").wait();
    const auto m = std::get<0>(all.view({tp, n}).max(0));
    const auto e = (z - m.unsqueeze(1)).exp();
    const auto local = targets - comm.rank() * width;
    const auto valid = targets != ignore_index;
    const auto here = (local >= 0) & (local < width) & valid;
    const auto index = at::where(here, local, at::zeros_like(local)).unsqueeze(1);
    const auto target_logit = z.gather(1, index).squeeze(1) * here.to(at::kFloat);
    auto sums = at::stack({e.sum(1), target_logit}).contiguous();  // (2, N): one all-reduce for both
    comm.all_reduce_sum(sums, "vocab-parallel cross entropy: sums of exponentials and target logits");
    const auto loss = (sums[0].log() + m - sums[1]) * valid.to(at::kFloat);
    ctx->save_for_backward({e / sums[0].unsqueeze(1), index, here, valid});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    auto g = saved[0].clone();  // softmax over this rank's columns
    g.scatter_add_(1, saved[1], -saved[2].to(at::kFloat).unsqueeze(1));
    g.mul_((grad[0].to(at::kFloat) * saved[3].to(at::kFloat)).unsqueeze(1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class Group final : public models::TensorParallelGroup {
 public:
  explicit Group(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int64_t size() const override { return comm_->world_size(); }
  int64_t rank() const override { return comm_->rank(); }
  at::Tensor enter(const at::Tensor& x) const override {
    return at::GradMode::is_enabled() && x.requires_grad() ? EnterFunction::apply(x, handle()) : x;
  }
  at::Tensor reduce(const at::Tensor& y) const override {
    if (at::GradMode::is_enabled() && y.requires_grad()) return ReduceFunction::apply(y, handle());
    return summed(y, *comm_, "tensor parallel: a row-parallel layer's output");
  }

 private:
  int64_t handle() const { return reinterpret_cast<int64_t>(comm_.get()); }
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

std::map<std::string, ParallelShard> apply_tensor_parallel(models::CausalLM& model, std::shared_ptr<Communicator> comm,
                                                           const std::string& key) {
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
    TORCH_CHECK(!models::is_deferred(weight), "apply_tensor_parallel: ", name, " has no weights yet");
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
    weight.set_data(share_of(weight, cut, rank, tp));
    cuts[name + ".weight"] = cut;
    if (column && params.contains("bias") && params["bias"].defined()) {
      auto& bias = params["bias"];
      const ParallelShard bias_cut{0, cut.parts};
      bias.set_data(share_of(bias, bias_cut, rank, tp));
      cuts[name + ".bias"] = bias_cut;
    }
    layer->set_parallel(group, rule->style);
  }
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
