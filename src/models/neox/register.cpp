// GPT-NeoX's entry in the model registry: HF config.json (Pythia's and
// transformers 5's spellings; our model section as one) maps onto NeoXOptions.
#include "../hf_config_reader.h"
#include "models/neox/neox.h"
#include "anvil/models/registry.h"

namespace anvil::models::neox {
namespace {

/// NeoX's own key of the model section, by GPTNeoXConfig's name: no other family reads it.
struct NeoxKeys {
  bool use_parallel_residual = true;

  void visit(config::FieldVisitor& v) {
    v.field("use_parallel_residual", use_parallel_residual,
            "x + attn(ln1(x)) + mlp(ln2(x)) when true, sequential residuals when false.",
            config::renamed_from("parallel_residual"));
  }
};

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
  ModelFamily f{"neox", "gpt_neox", {}, from_hf_config};
  f.section_defaults = [](const config::ModelConfig& c, nlohmann::json& hf) {
    if (c.intermediate_size == 0) hf["intermediate_size"] = 4 * c.hidden_size;
    hf["use_parallel_residual"] = c.keys.get<NeoxKeys>("neox").use_parallel_residual;
  };
  // Of the key groups' keys: its LayerNorm epsilon, rotary base and fraction; its own: parallel residual.
  f.config_keys = {"model.layer_norm_eps", "model.rope_theta", "model.partial_rotary_factor"};
  f.own_keys = config::family_keys<NeoxKeys>();
  return f;
}

}  // namespace anvil::models::neox
