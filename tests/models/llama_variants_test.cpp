// LLaMA's variants (Qwen2, Qwen3, Mistral, Phi-3, Mixtral, Qwen3-MoE) are rows
// of one table (src/models/llama/variants.cpp): each row is a registered
// family whose config.json holds what the row says, and the messages about a
// key a variant does not read come from the rows.
#include <gtest/gtest.h>

#include <string>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/models/registry.h"
#include "models/llama/llama.h"

namespace anvil::models {
namespace {

config::ModelConfig tiny(const std::string& family) {
  config::ModelConfig mc;
  mc.family = family;
  mc.vocab_size = 50, mc.hidden_size = 32, mc.num_hidden_layers = 2, mc.num_attention_heads = 4,
  mc.max_position_embeddings = 16;
  return mc;
}

std::string error_of(const config::ModelConfig& mc) {
  try {
    family_by_name(mc.family).from_config(mc);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaVariants, EachRowIsAFamilyWhoseConfigJsonHoldsWhatTheRowSays) {
  using V = llama::LlamaVariant;
  ASSERT_EQ(llama::variants().size(), 7u);
  for (const auto& v : llama::variants()) {
    SCOPED_TRACE(v.model_type);
    const auto& family = family_by_name(v.model_type);
    EXPECT_EQ(family.model_type, v.model_type);
    const auto j = family.from_config(tiny(v.model_type))->hf_config();
    EXPECT_EQ(j.at("architectures").at(0).get<std::string>(), v.architecture);
    EXPECT_EQ(j.at("model_type").get<std::string>(), v.model_type);
    EXPECT_EQ(j.contains("attention_bias"), v.attention_bias_key);
    EXPECT_EQ(j.contains("mlp_bias"), v.mlp_bias_key);
    EXPECT_EQ(j.contains("head_dim"), v.head_dim_key);
    EXPECT_EQ(j.contains("sliding_window"), v.windows != V::Windows::kNone);
    EXPECT_EQ(j.contains("use_sliding_window"), v.windows == V::Windows::kQwenLayers);
    EXPECT_EQ(j.contains("partial_rotary_factor"), v.partial_rotary);
    EXPECT_EQ(j.contains("resid_pdrop"), v.residual_dropout);
    EXPECT_EQ(j.contains("num_local_experts"), v.experts == V::Experts::kMixtral);
    EXPECT_EQ(j.contains("moe_intermediate_size"), v.experts == V::Experts::kQwen3Moe);
    // The folder's config.json builds the same model back.
    EXPECT_EQ(family_by_hf_model_type(v.model_type, "test").from_hf_config(j, "test")->hf_config(), j);
  }
  EXPECT_THROW(llama::variant("gpt2"), Error);
}

TEST(LlamaVariants, AKeyAVariantDoesNotReadIsNamedWithTheVariantsThatDo) {
  auto mc = tiny("llama");
  mc.keys.get<ExpertKeys>().num_experts = 4;
  EXPECT_EQ(error_of(mc), "model.num_experts: llama has no experts; mixtral and qwen3_moe do");
  mc = tiny("qwen2");
  mc.keys.get<AttentionKeys>().attention_bias = true;
  EXPECT_EQ(
      error_of(mc),
      "model.attention_bias: qwen2 has biases on q, k and v (not on o_proj) by its definition; leave the key out");
  mc = tiny("mistral");
  mc.keys.get<AttentionKeys>().attention_bias = true;
  EXPECT_EQ(error_of(mc), "model.attention_bias: mistral has no attention biases; leave the key out");
  mc = tiny("mistral");
  mc.keys.get<RotaryKeys>().partial_rotary_factor = 0.5;
  EXPECT_EQ(error_of(mc), "model.partial_rotary_factor: partial rotary applies to neox and phi3, not mistral");
}

}  // namespace
}  // namespace anvil::models
