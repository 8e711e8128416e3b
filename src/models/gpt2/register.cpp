// GPT-2's entry in the model registry: our typed config and HF config.json
// both map onto GPT2Options.
#include "../hf_config_reader.h"
#include "models/gpt2/gpt2.h"
#include "anvil/models/registry.h"

namespace anvil::models::gpt2 {
namespace {

std::shared_ptr<CausalLM> from_config(const config::ModelConfig& c) {
  GPT2Options o;
  o.vocab_size(c.vocab_size)
      .n_positions(c.max_position_embeddings)
      .n_embd(c.hidden_size)
      .n_layer(c.num_layers)
      .n_head(c.num_heads)
      .n_inner(c.intermediate_size)
      .resid_pdrop(c.dropout)
      .embd_pdrop(c.dropout)
      .attn_pdrop(c.dropout)
      .layer_norm_epsilon(c.layer_norm_eps)
      .initializer_range(c.initializer_range);
  return std::make_shared<GPT2LMHeadModel>(o);
}

std::shared_ptr<CausalLM> from_hf_config(const nlohmann::json& j, const std::string& where) {
  HfConfigReader r(j, where, "GPT-2");
  if (r.string("activation_function", "gelu_new") != "gelu_new")
    r.fail("activation_function", concat("only gelu_new is supported, got ", j["activation_function"].dump()));
  if (!r.boolean("tie_word_embeddings", true)) r.fail("tie_word_embeddings", "untied GPT-2 heads are not supported");
  if (r.boolean("scale_attn_by_inverse_layer_idx", false) || r.boolean("reorder_and_upcast_attn", false))
    r.fail("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn", "not supported");
  GPT2Options o;
  o.vocab_size(r.integer("vocab_size"))
      .n_positions(r.integer("n_positions", 1024))
      .n_embd(r.integer("n_embd"))
      .n_layer(r.integer("n_layer"))
      .n_head(r.integer("n_head"))
      .n_inner(r.integer("n_inner", 0))
      .resid_pdrop(r.number("resid_pdrop", 0.1, HfConfigReader::Bound::probability))
      .embd_pdrop(r.number("embd_pdrop", 0.1, HfConfigReader::Bound::probability))
      .attn_pdrop(r.number("attn_pdrop", 0.1, HfConfigReader::Bound::probability))
      .layer_norm_epsilon(r.number("layer_norm_epsilon", 1e-5, HfConfigReader::Bound::positive))
      .initializer_range(r.number("initializer_range", 0.02));
  if (o.n_embd() % o.n_head() != 0) r.fail("n_head", concat(o.n_head(), " must divide n_embd (", o.n_embd(), ")"));
  auto model = std::make_shared<GPT2LMHeadModel>(o);
  model->special_tokens = r.special_tokens();
  return model;
}

}  // namespace

ModelFamily family() {
  ModelFamily f{"gpt2", "gpt2", from_config, from_hf_config};
  f.conv1d_weights = true;  // HF GPT-2's Conv1D
  f.check = [](const config::ModelConfig& c, const config::Checks& checks) {
    if (c.tie_embeddings == "false")
      checks.fail("model.tie_embeddings", "GPT-2's output head is always tied to its embedding; expected auto or true");
    if (c.activation != "auto" && c.activation != "gelu_new")
      checks.fail("model.activation", concat("GPT-2 supports only gelu_new (or auto), got ", c.activation));
  };
  return f;
}

}  // namespace anvil::models::gpt2
