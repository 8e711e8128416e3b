// The LLaMA-like architectures, one row each: what their HF config.json
// holds and how their modules differ (llama/llama.h, LlamaVariant).
#include "anvil/core/error.h"
#include "models/llama/llama.h"

namespace anvil::models::llama {

using Windows = LlamaVariant::Windows;
using Experts = LlamaVariant::Experts;

const std::vector<LlamaVariant>& variants() {
  static const std::vector<LlamaVariant> rows = {
      {.model_type = "llama",
       .architecture = "LlamaForCausalLM",
       .display_name = "LLaMA",
       .attention_bias_key = true,
       .mlp_bias_key = true},
      {.model_type = "qwen2",
       .architecture = "Qwen2ForCausalLM",
       .display_name = "Qwen2",
       .qkv_bias = true,
       .head_dim_key = false,
       .windows = Windows::kQwenLayers,
       .window_default = 4096},
      {.model_type = "qwen3",
       .architecture = "Qwen3ForCausalLM",
       .display_name = "Qwen3",
       .qk_norm = true,
       .attention_bias_key = true,
       .head_dim_default = 128,
       .windows = Windows::kQwenLayers,
       .window_default = 4096},
      {.model_type = "mistral",
       .architecture = "MistralForCausalLM",
       .display_name = "Mistral",
       .windows = Windows::kEveryLayer,
       .window_default = 4096},
      {.model_type = "phi3",
       .architecture = "Phi3ForCausalLM",
       .display_name = "Phi-3",
       .fused_projections = true,
       .partial_rotary = true,
       .residual_dropout = true,
       .rms_norm_eps_default = 1e-5,
       .windows = Windows::kEveryLayer,
       .original_max_positions_default = 4096},
      {.model_type = "mixtral",
       .architecture = "MixtralForCausalLM",
       .display_name = "Mixtral",
       .windows = Windows::kEveryLayer,
       .experts = Experts::kMixtral},
      {.model_type = "qwen3_moe",
       .architecture = "Qwen3MoeForCausalLM",
       .display_name = "Qwen3-MoE",
       .qk_norm = true,
       .attention_bias_key = true,
       .windows = Windows::kQwenLayers,
       .window_default = 4096,
       .experts = Experts::kQwen3Moe},
  };
  return rows;
}

const LlamaVariant& variant(const std::string& model_type) {
  std::string known;
  for (const auto& v : variants()) {
    if (v.model_type == model_type) return v;
    known += (known.empty() ? "" : ", ") + std::string(v.model_type);
  }
  throw Error(concat("llama: model_type \"", model_type, "\" is not a LLaMA variant; expected one of ", known));
}

}  // namespace anvil::models::llama
