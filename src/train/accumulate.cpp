// The step's forwards and backwards over its micro-batches (accumulate_gradients), the sums they
// collect and their reduction over ranks: what every engine runs, apart from the loop.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "anvil/core/error.h"
#include "train/step_engine.h"
#include "core/test_hooks.h"

namespace anvil::train {

void add_sum(Sums& sums, const std::string& key, const at::Tensor& value) {
  auto v = value.detach().to(at::kDouble);
  auto [it, fresh] = sums.emplace(key, v);
  if (!fresh) it->second = it->second + v;
}

std::vector<double> sum_over_ranks(const RankContext& ranks, std::vector<double> head, Sums& sums) {
  if (!ranks.sum) return head;
  const size_t n = head.size();
  for (const auto& [key, t] : sums) head.push_back(t.item<double>());
  ranks.all_sum(head);
  size_t i = n;
  for (auto& [key, t] : sums) t = at::scalar_tensor(head[i++], at::kDouble);
  head.resize(n);
  return head;
}

StepStats accumulate_gradients(Objective& objective, models::CausalLM& model, const std::vector<Batch>& batches,
                               const AccumulateOptions& options) {
  StepStats s;
  for (const auto& b : batches) {
    s.num_targets += b.num_targets;
    s.num_tokens += b.num_tokens;
  }
  if (options.step_targets > 0) s.num_targets = options.step_targets;
  // No targets: an RL step whose every response was masked (ppo.mask_truncated_completions); its losses are
  // weighted 0 and it gives no gradient. Supervised data never gets here (samples without a target are dropped).
  const double scale = s.num_targets > 0 ? 1.0 / static_cast<double>(s.num_targets) : 0.0;
  // A device scale is rounded to the loss's type (float32, or float64) as a scalar factor would be.
  const auto scaled = [&](const at::Tensor& loss) {
    if (!options.scale.defined()) return loss * scale;
    return loss * options.scale.to(loss.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  };
  at::Tensor total;  // summed on the device: one host read per step, not per micro-batch
  // Mixture of experts: each micro-batch's load-balancing loss (transformers'), averaged over the
  // micro-batches and ranks of the step (their gradients are summed), with the model's weight.
  const double aux_weight = model.router_aux_loss_coef;
  const double aux_share = 1.0 / static_cast<double>(batches.size() * std::max<int64_t>(options.world, 1));
  at::Tensor aux_total;
  const int64_t oom_rows = test_hooks::oom_rows();
  for (size_t i = 0; i < batches.size(); ++i) {
    if (aux_weight > 0) model.begin_router_stats();
    auto loss = objective.loss_sum(model, batches[i], s.sums);
    if (oom_rows > 0 && !batches[i].tensors.empty() && batches[i].tensors.begin()->second.size(0) >= oom_rows)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "ANVIL_TEST_OOM_ROWS: a micro-batch of ",
                       batches[i].tensors.begin()->second.size(0), " rows (", oom_rows, " or more)");
    if (aux_weight > 0) {
      auto aux = model.take_aux_loss(aux_weight * aux_share);
      if (aux.defined()) {
        add_sum(s.sums, "moe/aux_loss", aux * aux_share);
        auto weighted = (aux * (aux_weight * aux_share)).to(at::kDouble);
        aux_total = aux_total.defined() ? aux_total + weighted : weighted;
      }
    }
    if (options.before_backward) options.before_backward(i + 1 == batches.size());
    scaled(loss).backward();
    if (options.after_backward) options.after_backward();
    auto detached = loss.detach().to(at::kDouble);
    total = total.defined() ? total + detached : detached;
  }
  const auto by = [&](const at::Tensor& t) { return options.scale.defined() ? t * options.scale : t * scale; };
  s.loss_tensor = total.defined() ? by(total) : at::zeros({}, at::kDouble);
  if (aux_total.defined()) s.loss_tensor = s.loss_tensor + aux_total.to(s.loss_tensor.device());
  if (options.read_loss) s.loss = s.loss_tensor.item<double>();
  return s;
}

}  // namespace anvil::train
