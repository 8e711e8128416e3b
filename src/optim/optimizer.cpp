#include "optim/optimizer.h"

#include "optim/low_precision_adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cctype>
#include <cmath>
#include <limits>
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

void FusedAdamW::set_state_dtype(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "FusedAdamW: state dtype must be float32 or bfloat16");
  state_dtype_ = dtype;
}

FusedAdamW::Queued FusedAdamW::launch(const at::Tensor& lr) {
  Queued q;
  q.skippable = skip_.defined();
  // Parameters whose moments are kept in a lower precision step apart (adamw_step_low_precision_state); a
  // skip flag is read on the host for them (one wait per step).
  std::optional<bool> skipped;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, advance;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      TORCH_CHECK(params.empty() || (p.device() == params[0].device() && p.scalar_type() == params[0].scalar_type()),
                  "FusedAdamW needs one device and dtype per parameter group");
      const auto dtype = moment_dtype(p);
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        const auto zeros = [&] { return at::zeros_like(p, p.options().dtype(dtype), at::MemoryFormat::Preserve); };
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->exp_avg(zeros());
        st->exp_avg_sq(zeros());
        if (o.amsgrad()) st->max_exp_avg_sq(zeros());
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      if (st.exp_avg().scalar_type() != dtype) {  // read from a checkpoint written with the other state dtype
        st.exp_avg(st.exp_avg().to(dtype));
        st.exp_avg_sq(st.exp_avg_sq().to(dtype));
      }
      if (dtype != p.scalar_type()) {
        TORCH_CHECK(!lr.defined(), "FusedAdamW: graph steps need float32 moments (optimizer.state_dtype float32)");
        TORCH_CHECK(!o.amsgrad(), "FusedAdamW: amsgrad needs float32 moments");
        if (!skipped) skipped = skip_.defined() && skip_.item<float>() != 0;
        if (!*skipped)
          adamw_step_low_precision_state(p, p.grad(), st.exp_avg(), st.exp_avg_sq(), st.step() + 1, o.lr(),
                                         std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps());
        q.keys.push_back(p.unsafeGetTensorImpl());
        continue;
      }
      if (st.exp_avg().scalar_type() != p.scalar_type()) {
        st.exp_avg(st.exp_avg().to(p.scalar_type()));
        st.exp_avg_sq(st.exp_avg_sq().to(p.scalar_type()));
      }
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

namespace {

/// `value` (contiguous float32) into `dst` (bfloat16), rounded up where the dropped 16 bits plus `noise` (16
/// random bits in an int32 tensor, consumed) carry: bfloat16 is float32's upper half, so the magnitude rounds up
/// with probability (dropped bits) / 2^16 and the stored value's expectation is the float32 value.
void store_rounded_with(const at::Tensor& dst, const at::Tensor& value, at::Tensor noise) {
  noise.add_(value.view(at::kInt)).bitwise_and_(static_cast<int32_t>(0xFFFF0000u));
  dst.copy_(noise.view(at::kFloat).view(dst.sizes()));  // exact: the low bits are zero
}

}  // namespace

void store_stochastically_rounded(const at::Tensor& dst, const at::Tensor& value) {
  TORCH_CHECK(dst.scalar_type() == at::kBFloat16 && value.scalar_type() == at::kFloat && value.is_contiguous() &&
                  dst.numel() == value.numel(),
              "store_stochastically_rounded: expected a bfloat16 destination and contiguous float32 values");
  store_rounded_with(dst, value, at::randint(0, 1 << 16, value.sizes(), value.options().dtype(at::kInt)));
}

namespace {

void check_low_precision_state(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg,
                               const at::Tensor& exp_avg_sq, int64_t step) {
  TORCH_CHECK(p.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat && p.is_contiguous() &&
                  grad.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() &&
                  exp_avg.scalar_type() == at::kBFloat16 && exp_avg_sq.scalar_type() == at::kBFloat16 &&
                  grad.numel() == p.numel() && exp_avg.numel() == p.numel() && exp_avg_sq.numel() == p.numel(),
              "adamw_step_low_precision_state: expected contiguous float32 parameters and gradients, bfloat16 "
              "moments, all of one size");
  TORCH_CHECK(step >= 1, "adamw_step_low_precision_state: step numbers start at 1");
}

}  // namespace

void adamw_step_low_precision_state(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg,
                                    const at::Tensor& exp_avg_sq, int64_t step, double lr, double beta1, double beta2,
                                    double weight_decay, double eps) {
  check_low_precision_state(p, grad, exp_avg, exp_avg_sq, step);
  if (!p.device().is_cpu())
    return adamw_step_low_precision_state_by_tensor_ops(p, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2,
                                                        weight_decay, eps);
  // One pass per element, in float32 as torch's fused CPU kernel computes it. The rounding's random bits hash
  // the element's index with one 64-bit draw of the default generator per call.
  const auto draw =
      static_cast<uint64_t>(at::randint(std::numeric_limits<int64_t>::max(), {1}, at::kLong).item<int64_t>());
  const auto seed_lo = static_cast<uint32_t>(draw), seed_hi = static_cast<uint32_t>(draw >> 32);
  const float decay = static_cast<float>(lr * weight_decay);
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2), eps_f = static_cast<float>(eps);
  const float step_size = static_cast<float>(lr / (1 - std::pow(beta1, static_cast<double>(step))));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(beta2, static_cast<double>(step))));
  const LowPrecisionAdamW kernel{decay, b1, b2, eps_f, step_size, bias_correction2_sqrt, seed_lo, seed_hi};
  float* pp = p.data_ptr<float>();
  const float* gp = grad.data_ptr<float>();
  auto* mp = reinterpret_cast<uint16_t*>(exp_avg.data_ptr<c10::BFloat16>());
  auto* vp = reinterpret_cast<uint16_t*>(exp_avg_sq.data_ptr<c10::BFloat16>());
  const int64_t n = p.numel();
  at::parallel_for(0, n, int64_t{1} << 14,
                   [&](int64_t first, int64_t last) { kernel.run(pp, gp, mp, vp, first, last); });
}

