// Sparse mixture-of-experts MLP and the load-balancing loss (transformers'
// MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock and load_balancing_loss_func).
#include "models/moe.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace anvil::models {

at::Tensor CausalLM::take_aux_loss(double weight) {
  auto st = std::move(router_stats_);
  router_stats_.reset();
  if (!st || st->counts.empty() || !st->rows.defined()) return {};
  st->open = false;
  auto counts = st->counts.front(), probs = st->probs.front();
  for (size_t i = 1; i < st->counts.size(); ++i) counts = counts + st->counts[i], probs = probs + st->probs[i];
  const double experts = static_cast<double>(counts.size(0));
  // aux = E * sum_e (C_e / rows) (P_e / rows), with C (top-k choices) constant;
  // d aux / d P_e = E C_e / rows^2 for the probability sums of every layer.
  // rows stays on the device (a masked count): no host read. A batch of
  // padding alone counts nothing and gives 0, not 0 / 0.
  const auto scale = experts / st->rows.clamp_min(1).square();
  st->grad = counts * (scale * weight);
  return (counts * probs).sum() * scale;
}

namespace moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct StatsHolder : torch::CustomClassHolder {
  std::shared_ptr<RouterStats> stats;
};

/// The identity on the layer's output; in backward it also hands the summed
/// router probabilities the load-balancing loss's gradient (RouterStats::grad,
/// set once the whole forward is known), as Megatron's MoEAuxLossAutoScaler
/// attaches the loss to the activations. The loss then back-propagates
/// wherever the layer's output does, a checkpointed block's recompute
/// included.
struct RouteAuxGrad : public torch::autograd::Function<RouteAuxGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& out, const at::Tensor& prob_sum,
                            c10::intrusive_ptr<StatsHolder> holder) {
    ctx->saved_data["stats"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["experts"] = prob_sum.size(0);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<StatsHolder>(ctx->saved_data["stats"].toCapsule());
    const auto& g = holder->stats->grad;
    auto prob_grad = g.defined()
                         ? g.to(grads[0].device(), at::kFloat)
                         : at::zeros({ctx->saved_data["experts"].toInt()}, grads[0].options().dtype(at::kFloat));
    return {grads[0], prob_grad, at::Tensor()};
  }
};

layers::Linear linear(int64_t in, int64_t out) { return layers::Linear(torch::nn::LinearOptions(in, out).bias(false)); }

}  // namespace

ExpertImpl::ExpertImpl(const MoeOptions& o) : act(o.act()) {
  const bool mixtral = o.expert_names() == "w1_w2_w3";
  gate = register_module(mixtral ? "w1" : "gate_proj", linear(o.hidden_size(), o.intermediate_size()));
  down = register_module(mixtral ? "w2" : "down_proj", linear(o.intermediate_size(), o.hidden_size()));
  up = register_module(mixtral ? "w3" : "up_proj", linear(o.hidden_size(), o.intermediate_size()));
}

at::Tensor ExpertImpl::forward(const at::Tensor& x) {
  auto g = gate(x);  // before up, as HF
  return down(layers::gated_activation(g, up(x), act));
}

SparseMoeBlockImpl::SparseMoeBlockImpl(const MoeOptions& o) : options(o) {
  TORCH_CHECK(o.top_k() >= 1 && o.top_k() <= o.num_experts(), "num_experts_per_tok must be in [1, num_experts]");
  gate = register_module("gate", layers::Dense(torch::nn::LinearOptions(o.hidden_size(), o.num_experts()).bias(false)));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < o.num_experts(); ++e) experts->push_back(Expert(o));
}

