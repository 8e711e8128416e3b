// Heads on the final hidden states: the reward model's score head (HF
// ...ForSequenceClassification "score") and named heads (value, Q/V, ...).
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>

#include "anvil/models/causal_lm.h"
#include "models/layers.h"

namespace anvil::models {

void CausalLM::add_score_head(double init_std) {
  if (has_score_head()) return;
  auto ref = parameters().front();
  score_head_ = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(hidden_size(), 1).bias(false)));
  {
    at::NoGradGuard no_grad;
    score_head_->weight.normal_(0.0, init_std);  // HF _init_weights: normal(0, initializer_range)
  }
  score_head_->to(ref.device(), ref.scalar_type());
}

at::Tensor CausalLM::logits(const at::Tensor& hidden) {
  const auto head = output_head();
  // Vocabulary parallelism: this rank's rows of the head, a column-parallel layer (its input's gradient summed
  // over the group), then every rank's columns.
  auto out =
      vocab_parallel
          ? vocab_parallel->gather_columns(layers::lm_head(vocab_parallel->enter(hidden), head.weight, head.bias))
          : layers::lm_head(hidden, head.weight, head.bias);
  if (const double cap = final_logit_softcap(); cap > 0) out = at::tanh(out / cap) * cap;
  return out;
}

void CausalLM::resize_vocab(int64_t n) {
  TORCH_CHECK(n > 0, "resize_vocab: expected a positive size, got ", n);
  const int64_t old = vocab_size();
  if (n == old) return;
  auto params = named_parameters();
  std::vector<std::string> names{embedding_parameter()};
  for (const auto& h : lm_head_parameters()) names.push_back(h);
  at::NoGradGuard no_grad;
  for (const auto& name : names) {
    auto* p = params.find(name);
    TORCH_CHECK(p != nullptr && p->dim() == 2 && p->size(0) == old, "resize_vocab: no (", old, ", C) parameter \"",
                name, "\"");
    auto grown = at::empty({n, p->size(1)}, p->options());
    const auto keep = std::min(n, old);
    grown.narrow(0, 0, keep).copy_(p->narrow(0, 0, keep));
    if (n > old)  // transformers' mean_resizing: the mean of the old rows, in float32
      grown.narrow(0, old, n - old).copy_(p->to(at::kFloat).mean(0, true).expand({n - old, p->size(1)}));
    p->set_data(grown);
  }
  set_vocab_size(n);
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

at::Tensor CausalLM::token_scores(const at::Tensor& hidden) {
  TORCH_CHECK(has_score_head(), "token_scores: the model has no score head");
  return score_head_(hidden).squeeze(-1).to(at::kFloat);
}

void CausalLM::add_head(const std::string& name, const HeadOptions& o) {
  TORCH_CHECK(!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos,
              "add_head: \"", name, "\": expected a name of a-z, 0-9 and _");
  TORCH_CHECK(!has_head(name), "add_head: the model already has a head \"", name, "\"");
  TORCH_CHECK(o.out_features > 0, "add_head: out_features must be positive");
  TORCH_CHECK(o.hidden_features >= 0, "add_head: hidden_features must be >= 0");
  if (heads_.is_empty()) heads_ = register_module("heads", torch::nn::ModuleDict());
  auto ref = parameters().front();
  auto linear = [&](int64_t in, int64_t out) {
    torch::nn::Linear lin(torch::nn::LinearOptions(in, out).bias(o.bias));
    at::NoGradGuard no_grad;
    lin->weight.normal_(0.0, o.init_std);
    if (o.bias) lin->bias.zero_();
    return lin;
  };
  std::shared_ptr<torch::nn::Module> module;
  if (o.hidden_features > 0)
    module = torch::nn::Sequential(linear(hidden_size(), o.hidden_features), torch::nn::ReLU(),
                                   linear(o.hidden_features, o.out_features))
                 .ptr();
  else
    module = linear(hidden_size(), o.out_features).ptr();
  module->to(ref.device(), ref.scalar_type());
  heads_->update({{name, module}});
  head_options_[name] = o;
}

bool CausalLM::has_head(const std::string& name) const { return !heads_.is_empty() && heads_->contains(name); }

std::vector<std::string> CausalLM::head_names() const {
  if (heads_.is_empty()) return {};
  auto keys = heads_->keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

CausalLM::HeadOptions CausalLM::head_options(const std::string& name) const {
  TORCH_CHECK(has_head(name), "head: the model has no head \"", name, "\"");
  return head_options_.at(name);
}

at::Tensor CausalLM::head(const std::string& name, const at::Tensor& hidden) {
  const auto o = head_options(name);
  const auto& m = (*heads_)[name];
  if (o.hidden_features > 0) return std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m)->forward(hidden);
  return std::dynamic_pointer_cast<torch::nn::LinearImpl>(m)->forward(hidden);
}

at::Tensor last_non_pad_index(const at::Tensor& input_ids, int64_t pad_id) {
  auto non_pad = input_ids.ne(pad_id).to(at::kLong);
  auto idx = at::arange(input_ids.size(-1), input_ids.options().dtype(at::kLong));
  return (idx * non_pad).argmax(-1);
}

}  // namespace anvil::models
