#include "models/gpt2/gpt2.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <cmath>

#include "anvil/core/error.h"
#include "models/layers.h"
#include "../hf_config_reader.h"
#include "models/init.h"

namespace anvil::models::gpt2 {

Conv1DImpl::Conv1DImpl(int64_t in_features, int64_t out_features) {
  weight = register_parameter("weight", layers::new_parameter({in_features, out_features}));
  bias = register_parameter("bias", layers::new_parameter({out_features}));
  if (!init_skipped()) bias.detach().zero_();  // the weight: GPT2LMHeadModel::parameter_init
}

at::Tensor Conv1DImpl::forward(const at::Tensor& x) {
  auto y = parallel_forward(x, weight, bias, [&](const at::Tensor& in, const at::Tensor& b) {
    // The input's shape, not x's: under sequence parallelism a column-parallel input is gathered first.
    auto out_shape = in.sizes().vec();
    out_shape.back() = weight.size(1);
    auto flat = in.reshape({-1, in.size(-1)});
    return (b.defined() ? at::addmm(b, flat, weight) : at::mm(flat, weight)).view(out_shape);
  });
  return with_adapter(x, y, is_training());
}

void Conv1DImpl::add_to_weight(const at::Tensor& delta_out_in) {
  at::NoGradGuard no_grad;
  weight.add_(delta_out_in.t().to(weight.dtype()));
}

AttentionImpl::AttentionImpl(const GPT2Options& o)
    : c_attn(register_module("c_attn", Conv1D(o.n_embd(), 3 * o.n_embd()))),
      c_proj(register_module("c_proj", Conv1D(o.n_embd(), o.n_embd()))),
      resid_dropout(register_module("resid_dropout", torch::nn::Dropout(o.resid_pdrop()))),
      n_head(o.n_head()),
      n_embd(o.n_embd()),
      attn_pdrop(o.attn_pdrop()) {}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const ForwardArgs& args, size_t layer) {
  const auto D = n_embd / n_head;
  // Heads from the local tensor: under tensor parallelism a rank holds a share of them.
  auto qkv = c_attn(x).chunk(3, -1);                        // 3 x (B, T, C)
  auto q = layers::split_heads(qkv[0], D).transpose(1, 2);  // (B, H, T, D)
  auto k = layers::split_heads(qkv[1], D).transpose(1, 2);
  auto v = layers::split_heads(qkv[2], D).transpose(1, 2);
  auto y = layers::attention(q, k, v, args, layer, is_training() ? attn_pdrop : 0.0);  // (B, T, C)
  return resid_dropout(c_proj(y));
}

MLPImpl::MLPImpl(const GPT2Options& o)
    : c_fc(register_module("c_fc", Conv1D(o.n_embd(), o.inner()))),
      c_proj(register_module("c_proj", Conv1D(o.inner(), o.n_embd()))),
      dropout(register_module("dropout", torch::nn::Dropout(o.resid_pdrop()))) {}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  return dropout(c_proj(at::gelu(c_fc(x), "tanh")));  // HF "gelu_new"
}

BlockImpl::BlockImpl(const GPT2Options& o)
    : ln_1(register_module("ln_1",
                           layers::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon())))),
      attn(register_module("attn", Attention(o))),
      ln_2(register_module("ln_2",
                           layers::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon())))),
      mlp(register_module("mlp", MLP(o))) {}

at::Tensor BlockImpl::forward(const at::Tensor& x, const ForwardArgs& args, size_t layer) {
  auto h = x + attn(layers::layer_norm(ln_1, x), args, layer);
  return h + mlp(layers::layer_norm(ln_2, h));
}

GPT2ModelImpl::GPT2ModelImpl(const GPT2Options& o)
    : wte(register_module("wte", layers::Embedding(o.vocab_size(), o.n_embd()))),
      wpe(register_module("wpe", layers::Embedding(o.n_positions(), o.n_embd()))),
      drop(register_module("drop", torch::nn::Dropout(o.embd_pdrop()))),
      h(register_module("h", torch::nn::ModuleList())),
      ln_f(register_module("ln_f",
                           layers::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon())))) {
  for (int64_t i = 0; i < o.n_layer(); ++i) h->push_back(Block(o));
}

at::Tensor GPT2ModelImpl::forward(const at::Tensor& input_ids, const ForwardArgs& args) {
  const auto B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = args.cache ? args.cache->length : 0;
  TORCH_CHECK(past + T <= wpe->weight.size(0), "sequence of ", past + T,
              " tokens exceeds n_positions=", wpe->weight.size(0));
  auto pos = layers::positions(args, B, T, input_ids.device());  // (B, T)
  auto x = drop(wte(input_ids) + wpe(pos));                      // (B, T, C)
  for (size_t i = 0; i < h->size(); ++i) {
    auto block = h[i]->as<Block>();
    x = layers::run_block(args, i, x, [block, args, i](const at::Tensor& t) { return block->forward(t, args, i); });
  }
  if (args.cache) args.cache->advance(T);
  return layers::layer_norm(ln_f, x);
}

GPT2LMHeadModel::GPT2LMHeadModel(const GPT2Options& o) : options(o) {
  TORCH_CHECK(o.n_embd() % o.n_head() == 0, "n_embd must be divisible by n_head");
  transformer = register_module("transformer", GPT2Model(o));
  if (!init_skipped()) init_parameters(*this);  // loading weights: they overwrite it (models/init.h)
}

at::Tensor GPT2LMHeadModel::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return transformer->forward(input_ids, args);  // (B, T, C)
}

CausalLM::OutputHead GPT2LMHeadModel::output_head() { return {transformer->wte->weight, {}}; }  // tied

std::optional<ParameterInit> GPT2LMHeadModel::parameter_init(const std::string& name) const {
  const double std = options.initializer_range();
  const bool is_ln = name.find(".ln_") != std::string::npos || name.rfind("transformer.ln_f", 0) == 0;
  if (is_ln) return ParameterInit::constant(name.ends_with("weight") ? 1.0 : 0.0);
  if (name.ends_with("bias")) return ParameterInit::constant(0.0);
  // GPT-2's scaled init of the residual projections.
  if (name.find("c_proj.weight") != std::string::npos)
    return ParameterInit::normal(std / std::sqrt(2.0 * options.n_layer()));
  return ParameterInit::normal(std);
}

nlohmann::json GPT2LMHeadModel::hf_config() const {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"torch_dtype", "float32"}};
  auto o = options;
  HfKeyWriter keys(j);
  o.visit_hf(keys);
  write_hf_special_tokens(j, special_tokens);
  return j;
}

std::string GPT2LMHeadModel::checkpoint_key(const std::string& name) const {
  // Tied head; causal-mask buffers older transformers versions saved.
  if (name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) return "";
  return name;
}

}  // namespace anvil::models::gpt2
