// A PPO rollout's rows: their generated tokens for the advantage formulas
// and their collation into training micro-batches (train/ppo_rollout.h).
#include <ATen/ATen.h>

#include <algorithm>

#include "train/objectives/ppo/ppo_rollout.h"

namespace anvil::train {

void RowCodec::put(const RolloutRow& r, double* out) const {
  out[0] = static_cast<double>(r.prompt.size());
  out[1] = static_cast<double>(r.response.size());
  out[2] = r.ended ? 1 : 0;
  out[3] = r.score;
  out[4] = static_cast<double>(r.answer.size());
  out[5] = r.env_reward;
  out[6] = static_cast<double>(r.turns);
  double* p = out + 7;
  for (size_t i = 0; i < r.prompt.size(); ++i) p[i] = static_cast<double>(r.prompt[i]);
  p += max_prompt;
  for (size_t i = 0; i < r.response.size(); ++i) {
    p[i] = static_cast<double>(r.response[i]);
    p[max_response + i] = r.old_logp[i];
    p[2 * max_response + i] = r.ref_logp.empty() ? 0 : r.ref_logp[i];
    p[3 * max_response + i] = r.values.empty() ? 0 : r.values[i];
    p[4 * max_response + i] = r.is_appended(i) ? 1 : 0;
  }
  for (size_t i = 0; i < r.answer.size(); ++i) p[5 * max_response + i] = static_cast<double>(r.answer[i]);
}

RolloutRow RowCodec::get(const double* in) const {
  RolloutRow r;
  const auto np = static_cast<size_t>(in[0]), nr = static_cast<size_t>(in[1]);
  r.ended = in[2] != 0;
  r.score = in[3];
  const auto na = static_cast<size_t>(in[4]);
  r.env_reward = in[5];
  r.turns = static_cast<int64_t>(in[6]);
  const double* p = in + 7;
  for (size_t i = 0; i < np; ++i) r.prompt.push_back(static_cast<int64_t>(p[i]));
  p += max_prompt;
  for (size_t i = 0; i < nr; ++i) {
    r.response.push_back(static_cast<int64_t>(p[i]));
    r.old_logp.push_back(static_cast<float>(p[max_response + i]));
    r.ref_logp.push_back(static_cast<float>(p[2 * max_response + i]));
    r.values.push_back(static_cast<float>(p[3 * max_response + i]));
    r.appended.push_back(p[4 * max_response + i] != 0 ? 1 : 0);
  }
  for (size_t i = 0; i < na; ++i) r.answer.push_back(static_cast<int64_t>(p[5 * max_response + i]));
  if (std::none_of(r.appended.begin(), r.appended.end(), [](uint8_t a) { return a != 0; })) r.appended.clear();
  return r;
}

GeneratedTokens generated_tokens(const std::vector<RolloutRow>& rows) {
  GeneratedTokens g;
  g.places.resize(rows.size());
  int64_t A = 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].response.size(); ++j)
      if (!rows[i].is_appended(j)) g.places[i].push_back(static_cast<int64_t>(j));
    A = std::max<int64_t>(A, static_cast<int64_t>(g.places[i].size()));
    g.response_width = std::max<int64_t>(g.response_width, static_cast<int64_t>(rows[i].response.size()));
  }
  const auto N = static_cast<int64_t>(rows.size());
  g.mask = at::zeros({N, A}, at::kDouble), g.logp = at::zeros({N, A}, at::kDouble);
  g.ref = at::zeros({N, A}, at::kDouble), g.values = at::zeros({N, A}, at::kDouble);
  auto ma = g.mask.accessor<double, 2>(), la = g.logp.accessor<double, 2>(), ra = g.ref.accessor<double, 2>();
  auto va = g.values.accessor<double, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const auto& r = rows[static_cast<size_t>(i)];
    const auto& at_ = g.places[static_cast<size_t>(i)];
    for (size_t k = 0; k < at_.size(); ++k) {
      const auto j = static_cast<size_t>(at_[k]);
      const auto kk = static_cast<int64_t>(k);
      ma[i][kk] = 1;
      la[i][kk] = r.old_logp[j];
      ra[i][kk] = r.ref_logp[j];
      if (!r.values.empty()) va[i][kk] = r.values[j];
    }
  }
  return g;
}

