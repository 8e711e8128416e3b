#include "models/opt/opt.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>

#include "models/layers.h"
#include "../hf_config_reader.h"
#include "models/init.h"

namespace anvil::models::opt {
namespace {

/// HF's position embeddings are offset by 2 (OPT's padding convention).
constexpr int64_t kPositionOffset = 2;

layers::Linear linear(int64_t in, int64_t out, bool bias) {
  return layers::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

layers::LayerNorm layer_norm(const OPTOptions& o) {
  return layers::LayerNorm(
      torch::nn::LayerNormOptions({o.hidden_size()}).elementwise_affine(o.layer_norm_elementwise_affine()));
}

struct Attention : torch::nn::Module {
  explicit Attention(const OPTOptions& o)
      : heads(o.num_attention_heads()),
        head_dim(o.hidden_size() / o.num_attention_heads()),
        dropout(o.attention_dropout()) {
    k_proj = register_module("k_proj", linear(o.hidden_size(), o.hidden_size(), o.enable_bias()));
    v_proj = register_module("v_proj", linear(o.hidden_size(), o.hidden_size(), o.enable_bias()));
    q_proj = register_module("q_proj", linear(o.hidden_size(), o.hidden_size(), o.enable_bias()));
    out_proj = register_module("out_proj", linear(o.hidden_size(), o.hidden_size(), o.enable_bias()));
  }
  at::Tensor forward(const at::Tensor& x, const ForwardArgs& args, size_t layer) {
    auto split = [&](const at::Tensor& t) { return layers::split_heads(t, head_dim).transpose(1, 2); };
    // HF scales q after its bias; attention() scales by 1/sqrt(head_dim) the same way.
    auto y = layers::attention(split(q_proj(x)), split(k_proj(x)), split(v_proj(x)), args, layer,
                               is_training() ? dropout : 0.0);
    return out_proj(y);
  }
  int64_t heads, head_dim;
  double dropout;
  layers::Linear k_proj{nullptr}, v_proj{nullptr}, q_proj{nullptr}, out_proj{nullptr};
};

struct Layer : torch::nn::Module {
  explicit Layer(const OPTOptions& o) : pre_ln(o.do_layer_norm_before()), act(o.activation_function()) {
    self_attn = register_module("self_attn", std::make_shared<Attention>(o));
    self_attn_layer_norm = register_module("self_attn_layer_norm", layer_norm(o));
    fc1 = register_module("fc1", linear(o.hidden_size(), o.ffn_dim(), o.enable_bias()));
    fc2 = register_module("fc2", linear(o.ffn_dim(), o.hidden_size(), o.enable_bias()));
    final_layer_norm = register_module("final_layer_norm", layer_norm(o));
    drop = register_module("dropout", torch::nn::Dropout(o.dropout()));
  }
  at::Tensor forward(const at::Tensor& x, const ForwardArgs& args, size_t layer) {
    auto h = x + drop(self_attn->forward(pre_ln ? layers::layer_norm(self_attn_layer_norm, x) : x, args, layer));
    if (!pre_ln) h = layers::layer_norm(self_attn_layer_norm, h);
    auto out = h + drop(fc2(layers::activation(fc1(pre_ln ? layers::layer_norm(final_layer_norm, h) : h), act)));
    return pre_ln ? out : layers::layer_norm(final_layer_norm, out);
  }
  bool pre_ln;
  std::string act;
  std::shared_ptr<Attention> self_attn;
  layers::LayerNorm self_attn_layer_norm{nullptr}, final_layer_norm{nullptr};
  layers::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};

}  // namespace

struct OPTForCausalLM::Decoder : torch::nn::Module {
  explicit Decoder(const OPTOptions& o) : max_positions(o.max_position_embeddings()) {
    auto emb = torch::nn::EmbeddingOptions(o.vocab_size(), o.word_embed_proj_dim());
    if (o.padding_idx() >= 0) emb.padding_idx(o.padding_idx());
    embed_tokens = register_module("embed_tokens", layers::Embedding(emb));
    embed_positions = register_module(
        "embed_positions", layers::Embedding(o.max_position_embeddings() + kPositionOffset, o.hidden_size()));
    if (o.do_layer_norm_before() && !o.remove_final_layer_norm())
      final_layer_norm = register_module("final_layer_norm", layer_norm(o));
    if (o.word_embed_proj_dim() != o.hidden_size()) {
      project_out = register_module("project_out", linear(o.hidden_size(), o.word_embed_proj_dim(), false));
      project_in = register_module("project_in", linear(o.word_embed_proj_dim(), o.hidden_size(), false));
    }
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.num_hidden_layers(); ++i) layers->push_back(std::make_shared<Layer>(o));
    drop = register_module("dropout", torch::nn::Dropout(o.dropout()));
  }
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args) {
    const auto B = input_ids.size(0), T = input_ids.size(1);
    const int64_t past = args.cache ? args.cache->length : 0;
    TORCH_CHECK(past + T <= max_positions, "sequence of ", past + T,
                " tokens exceeds max_position_embeddings=", max_positions);
    auto x = embed_tokens(input_ids);
    if (project_in) x = project_in(x);
    x = drop(x + embed_positions(layers::positions(args, B, T, input_ids.device()) + kPositionOffset));
    for (size_t i = 0; i < layers->size(); ++i) {
      auto layer = layers[i]->as<Layer>();
      x = layers::run_block(args, i, x, [layer, args, i](const at::Tensor& t) { return layer->forward(t, args, i); });
    }
    if (args.cache) args.cache->advance(T);
    if (final_layer_norm) x = layers::layer_norm(final_layer_norm, x);
    return project_out ? project_out(x) : x;
  }
  int64_t max_positions;
  layers::Embedding embed_tokens{nullptr}, embed_positions{nullptr};
  layers::LayerNorm final_layer_norm{nullptr};
  layers::Linear project_out{nullptr}, project_in{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Dropout drop{nullptr};
};

namespace {
/// HF's `model` submodule: only the decoder.
struct ModelHolder : torch::nn::Module {
  template <class T>
  std::shared_ptr<T> add(const std::string& name, std::shared_ptr<T> m) {
    return register_module(name, std::move(m));
  }
};
}  // namespace

OPTForCausalLM::OPTForCausalLM(const OPTOptions& o) : options(o) {
  TORCH_CHECK(o.hidden_size() % o.num_attention_heads() == 0, "num_attention_heads must divide hidden_size");
  auto holder = std::make_shared<ModelHolder>();
  auto decoder = holder->add("decoder", std::make_shared<Decoder>(o));
  decoder_ = decoder.get();
  model_ = register_module("model", holder);
  if (!o.tie_word_embeddings())
    lm_head_ = register_module(
        "lm_head", layers::Dense(torch::nn::LinearOptions(o.word_embed_proj_dim(), o.vocab_size()).bias(false)));
  if (!init_skipped()) init_parameters(*this);  // loading weights: they overwrite it (models/init.h)
}

at::Tensor OPTForCausalLM::forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) {
  return decoder_->forward(input_ids, args);
}

