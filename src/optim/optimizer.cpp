#include "optim/optimizer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cctype>
#include <optional>
#include <regex>

namespace anvil::optim {

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  count_step(launch(at::Tensor()));
  return loss;
}

FusedAdamW::Queued FusedAdamW::queue_step(const at::Tensor& lr, const at::Tensor& skip) {
  TORCH_CHECK(lr.dim() == 0 && lr.scalar_type() == at::kFloat, "FusedAdamW: lr must be a 0-dim float32 tensor");
  skip_next_if(skip);
  at::NoGradGuard no_grad;
  return launch(lr);
}

FusedAdamW::Queued FusedAdamW::launch(const at::Tensor& lr) {
  Queued q;
  q.skippable = skip_.defined();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, advance;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      TORCH_CHECK(params.empty() || (p.device() == params[0].device() && p.scalar_type() == params[0].scalar_type()),
                  "FusedAdamW needs one device and dtype per parameter group");
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) st->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
      // The kernel reads the step count (this step's) from a float tensor beside the parameter: one kept
      // there and advanced below, or made from the host's count when that moved otherwise (a loaded checkpoint).
      auto& d = device_steps_[p.unsafeGetTensorImpl()];
      if (d.value.defined() && d.count == st.step()) {
        advance.push_back(d.value);
      } else {
        d.value = at::full({}, static_cast<double>(st.step() + 1), p.options().dtype(at::kFloat));
        d.count = -1;  // until count_step()
        q.counters_rebuilt = true;
      }
      steps.push_back(d.value);
      q.keys.push_back(p.unsafeGetTensorImpl());
    }
    if (params.empty()) continue;
    if (!advance.empty()) at::_foreach_add_(advance, 1);
    const auto found_inf = skip_.defined() ? std::optional<at::Tensor>(skip_) : std::nullopt;
    if (lr.defined())
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, std::get<0>(o.betas()),
                        std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false,
                        /*grad_scale=*/std::nullopt, found_inf);
    else
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, o.lr(), std::get<0>(o.betas()),
                        std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false,
                        /*grad_scale=*/std::nullopt, found_inf);
    // A skipped step takes its count back on the device (torch's _fused_adamw does the same after the
    // kernel), and on the host once take_back() is told.
    if (skip_.defined()) at::_foreach_add_(steps, skip_, -1);
  }
  return q;
}

int64_t FusedAdamW::count_step(const Queued& q) {
  for (const void* key : q.keys) {
    auto& st = static_cast<torch::optim::AdamWParamState&>(*state().at(const_cast<void*>(key)));
    st.step(st.step() + 1);
    device_steps_[key].count = st.step();
  }
  ++calls_;
  if (q.skippable) stepped_[calls_] = q.keys;
  skip_ = at::Tensor();
  while (stepped_.size() > 4) stepped_.erase(stepped_.begin());
  return calls_;
}

int64_t FusedAdamW::skip_next_if(const at::Tensor& skip) {
  TORCH_CHECK(skip.dim() == 0 && skip.scalar_type() == at::kFloat, "FusedAdamW: skip must be a 0-dim float32 tensor");
  skip_ = skip;
  return calls_ + 1;
}

void FusedAdamW::take_back(int64_t call) {
  const auto it = stepped_.find(call);
  TORCH_CHECK(it != stepped_.end(), "FusedAdamW: step ", call, " is not among the last steps taken with skip_next_if");
  for (const void* key : it->second) {
    auto& st = static_cast<torch::optim::AdamWParamState&>(*state().at(const_cast<void*>(key)));
    st.step(st.step() - 1);
    if (auto d = device_steps_.find(key); d != device_steps_.end() && d->second.count >= 0) --d->second.count;
  }
  stepped_.erase(it);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params) {
  return make_optimizer(c, params, {});
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& decayed,
                                                        const std::vector<at::Tensor>& not_decayed) {
  torch::optim::AdamWOptions o(c.lr);
  o.betas({c.betas.at(0), c.betas.at(1)}).eps(c.eps).weight_decay(c.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty() || not_decayed.empty()) groups.emplace_back(decayed);
  if (!not_decayed.empty()) {
    auto none = std::make_unique<torch::optim::AdamWOptions>(o);
    none->weight_decay(0);
    groups.emplace_back(not_decayed, std::move(none));
  }
  if (c.fused) return std::make_unique<FusedAdamW>(groups, o);
  return std::make_unique<torch::optim::AdamW>(groups, o);
}

bool decays(const config::OptimizerConfig& c, const std::string& name, const torch::nn::Module& owner) {
  if (c.decay_biases_and_norms) return true;
  // A LayerNorm module (LibTorch's, or models::layers::LayerNorm) whatever its name in the model (GPT-2's ln_1).
  if (owner.name().find("LayerNorm") != std::string::npos) return false;
  std::string lower = name;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::regex exempt(R"(bias|layernorm|rmsnorm|(^|\.)norm($|\.)|_norm($|\.))");
  return !std::regex_search(lower, exempt);
}

std::vector<std::string> no_decay_parameters(const config::OptimizerConfig& c, const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& m : model.named_modules())
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      const auto name = m.key().empty() ? p.key() : m.key() + "." + p.key();
      if (!decays(c, name, *m.value())) out.push_back(name);
    }
  return out;
}

at::Tensor clip_or_measure(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({}, params.front().options().dtype(at::kDouble));
  const auto norms = at::_foreach_norm(grads, 2);
  std::vector<at::Tensor> flat;
  flat.reserve(norms.size());
  // Measured in the gradients' dtype as torch does when clipping; in double when only measured.
  const auto acc = max_norm > 0 ? grads.front().scalar_type() : at::kDouble;
  for (const auto& n : norms) flat.push_back(n.to(acc));
  const auto total = at::linalg_vector_norm(at::stack(flat), 2);
  if (max_norm > 0) {
    const auto coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
    at::_foreach_mul_(grads, coef);
  }
  return total.to(at::kDouble);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

torch::optim::AdamWParamState* adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  return it == optimizer.state().end() ? nullptr : dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
}

}  // namespace anvil::optim
