// OPT's entry in the model registry: our typed config and HF config.json
// (OPTConfig, transformers 4 and 5) both map onto OPTOptions.
#include "../hf_config_reader.h"
#include "models/layers.h"
#include "models/opt.h"
#include "anvil/models/registry.h"

namespace anvil::models::opt {
namespace {

std::shared_ptr<CausalLM> from_config(const config::ModelConfig& c) {
  OPTOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .ffn_dim(c.intermediate_size > 0 ? c.intermediate_size : 4 * c.hidden_size)
      .num_hidden_layers(c.num_layers)
      .num_attention_heads(c.num_heads)
      .max_position_embeddings(c.max_position_embeddings)
      .word_embed_proj_dim(c.embed_proj_dim > 0 ? c.embed_proj_dim : c.hidden_size)
      .do_layer_norm_before(c.pre_layer_norm)
      .enable_bias(c.linear_bias)
      .layer_norm_elementwise_affine(c.layer_norm_affine)
      .remove_final_layer_norm(!c.final_layer_norm)
      .activation_function(c.activation == "auto" ? "relu" : c.activation)
      .tie_word_embeddings(c.tie_embeddings != "false")
      .dropout(c.dropout)
      .attention_dropout(c.dropout)
      .init_std(c.initializer_range);
  return std::make_shared<OPTForCausalLM>(o);
}

std::shared_ptr<CausalLM> from_hf_config(const nlohmann::json& j, const std::string& where) {
  HfConfigReader r(j, where, "OPT");
  OPTOptions o;
  o.vocab_size(r.integer("vocab_size"))
      .hidden_size(r.integer("hidden_size"))
      .ffn_dim(r.integer("ffn_dim"))
      .num_hidden_layers(r.integer("num_hidden_layers"))
      .num_attention_heads(r.integer("num_attention_heads"))
      .max_position_embeddings(r.integer("max_position_embeddings", 2048))
      .do_layer_norm_before(r.boolean("do_layer_norm_before", true))
      .enable_bias(r.boolean("enable_bias", true))
      .layer_norm_elementwise_affine(r.boolean("layer_norm_elementwise_affine", true))
      .remove_final_layer_norm(r.boolean("_remove_final_layer_norm", false))
      .activation_function(r.string("activation_function", "relu"))
      .tie_word_embeddings(r.boolean("tie_word_embeddings", true))
      .dropout(r.number("dropout", 0.1, HfConfigReader::Bound::probability))
      .attention_dropout(r.number("attention_dropout", 0.0, HfConfigReader::Bound::probability))
      .init_std(r.number("init_std", 0.02));
  o.word_embed_proj_dim(r.integer("word_embed_proj_dim", o.hidden_size()));
  if (o.hidden_size() % o.num_attention_heads() != 0)
    r.fail("num_attention_heads", concat(o.num_attention_heads(), " does not divide hidden_size ", o.hidden_size()));
  if (!layers::is_supported_activation(o.activation_function()))
    r.fail("activation_function", concat("\"", o.activation_function(), "\" is not supported"));
  auto special = r.special_tokens();
  o.padding_idx(r.padding_idx(special, o.vocab_size()));
  auto model = std::make_shared<OPTForCausalLM>(o);
  model->special_tokens = special;
  return model;
}

}  // namespace

ModelFamily family() {
  ModelFamily f{"opt", "opt", from_config, from_hf_config};
  // Of the keys only some families read: OPT's layer-norm placement, projections and biases.
  f.config_keys = {"model.pre_layer_norm", "model.embed_proj_dim", "model.linear_bias", "model.layer_norm_affine",
                   "model.final_layer_norm"};
  return f;
}

}  // namespace anvil::models::opt
