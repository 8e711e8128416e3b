#pragma once
// The config.json names that model families give a `model:` key other than
// the key's own (our keys are transformers' names, LLaMA's where families
// differ). The registry writes a model section under all of them, so each
// family's config.json list reads the section (src/models/registry.cpp), and
// an unknown model key that is one of them is answered with ours
// (suggest.cpp). Internal to src/.

#include <vector>

namespace anvil::config {

struct HfName {
  const char* name;   // config.json's ("n_embd")
  const char* key;    // ours, in the model section ("hidden_size")
  const char* whose;  // for messages ("GPT-2's")
};

inline const std::vector<HfName>& model_hf_names() {
  static const std::vector<HfName> names = {
      {"n_layer", "num_hidden_layers", "GPT-2's"},
      {"n_head", "num_attention_heads", "GPT-2's"},
      {"n_embd", "hidden_size", "GPT-2's"},
      {"n_positions", "max_position_embeddings", "GPT-2's"},
      {"n_inner", "intermediate_size", "GPT-2's"},
      {"ffn_dim", "intermediate_size", "OPT's"},
      {"layer_norm_epsilon", "layer_norm_eps", "GPT-2's"},
      {"rms_norm_eps", "layer_norm_eps", "LLaMA's"},
      {"activation_function", "hidden_act", "GPT-2's and OPT's"},
      {"hidden_activation", "hidden_act", "Gemma's"},
      {"resid_pdrop", "dropout", "GPT-2's and Phi-3's"},
      {"embd_pdrop", "dropout", "GPT-2's"},
      {"attn_pdrop", "dropout", "GPT-2's"},
      {"hidden_dropout", "dropout", "GPT-NeoX's"},
      {"attention_dropout", "dropout", "LLaMA's, GPT-NeoX's, OPT's and Gemma's"},
      {"init_std", "initializer_range", "OPT's"},
      {"num_local_experts", "num_experts", "Mixtral's"},
      {"rotary_emb_base", "rope_theta", "Pythia's"},
  };
  return names;
}

}  // namespace anvil::config