at::Tensor SparseMoeBlockImpl::forward(const at::Tensor& input, const ForwardArgs& args) {
  auto x = input;
  const double jitter = options.jitter_noise();
  if (is_training() && jitter > 0) x = x * at::empty_like(x).uniform_(1.0 - jitter, 1.0 + jitter);
  const auto C = x.size(-1);
  auto flat = x.reshape({-1, C});
  auto logits = gate(flat);                          // (N, E)
  auto probs = at::softmax(logits, -1, at::kFloat);  // float32, as transformers
  auto [top, index] = at::topk(probs, options.top_k(), -1);
  if (options.norm_topk_prob()) top = top / top.sum(-1, /*keepdim=*/true);
  const auto weights = top.to(x.scalar_type());

  bool adapters = false;
  for (const auto& e : *experts) {
    auto* ex = e->as<Expert>();
    adapters = adapters || ex->gate->has_adapter() || ex->up->has_adapter() || ex->down->has_adapter();
  }
  const bool grouped =
      compute == ExpertCompute::kGrouped || (compute == ExpertCompute::kAuto && x.is_cuda() && !adapters);
  auto out = (grouped && !adapters ? grouped_experts(flat, index, weights) : loop_experts(flat, index, weights))
                 .view(input.sizes());

  if (args.router) {
    auto& st = *args.router;
    // Padding (args.token_mask false) counts neither as a choice nor as probability mass.
    at::Tensor keep;
    if (args.token_mask.defined()) {
      TORCH_CHECK(args.token_mask.numel() == flat.size(0), "SparseMoeBlock: token_mask has ", args.token_mask.numel(),
                  " entries for ", flat.size(0), " tokens");
      keep = args.token_mask.reshape({-1, 1}).to(probs.device(), probs.scalar_type());  // (N, 1)
    }
    const auto prob_sum = (keep.defined() ? probs * keep : probs).sum(0);  // (E)
    if (st.open) {
      at::NoGradGuard no_grad;
      auto counts = at::zeros({options.num_experts()}, probs.options());
      const auto ones = keep.defined() ? keep.expand({flat.size(0), index.size(1)}).reshape(-1)
                                       : at::ones({index.numel()}, probs.options());
      counts.scatter_add_(0, index.reshape(-1), ones);
      st.counts.push_back(counts);
      st.probs.push_back(prob_sum.detach());
      const auto rows = keep.defined() ? keep.sum() : at::full({}, static_cast<double>(flat.size(0)), probs.options());
      st.rows = st.rows.defined() ? st.rows + rows : rows;
    }
    if (prob_sum.requires_grad()) {
      auto holder = c10::make_intrusive<StatsHolder>();
      holder->stats = args.router;
      out = RouteAuxGrad::apply(out, prob_sum, holder);
    }
  }
  return out;
}

at::Tensor SparseMoeBlockImpl::loop_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weights) {
  // As transformers' eager experts: each expert over the tokens that chose it,
  // weighted and added into the output.
  auto out = at::zeros_like(x);
  const auto k = index.size(1);
  auto flat_index = index.reshape(-1);
  // One host read for which experts have tokens at all.
  const auto hit = at::bincount(flat_index, {}, options.num_experts()).cpu();
  const auto* count = hit.data_ptr<int64_t>();
  for (int64_t e = 0; e < options.num_experts(); ++e) {
    if (count[e] == 0) continue;
    const auto slots = (flat_index == e).nonzero().squeeze(-1);  // positions in (N * k)
    const auto tokens = at::floor_divide(slots, k);
    auto y = experts[e]->as<Expert>()->forward(x.index_select(0, tokens));
    y = y * weights.reshape(-1).index_select(0, slots).unsqueeze(-1);
    out = out.index_add(0, tokens, y.to(out.scalar_type()));
  }
  return out;
}

at::Tensor SparseMoeBlockImpl::grouped_experts(const at::Tensor& x, const at::Tensor& index,
                                               const at::Tensor& weights) {
  // Tokens sorted by expert, every expert's rows one group of at::_grouped_mm.
  const auto k = index.size(1);
  const auto E = options.num_experts();
  auto flat_index = index.reshape(-1);
  auto order = at::argsort(flat_index, /*stable=*/true);
  auto tokens = at::floor_divide(order, k);
  auto rows = x.index_select(0, tokens);  // (N * k, C)
  auto offsets = at::cumsum(at::bincount(flat_index, {}, E), 0).to(at::kInt);
  std::vector<at::Tensor> gates, ups, downs;
  for (const auto& m : *experts) {
    auto* ex = m->as<Expert>();
    gates.push_back(ex->gate->weight);
    ups.push_back(ex->up->weight);
    downs.push_back(ex->down->weight);
  }
  // Weights (E, out, in) used as (E, in, out): the transposed layout _grouped_mm reads.
  auto g = at::_grouped_mm(rows, at::stack(gates).transpose(1, 2), offsets);
  auto u = at::_grouped_mm(rows, at::stack(ups).transpose(1, 2), offsets);
  auto h = layers::gated_activation(g, u, options.act());
  auto y = at::_grouped_mm(h, at::stack(downs).transpose(1, 2), offsets);
  y = y * weights.reshape(-1).index_select(0, order).unsqueeze(-1);
  return at::zeros_like(x).index_add(0, tokens, y.to(x.scalar_type()));
}

}  // namespace moe
}  // namespace anvil::models
