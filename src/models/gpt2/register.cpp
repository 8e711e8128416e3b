// GPT-2's entry in the model registry: HF config.json (and our model section,
// as one) map onto GPT2Options.
#include "../hf_config_reader.h"
#include "models/gpt2/gpt2.h"
#include "anvil/models/registry.h"

namespace anvil::models::gpt2 {
namespace {

std::shared_ptr<CausalLM> from_hf_config(const nlohmann::json& j, const std::string& where) {
  HfConfigReader r(j, where, "GPT-2");
  GPT2Options o;
  HfKeyReader keys(r);
  o.visit_hf(keys);
  if (o.n_embd() % o.n_head() != 0) r.fail("n_head", concat(o.n_head(), " must divide n_embd (", o.n_embd(), ")"));
  auto model = std::make_shared<GPT2LMHeadModel>(o);
  model->special_tokens = r.special_tokens();
  return model;
}

}  // namespace

ModelFamily family() {
  ModelFamily f{"gpt2", "gpt2", {}, from_hf_config};
  f.conv1d_weights = true;                   // HF GPT-2's Conv1D
  f.config_keys = {"model.layer_norm_eps"};  // of the keys only some families read (OPT's LayerNorms have 1e-5)
  f.check = [](const config::ModelConfig& c, const config::Checks& checks) {
    if (c.tie_word_embeddings == config::Tied::kFalse)
      checks.fail("model.tie_word_embeddings",
                  "GPT-2's output head is always tied to its embedding; expected auto or true");
    if (c.hidden_act != "auto" && c.hidden_act != "gelu_new")
      checks.fail("model.hidden_act", concat("GPT-2 supports only gelu_new (or auto), got ", c.hidden_act));
  };
  return f;
}

}  // namespace anvil::models::gpt2
