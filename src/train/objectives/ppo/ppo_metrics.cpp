// PPO's metrics under TRL's names (train/ppo_metrics.h).
#include "train/objectives/ppo/ppo_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "train/objectives/lm_data.h"

namespace anvil::train {
namespace {

/// The unbiased std of xs[from, from + n), as torch.std; 0 for fewer than 2.
double unbiased_std(const std::vector<double>& xs, size_t from, size_t n) {
  if (n < 2) return 0;
  double mean = 0, ss = 0;
  for (size_t i = from; i < from + n; ++i) mean += xs[i];
  mean /= static_cast<double>(n);
  for (size_t i = from; i < from + n; ++i) ss += (xs[i] - mean) * (xs[i] - mean);
  return std::sqrt(ss / static_cast<double>(n - 1));
}

double mean_of(const std::vector<double>& xs) {
  double s = 0;
  for (const double x : xs) s += x;
  return xs.empty() ? 0.0 : s / static_cast<double>(xs.size());
}

/// A column of doubles as a vector.
std::vector<double> to_vector(const at::Tensor& x) {
  const auto c = x.reshape({-1}).to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

}  // namespace

bool logs_group_metrics(Advantage advantage) { return advantage == Advantage::kGrpo || advantage == Advantage::kRloo; }

Metrics group_rollout_metrics(const std::vector<RolloutRow>& rows, const GeneratedTokens& g, const at::Tensor& compared,
                              int64_t group, bool batch_std, const at::Tensor& kl) {
  const auto n = rows.size();
  const auto k = static_cast<size_t>(std::max<int64_t>(group, 1));
  TORCH_CHECK(n > 0 && n % k == 0 && compared.numel() == static_cast<int64_t>(n), "group_rollout_metrics: ", n,
              " rows, groups of ", group, ", ", compared.numel(), " compared scores");
  Metrics m;
  std::vector<double> scores;
  for (const auto& r : rows) scores.push_back(r.score);
  m["reward"] = mean_of(scores);
  m["reward_std"] = unbiased_std(scores, 0, n);
  // TRL's torch.isclose(std, 0): within its default atol of 1e-8.
  constexpr double kZeroStd = 1e-8;
  const auto cmp = to_vector(compared);
  if (batch_std) {
    m["frac_reward_zero_std"] = unbiased_std(cmp, 0, n) <= kZeroStd ? 1.0 : 0.0;
  } else {
    double zero = 0;
    for (size_t start = 0; start < n; start += k) zero += unbiased_std(cmp, start, k) <= kZeroStd ? 1.0 : 0.0;
    m["frac_reward_zero_std"] = zero / static_cast<double>(n / k);
  }
  // Generated tokens per row (TRL counts a tool-calling completion's model tokens only).
  const auto lengths = to_vector(g.mask.sum(1));
  std::vector<double> terminated;
  for (size_t i = 0; i < n; ++i)
    if (rows[i].ended) terminated.push_back(lengths[i]);
  m["completions/mean_length"] = mean_of(lengths);
  m["completions/min_length"] = *std::min_element(lengths.begin(), lengths.end());
  m["completions/max_length"] = *std::max_element(lengths.begin(), lengths.end());
  m["completions/clipped_ratio"] = static_cast<double>(n - terminated.size()) / static_cast<double>(n);
  if (terminated.empty()) terminated.push_back(0.0);  // as TRL: no row ended
  m["completions/mean_terminated_length"] = mean_of(terminated);
  m["completions/min_terminated_length"] = *std::min_element(terminated.begin(), terminated.end());
  m["completions/max_terminated_length"] = *std::max_element(terminated.begin(), terminated.end());
  if (kl.defined()) m["kl"] = (kl * g.mask).sum().item<double>() / std::max(1.0, g.mask.sum().item<double>());
  return m;
}

Metrics ppo_step_metrics(const Sums& sums, bool group_metrics) {
  const auto get = [&](const std::string& k) { return sum_value(sums, k); };
  const double n = std::max(1.0, get("tokens")), targets = std::max(1.0, get("targets"));
  Metrics m{{"loss/policy_avg", get("pg_loss") / targets},
            {"policy/approxkl_avg", get("approxkl") / n},
            {"policy/clipfrac_avg", get("clipfrac") / n},
            {"policy/entropy_avg", get("entropy") / n},
            {"val/ratio", get("ratio") / n},
            {"clip_ratio/low_mean", get("clip_low") / n},
            {"clip_ratio/high_mean", get("clip_high") / n},
            {"clip_ratio/region_mean", (get("clip_low") + get("clip_high")) / n}};
  if (sums.count("vf_loss")) {
    m["loss/value_avg"] = get("vf_loss") / targets;
    m["val/clipfrac_avg"] = get("vf_clipfrac") / n;
  }
  if (sums.count("kl")) m["policy/kl_avg"] = get("kl") / n;
  if (group_metrics) {
    m["entropy"] = get("entropy") / n;
    if (sums.count("kl")) m["kl"] = get("kl") / n;
  }
  return m;
}

}  // namespace anvil::train