void adamw_step_low_precision_state_by_tensor_ops(const at::Tensor& p, const at::Tensor& grad,
                                                  const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t step,
                                                  double lr, double beta1, double beta2, double weight_decay,
                                                  double eps) {
  check_low_precision_state(p, grad, exp_avg, exp_avg_sq, step);
  at::NoGradGuard no_grad;
  // The update is torch's fused AdamW kernel itself, run on float32 copies of a chunk's moments.
  const auto steps = at::full({}, static_cast<double>(step), p.options());
  const auto pf = p.view(-1), gf = grad.view(-1), mf = exp_avg.view(-1), vf = exp_avg_sq.view(-1);
  constexpr int64_t kChunk = int64_t{1} << 20;  // the working copies: about 20 bytes per element of a chunk
  for (int64_t i = 0, n = pf.numel(); i < n; i += kChunk) {
    const int64_t k = std::min(kChunk, n - i);
    auto m = mf.narrow(0, i, k).to(at::kFloat), v = vf.narrow(0, i, k).to(at::kFloat);
    at::_fused_adamw_({pf.narrow(0, i, k)}, {gf.narrow(0, i, k)}, {m}, {v}, {}, {steps}, lr, beta1, beta2, weight_decay,
                      eps, /*amsgrad=*/false, /*maximize=*/false, std::nullopt, std::nullopt);
    // One 32-bit draw per element: its low half rounds the first moment, its high half the second.
    auto bits = at::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), {k},
                            m.options().dtype(at::kInt));
    store_rounded_with(mf.narrow(0, i, k), m, bits.bitwise_and(0xFFFF));
    store_rounded_with(vf.narrow(0, i, k), v, bits.bitwise_right_shift_(16).bitwise_and_(0xFFFF));
  }
}

at::ScalarType moment_dtype(const torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  if (const auto* f = dynamic_cast<const FusedAdamW*>(&optimizer)) return f->moment_dtype(p);
  return p.scalar_type();
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
  if (c.fused) {
    auto f = std::make_unique<FusedAdamW>(groups, o);
    f->set_state_dtype(c.state_dtype == config::Dtype::kBFloat16 ? at::kBFloat16 : at::kFloat);
    return f;
  }
  TORCH_CHECK(c.state_dtype == config::Dtype::kFloat32, "optimizer.state_dtype ",
              config::kStateDtypes.name(c.state_dtype), " needs optimizer.fused");
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
