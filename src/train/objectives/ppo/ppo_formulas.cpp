// PPO, GRPO and RLOO formulas (anvil/train/ppo.h), parity-tested against
// tests/parity/ppo_reference.py.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "anvil/core/error.h"
#include "anvil/train/ppo.h"

namespace anvil::train {

at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator) {
  const auto d = logp - ref_logp;
  return estimator == KlEstimator::kK1 ? d : at::exp(-d) - 1 + d;
}

at::Tensor token_rewards(const at::Tensor& kl, const at::Tensor& scores, const at::Tensor& mask, double kl_coef) {
  auto rewards = -kl_coef * kl * mask;
  const auto lengths = mask.sum(1).to(at::kLong);  // (B)
  const auto B = mask.size(0);
  for (int64_t i = 0; i < B; ++i) {
    const auto n = lengths[i].item<int64_t>();
    if (n > 0) rewards[i][n - 1] += scores[i];
  }
  return rewards;
}

std::pair<at::Tensor, at::Tensor> gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                      double gamma, double lam) {
  const auto R = rewards.size(1);
  const auto v = values * mask, r = rewards * mask;
  auto adv = at::zeros_like(rewards);
  auto last = at::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = R - 1; t >= 0; --t) {
    const auto next = t + 1 < R ? v.select(1, t + 1) : at::zeros_like(last);
    const auto delta = r.select(1, t) + gamma * next - v.select(1, t);
    // Past a row's end everything is 0, so its last token starts from 0.
    last = (delta + gamma * lam * last) * mask.select(1, t);
    adv.select(1, t).copy_(last);
  }
  return {adv, (adv + v) * mask};
}

at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, const std::vector<double>& moments) {
  double n, sum, sq;
  if (moments.size() == 3) {
    n = moments[0], sum = moments[1], sq = moments[2];
  } else {
    n = mask.sum().item<double>();
    sum = (x * mask).sum().item<double>();
    sq = (x * x * mask).sum().item<double>();
  }
  if (n < 2) return x * mask;
  const double mean = sum / n;
  const double var = std::max(0.0, (sq - n * mean * mean) / (n - 1));
  return (x - mean) / std::sqrt(var + 1e-8) * mask;
}

at::Tensor grpo_advantages(const at::Tensor& scores, int64_t group) {
  TORCH_CHECK(group >= 2 && scores.numel() % group == 0, "grpo_advantages: groups of ", group, " over ", scores.numel(),
              " scores");
  const auto s = scores.view({-1, group});
  return ((s - s.mean(1, true)) / (s.std(1, /*unbiased=*/true, true) + 1e-4)).view(-1);
}

at::Tensor grpo_advantages(const at::Tensor& scores, int64_t group, ScaleRewards scale_rewards) {
  if (scale_rewards == ScaleRewards::kGroup) return grpo_advantages(scores, group);
  TORCH_CHECK(group >= 2 && scores.numel() % group == 0, "grpo_advantages: groups of ", group, " over ", scores.numel(),
              " scores");
  const auto s = scores.view({-1, group});
  const auto centred = (s - s.mean(1, true)).view(-1);
  if (scale_rewards == ScaleRewards::kNone) return centred;
  return centred / (scores.std(/*unbiased=*/true) + 1e-4);  // batch
}

at::Tensor reinforce_pp_returns(const at::Tensor& rewards, const at::Tensor& mask) {
  // Sums from each token to the end: a reversed cumulative sum over the masked rewards.
  return (rewards * mask).flip(1).cumsum(1).flip(1) * mask;
}

at::Tensor reinforce_pp_advantages(const at::Tensor& scores, const at::Tensor& kl, const at::Tensor& mask,
                                   double kl_coef, int64_t group, bool whiten) {
  auto s = scores;
  if (group > 0) {
    TORCH_CHECK(scores.numel() % group == 0, "reinforce_pp_advantages: groups of ", group, " over ", scores.numel(),
                " scores");
    const auto g = scores.view({-1, group});
    s = (g - g.mean(1, true)).view(-1);
  }
  const auto returns = reinforce_pp_returns(token_rewards(kl, s, mask, kl_coef), mask);
  return whiten ? masked_whiten(returns, mask) : returns;
}