at::Tensor at_response_places(const at::Tensor& x, const GeneratedTokens& g) {
  const auto N = x.size(0);
  auto out = at::zeros({N, std::max<int64_t>(g.response_width, 1)}, x.options());
  for (int64_t i = 0; i < N; ++i) {
    const auto& at_ = g.places[static_cast<size_t>(i)];
    if (at_.empty()) continue;
    out[i].index_copy_(0, at::tensor(at_, at::kLong), x[i].narrow(0, 0, static_cast<int64_t>(at_.size())));
  }
  return out;
}

Batch collate_rollout(const std::vector<const RolloutRow*>& rows, int64_t pad_id, const at::Tensor& adv,
                      const at::Tensor& ret, const std::vector<int64_t>& index, const LossWeighting& weighting) {
  const auto B = static_cast<int64_t>(rows.size());
  int64_t T = 1, R = 1;
  for (const auto* r : rows) {
    T = std::max<int64_t>(T, static_cast<int64_t>(r->prompt.size() + r->response.size()));
    R = std::max<int64_t>(R, static_cast<int64_t>(r->response.size()));
  }
  auto ids = at::full({B, T}, pad_id, at::kLong);
  auto pos = at::zeros({B, R}, at::kLong), tokens = at::zeros({B, R}, at::kLong);
  auto mask = at::zeros({B, R}, at::kFloat), old_logp = at::zeros({B, R}, at::kFloat);
  auto ref_logp = at::zeros({B, R}, at::kFloat), old_values = at::zeros({B, R}, at::kFloat);
  auto advantages = at::zeros({B, R}, at::kFloat), returns = at::zeros({B, R}, at::kFloat);
  auto weights = at::zeros({B, R}, at::kFloat);
  const bool weighed = std::any_of(rows.begin(), rows.end(), [](const RolloutRow* r) { return !r->is_weight.empty(); });
  auto is_weight = weighed ? at::ones({B, R}, at::kFloat) : at::Tensor();
  const bool per_row = weighting.aggregation != LossAggregation::kTokenMean;
  Batch b;
  for (int64_t i = 0; i < B; ++i) {
    const auto& r = *rows[static_cast<size_t>(i)];
    const auto P = static_cast<int64_t>(r.prompt.size()), n = static_cast<int64_t>(r.response.size());
    auto* pi = ids[i].data_ptr<int64_t>();
    std::copy(r.prompt.begin(), r.prompt.end(), pi);
    std::copy(r.response.begin(), r.response.end(), pi + P);
    for (int64_t j = 0; j < R; ++j) pos[i][j] = std::min(P - 1 + j, T - 1);
    const bool counted = !(weighting.mask_truncated && !r.ended);
    int64_t generated = 0;  // the tokens the policy chose (not an environment's)
    for (int64_t j = 0; j < n; ++j) generated += !r.is_appended(static_cast<size_t>(j));
    const float w = !counted ? 0.f
                    : weighting.aggregation == LossAggregation::kSequenceMean
                        ? 1.f / static_cast<float>(std::max<int64_t>(generated, 1))
                    : weighting.aggregation == LossAggregation::kConstant ? static_cast<float>(1.0 / weighting.constant)
                                                                          : 1.f;
    for (int64_t j = 0; j < n; ++j) {
      const bool trained = counted && !r.is_appended(static_cast<size_t>(j));
      tokens[i][j] = r.response[static_cast<size_t>(j)];
      mask[i][j] = trained ? 1 : 0;
      weights[i][j] = trained ? w : 0.f;
      if (!r.old_logp.empty()) old_logp[i][j] = r.old_logp[static_cast<size_t>(j)];
      if (!r.ref_logp.empty()) ref_logp[i][j] = r.ref_logp[static_cast<size_t>(j)];
      if (!r.values.empty()) old_values[i][j] = r.values[static_cast<size_t>(j)];
      if (!r.is_weight.empty()) is_weight[i][j] = r.is_weight[static_cast<size_t>(j)];
    }
    if (adv.defined()) {
      const auto g = index[static_cast<size_t>(i)];
      advantages[i].narrow(0, 0, n).copy_(adv[g].narrow(0, 0, n));
      returns[i].narrow(0, 0, n).copy_(ret[g].narrow(0, 0, n));
    }
    b.num_targets += per_row ? 1 : (counted ? generated : 0);
    b.num_tokens += P + n;
  }
  b.tensors = {{"input_ids", ids},     {"positions", pos},     {"tokens", tokens},         {"mask", mask},
               {"old_logp", old_logp}, {"ref_logp", ref_logp}, {"old_values", old_values}, {"advantages", advantages},
               {"returns", returns},   {"weights", weights}};
  if (weighed) b.tensors["is_weight"] = is_weight;
  return b;
}

}  // namespace anvil::train
