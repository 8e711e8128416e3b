// OPT's entry in the model registry: our typed config and HF config.json
// (OPTConfig, transformers 4 and 5) both map onto OPTOptions.
#include "../hf_config_reader.h"
#include "models/layers.h"
#include "models/opt/opt.h"
#include "anvil/models/registry.h"

namespace anvil::models::opt {
namespace {

/// OPT's own keys of the model section (model.pre_layer_norm, ...): no other
/// family reads them (config::FamilyKeys::own_keys).
struct OptKeys {
  bool pre_layer_norm = true;
  int64_t embed_proj_dim = 0;
  bool linear_bias = true;
  bool layer_norm_affine = true;
  bool final_layer_norm = true;

  void visit(config::FieldVisitor& v) {
    v.field("pre_layer_norm", pre_layer_norm,
            "opt: LayerNorm before attention and MLP (HF do_layer_norm_before); false = post-LN (opt-350m).");
    v.field("embed_proj_dim", embed_proj_dim,
            "opt: embedding width when it differs from hidden_size, with project_in / project_out (HF "
            "word_embed_proj_dim; opt-350m: 512); 0 = hidden_size.",
            config::non_negative());
    v.field("linear_bias", linear_bias, "opt: biases in attention and MLP (HF enable_bias).");
    v.field("layer_norm_affine", layer_norm_affine,
            "opt: LayerNorm weights and biases (HF layer_norm_elementwise_affine).");
    v.field("final_layer_norm", final_layer_norm,
            "opt: the decoder's final LayerNorm (false = HF _remove_final_layer_norm).");
  }
};

std::shared_ptr<CausalLM> from_config(const config::ModelConfig& c) {
  const auto& own = c.own.get<OptKeys>("opt");
  OPTOptions o;
  o.vocab_size(c.vocab_size)
      .hidden_size(c.hidden_size)
      .ffn_dim(c.intermediate_size > 0 ? c.intermediate_size : 4 * c.hidden_size)
      .num_hidden_layers(c.num_layers)
      .num_attention_heads(c.num_heads)
      .max_position_embeddings(c.max_position_embeddings)
      .word_embed_proj_dim(own.embed_proj_dim > 0 ? own.embed_proj_dim : c.hidden_size)
      .do_layer_norm_before(own.pre_layer_norm)
      .enable_bias(own.linear_bias)
      .layer_norm_elementwise_affine(own.layer_norm_affine)
      .remove_final_layer_norm(!own.final_layer_norm)
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
  f.own_keys = config::family_keys<OptKeys>();  // its layer-norm placement, projections and biases
  return f;
}

}  // namespace anvil::models::opt
