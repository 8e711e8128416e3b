// OPT's entry in the model registry: HF config.json (OPTConfig, transformers 4
// and 5; our model section as one) maps onto OPTOptions.
#include "../hf_config_reader.h"
#include "models/layers.h"
#include "models/opt/opt.h"
#include "anvil/models/registry.h"

namespace anvil::models::opt {
namespace {

/// OPT's own keys of the model section (model.do_layer_norm_before, ...), by
/// OPTConfig's names: no other family reads them (config::FamilyKeys::own_keys).
struct OptKeys {
  bool do_layer_norm_before = true;
  int64_t word_embed_proj_dim = 0;
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  bool final_layer_norm = true;

  void visit(config::FieldVisitor& v) {
    v.field("do_layer_norm_before", do_layer_norm_before,
            "opt: LayerNorm before attention and MLP; false = post-LN (opt-350m).",
            config::renamed_from("pre_layer_norm"));
    v.field("word_embed_proj_dim", word_embed_proj_dim,
            "opt: embedding width when it differs from hidden_size, with project_in / project_out (opt-350m: "
            "512); 0 = hidden_size.",
            config::renamed_from("embed_proj_dim", config::non_negative()));
    v.field("enable_bias", enable_bias, "opt: biases in attention and MLP.", config::renamed_from("linear_bias"));
    v.field("layer_norm_elementwise_affine", layer_norm_elementwise_affine, "opt: LayerNorm weights and biases.",
            config::renamed_from("layer_norm_affine"));
    v.field("final_layer_norm", final_layer_norm,
            "opt: the decoder's final LayerNorm (false = HF _remove_final_layer_norm).");
  }
};

std::shared_ptr<CausalLM> from_hf_config(const nlohmann::json& j, const std::string& where) {
  HfConfigReader r(j, where, "OPT");
  OPTOptions o;
  HfKeyReader keys(r);
  o.visit_hf(keys);
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
  ModelFamily f{"opt", "opt", {}, from_hf_config};
  // Its own keys by OPTConfig's names; 0 and the final norm as the section's docs say.
  f.section_defaults = [](const config::ModelConfig& c, nlohmann::json& hf) {
    const auto& own = c.keys.get<OptKeys>("opt");
    if (c.intermediate_size == 0) hf["ffn_dim"] = 4 * c.hidden_size;
    hf["word_embed_proj_dim"] = own.word_embed_proj_dim > 0 ? own.word_embed_proj_dim : c.hidden_size;
    hf["do_layer_norm_before"] = own.do_layer_norm_before;
    hf["enable_bias"] = own.enable_bias;
    hf["layer_norm_elementwise_affine"] = own.layer_norm_elementwise_affine;
    hf["_remove_final_layer_norm"] = !own.final_layer_norm;
  };
  f.own_keys = config::family_keys<OptKeys>();  // its layer-norm placement, projections and biases
  return f;
}

}  // namespace anvil::models::opt
