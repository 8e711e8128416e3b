// Heads on the final hidden states: the reward model's score head (HF
// ...ForSequenceClassification "score") and named heads (value, Q/V, ...).
#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <algorithm>

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

void CausalLM::add_head(const std::string& name, int64_t out_features, bool bias, double init_std) {
  TORCH_CHECK(!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos,
              "add_head: \"", name, "\": expected a name of a-z, 0-9 and _");
  TORCH_CHECK(!has_head(name), "add_head: the model already has a head \"", name, "\"");
  TORCH_CHECK(out_features > 0, "add_head: out_features must be positive");
  if (heads_.is_empty()) heads_ = register_module("heads", torch::nn::ModuleDict());
  auto ref = parameters().front();
  torch::nn::Linear lin(torch::nn::LinearOptions(hidden_size(), out_features).bias(bias));
  {
    at::NoGradGuard no_grad;
    lin->weight.normal_(0.0, init_std);
    if (bias) lin->bias.zero_();
  }
  lin->to(ref.device(), ref.scalar_type());
  heads_->update({{name, std::static_pointer_cast<torch::nn::Module>(lin.ptr())}});
}

bool CausalLM::has_head(const std::string& name) const { return !heads_.is_empty() && heads_->contains(name); }

std::vector<std::string> CausalLM::head_names() const {
  if (heads_.is_empty()) return {};
  auto keys = heads_->keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

torch::nn::Linear CausalLM::head_module(const std::string& name) const {
  TORCH_CHECK(has_head(name), "head: the model has no head \"", name, "\"");
  return torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>((*heads_)[name]));
}

at::Tensor CausalLM::head(const std::string& name, const at::Tensor& hidden) {
  return head_module(name)(hidden);
}

at::Tensor last_non_pad_index(const at::Tensor& input_ids, int64_t pad_id) {
  auto non_pad = input_ids.ne(pad_id).to(at::kLong);
  auto idx = at::arange(input_ids.size(-1), input_ids.options().dtype(at::kLong));
  return (idx * non_pad).argmax(-1);
}

}  // namespace anvil::models
