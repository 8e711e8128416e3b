// GPT-NeoX's entry in the model registry: our typed config and HF config.json
// (Pythia's and transformers 5's spellings) both map onto NeoXOptions.
#include "../hf_config_reader.h"
#include "models/neox/neox.h"
#include "anvil/models/registry.h"

namespace anvil::models::neox {
namespace {

std::shared_ptr<CausalLM> from_config(const config::ModelConfig& c) {
  const int64_t head_dim = c.hidden_size / c.num_attention_heads;
  layers::RopeOptions rope;
  rope.head_dim(head_dim)
      .rotary_dim(static_cast<int64_t>(static_cast<double>(head_dim) * c.partial_rotary_factor))
      .theta(c.rope_theta);
  NeoXOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .intermediate_size(c.intermediate_size > 0 ? c.intermediate_size : 4 * c.hidden_size)
      .num_hidden_layers(c.num_hidden_layers)
      .num_attention_heads(c.num_attention_heads)
      .max_position_embeddings(c.max_position_embeddings)
      .layer_norm_eps(c.layer_norm_eps)
      .rope(rope)
      .use_parallel_residual(c.use_parallel_residual)
      .hidden_act(c.hidden_act == "auto" ? "gelu" : c.hidden_act)
      .tie_word_embeddings(c.tie_word_embeddings == "true")
      .hidden_dropout(c.dropout)
      .attention_dropout(c.dropout)
      .initializer_range(c.initializer_range);
  return std::make_shared<GPTNeoXForCausalLM>(o);
}

std::shared_ptr<CausalLM> from_hf_config(const nlohmann::json& j, const std::string& where) {
  HfConfigReader r(j, where, "GPT-NeoX");
  NeoXOptions o;
  HfKeyReader keys(r);
  o.visit_hf(keys);
  if (o.hidden_size() % o.num_attention_heads() != 0)
    r.fail("num_attention_heads", concat(o.num_attention_heads(), " does not divide hidden_size ", o.hidden_size()));
  if (!layers::is_supported_activation(o.hidden_act()))
    r.fail("hidden_act", concat("\"", o.hidden_act(), "\" is not supported"));
  o.rope(r.rope(o.head_dim(), 10000.0, 0.25));
  auto model = std::make_shared<GPTNeoXForCausalLM>(o);
  model->special_tokens = r.special_tokens();
  return model;
}

}  // namespace

ModelFamily family() {
  ModelFamily f{"neox", "gpt_neox", from_config, from_hf_config};
  // Of the keys only some families read: its rotary base and fraction, and its parallel residual.
  f.config_keys = {"model.rope_theta", "model.partial_rotary_factor", "model.use_parallel_residual"};
  return f;
}

}  // namespace anvil::models::neox