std::vector<std::string> OPTForCausalLM::input_embedding_parameters() const {
  if (options.word_embed_proj_dim() != options.hidden_size()) return {};
  return {"model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight"};
}

CausalLM::OutputHead OPTForCausalLM::output_head() {
  if (!lm_head_) return {decoder_->embed_tokens->weight, {}};  // tied
  return {lm_head_->weight, lm_head_->bias};
}

std::optional<ParameterInit> OPTForCausalLM::parameter_init(const std::string& name) const {
  if (name.find("layer_norm.") != std::string::npos)
    return ParameterInit::constant(name.ends_with("weight") ? 1.0 : 0.0);
  if (name.ends_with("bias")) return ParameterInit::constant(0.0);
  return ParameterInit::normal(options.init_std(), name == embedding_parameter() ? options.padding_idx() : int64_t{-1});
}

nlohmann::json OPTForCausalLM::hf_config() const {
  auto o = options;
  nlohmann::json j = {{"architectures", {"OPTForCausalLM"}}, {"model_type", "opt"}, {"torch_dtype", "float32"}};
  HfKeyWriter keys(j);
  o.visit_hf(keys);
  write_hf_special_tokens(j, special_tokens);
  if (o.padding_idx() >= 0) j["pad_token_id"] = o.padding_idx();
  return j;
}

std::string OPTForCausalLM::checkpoint_key(const std::string& name) const {
  if (name == "lm_head.weight") return options.tie_word_embeddings() ? "" : name;  // tied: not in the files
  return name;
}

}  // namespace anvil::models::opt
