// GPT-2's entry in the model registry: our typed config and HF config.json
// both map onto GPT2Options.
#include "anvil/core/error.h"
#include "anvil/models/gpt2.h"
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
  auto get_int = [&](const char* key, int64_t def, bool required) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) throw CheckpointError(concat(where, ": ", key, ": required GPT-2 field is missing"));
      return def;
    }
    if (!j[key].is_number_integer()) throw CheckpointError(concat(where, ": ", key, ": expected an integer"));
    return j[key].get<int64_t>();
  };
  auto get_double = [&](const char* key, double def) -> double {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number()) throw CheckpointError(concat(where, ": ", key, ": expected a number"));
    return j[key].get<double>();
  };
  if (j.value("activation_function", std::string("gelu_new")) != "gelu_new")
    throw CheckpointError(concat(where, ": activation_function: only gelu_new is supported, got ",
                                 j["activation_function"].dump()));
  if (!j.value("tie_word_embeddings", true))
    throw CheckpointError(concat(where, ": tie_word_embeddings: untied GPT-2 heads are not supported"));
  if (j.value("scale_attn_by_inverse_layer_idx", false) || j.value("reorder_and_upcast_attn", false))
    throw CheckpointError(concat(where, ": scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported"));
  GPT2Options o;
  o.vocab_size(get_int("vocab_size", 50257, true))
      .n_positions(get_int("n_positions", 1024, false))
      .n_embd(get_int("n_embd", 768, true))
      .n_layer(get_int("n_layer", 12, true))
      .n_head(get_int("n_head", 12, true))
      .n_inner(get_int("n_inner", 0, false))
      .resid_pdrop(get_double("resid_pdrop", 0.1))
      .embd_pdrop(get_double("embd_pdrop", 0.1))
      .attn_pdrop(get_double("attn_pdrop", 0.1))
      .layer_norm_epsilon(get_double("layer_norm_epsilon", 1e-5))
      .initializer_range(get_double("initializer_range", 0.02));
  if (o.n_embd() % o.n_head() != 0)
    throw CheckpointError(concat(where, ": n_head (", o.n_head(), ") must divide n_embd (", o.n_embd(), ")"));
  auto model = std::make_shared<GPT2LMHeadModel>(o);
  model->special_tokens = {get_int("bos_token_id", -1, false), get_int("eos_token_id", -1, false),
                           get_int("pad_token_id", -1, false)};
  return model;
}

}  // namespace

ModelFamily family() { return {"gpt2", "gpt2", from_config, from_hf_config}; }

}  // namespace anvil::models::gpt2
