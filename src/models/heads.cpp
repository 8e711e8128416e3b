// The reward model's score head (HF ...ForSequenceClassification "score").
#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include "anvil/models/causal_lm.h"

namespace anvil::models {

void CausalLM::add_score_head(double init_std) {
  if (has_score_head()) return;
  auto ref = parameters().front();
  score_head_ = register_module(
      "score", torch::nn::Linear(torch::nn::LinearOptions(hidden_size(), 1).bias(false)));
  {
    at::NoGradGuard no_grad;
    score_head_->weight.normal_(0.0, init_std);  // HF _init_weights: normal(0, initializer_range)
  }
  score_head_->to(ref.device(), ref.scalar_type());
}

at::Tensor CausalLM::score(const at::Tensor& hidden, const at::Tensor& positions) {
  TORCH_CHECK(has_score_head(), "score: the model has no score head (not a reward model)");
  TORCH_CHECK(hidden.dim() == 3 && positions.dim() == 1 && positions.size(0) == hidden.size(0),
              "score: expected (B, T, C) hidden states and (B) positions");
  const auto B = hidden.size(0), T = hidden.size(1);
  const auto flat = at::arange(B, positions.options().dtype(at::kLong)) * T + positions.to(at::kLong);
  auto picked = hidden.reshape({B * T, hidden.size(2)}).index_select(0, flat);  // (B, C)
  return score_head_(picked).squeeze(-1).to(at::kFloat);
}

at::Tensor last_non_pad_index(const at::Tensor& input_ids, int64_t pad_id) {
  auto non_pad = input_ids.ne(pad_id).to(at::kLong);
  auto idx = at::arange(input_ids.size(-1), input_ids.options().dtype(at::kLong));
  return (idx * non_pad).argmax(-1);
}

}  // namespace anvil::models