double overlong_penalty(int64_t tokens, int64_t length, int64_t buffer, double factor) {
  if (buffer <= 0) return 0.0;
  const int64_t expected = length - buffer;
  if (tokens <= expected) return 0.0;
  return -factor * std::min(1.0, static_cast<double>(tokens - expected) / static_cast<double>(buffer));
}

at::Tensor rloo_advantages(const at::Tensor& scores, int64_t group) {
  TORCH_CHECK(group >= 2 && scores.numel() % group == 0, "rloo_advantages: groups of ", group, " over ", scores.numel(),
              " scores");
  const auto s = scores.view({-1, group});
  return (s - (s.sum(1, true) - s) / static_cast<double>(group - 1)).view(-1);
}

double adaptive_kl_update(double value, double current, double target, double horizon, double n_steps) {
  const double e = std::clamp(current / target - 1, -0.2, 0.2);
  return value * (1 + e * n_steps / horizon);
}

void RunningMoments::update(const std::vector<double>& xs) {
  if (xs.empty()) return;
  const double n = static_cast<double>(xs.size());
  double m = 0;
  for (double x : xs) m += x;
  m /= n;
  double v = 0;
  for (double x : xs) v += (x - m) * (x - m);
  v /= n;
  const double delta = m - mean, tot = count + n;
  const double old_sum = var * count + delta * delta * count * n / tot;
  mean += delta * n / tot;
  var = (old_sum + v * n) / tot;
  std = std::sqrt(var * tot / (tot - 1));
  count = tot;
}

nlohmann::json RunningMoments::to_json() const {
  return {{"mean", mean}, {"var", var}, {"std", std}, {"count", count}};
}

RunningMoments RunningMoments::from_json(const nlohmann::json& j) {
  RunningMoments m;
  m.mean = j.at("mean").get<double>();
  m.var = j.at("var").get<double>();
  m.std = j.at("std").get<double>();
  m.count = j.at("count").get<double>();
  return m;
}

at::Tensor truncated_is_weights(const at::Tensor& prox_logp, const at::Tensor& behaviour_logp, const at::Tensor& mask,
                                double cap) {
  return (at::exp(prox_logp.detach() - behaviour_logp.detach()).clamp_max(cap) * mask).detach();
}

PpoLossSums ppo_loss_sums(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                          const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                          const at::Tensor& mask, const PpoClip& clip, const at::Tensor& weights,
                          const at::Tensor& is_weights) {
  PpoLossSums out;
  const auto& w = weights.defined() ? weights : mask;
  const auto diff = logp - old_logp;
  // GSPO's sequence ratio: the mean log-ratio over each response's tokens, the same for all of them.
  const auto log_ratio =
      clip.sequence_ratio ? ((diff * mask).sum(1, true) / mask.sum(1, true).clamp_min(1)).expand_as(diff) : diff;
  const auto ratio = at::exp(log_ratio);
  const double high = clip.cliprange_high > 0 ? clip.cliprange_high : clip.cliprange;
  const auto pg1 = -advantages * ratio;
  const auto pg2 = -advantages * at::clamp(ratio, 1 - clip.cliprange, 1 + high);
  const auto pg = at::maximum(pg1, pg2);
  out.policy = ((is_weights.defined() ? pg * is_weights : pg) * w).sum();
  out.clipfrac = ((pg2 > pg1).to(mask.scalar_type()) * mask).sum().detach();
  const auto r = ratio.detach();
  out.clip_low = (((r < 1 - clip.cliprange) & (advantages < 0)).to(mask.scalar_type()) * mask).sum();
  out.clip_high = (((r > 1 + high) & (advantages > 0)).to(mask.scalar_type()) * mask).sum();
  out.approxkl = (0.5 * diff.detach() * diff.detach() * mask).sum();
  out.ratio = (ratio.detach() * mask).sum();
  if (values.defined()) {
    const auto vclip =
        at::clamp(values, old_values - clip.cliprange_value, old_values + clip.cliprange_value);  // tensor bounds
    const auto vf1 = (values - returns).pow(2), vf2 = (vclip - returns).pow(2);
    out.value = (0.5 * at::maximum(vf1, vf2) * w).sum();
    out.vf_clipfrac = ((vf2 > vf1).to(mask.scalar_type()) * mask).sum().detach();
  }
  return out;
}

}  // namespace anvil::train
