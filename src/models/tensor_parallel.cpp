// The families' tensor-parallel plans (models/tensor_parallel.h): Megatron's
// split of each transformer block, named as Hugging Face names the layers.
#include "models/tensor_parallel.h"

#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"

namespace anvil::models {
namespace {

int64_t number(const nlohmann::json& j, const char* key, int64_t fallback) {
  return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
}

ParallelRule column(std::string name, std::vector<int64_t> parts, int64_t granule, std::string unit) {
  return {std::move(name), ParallelStyle::kColumn, std::move(parts), granule, std::move(unit)};
}
ParallelRule row(std::string name, int64_t granule, std::string unit) {
  return {std::move(name), ParallelStyle::kRow, {}, granule, std::move(unit)};
}

thread_local SequenceScope* innermost = nullptr;

}  // namespace

SequenceScope::SequenceScope(int64_t length) : length_(length), outer_(innermost) { innermost = this; }
SequenceScope::~SequenceScope() { innermost = outer_; }
SequenceScope* SequenceScope::current() { return innermost; }

at::Tensor SequenceScope::remembered(const at::Tensor& x) const {
  // The input is held, so its address cannot be reused by another tensor while remembered.
  if (input_.defined() && input_.unsafeGetTensorImpl() == x.unsafeGetTensorImpl() && x._version() == version_)
    return gathered_;
  return {};
}

void SequenceScope::remember(const at::Tensor& x, const at::Tensor& gathered) {
  input_ = x;
  gathered_ = gathered;
  version_ = x._version();
}

std::vector<ParallelRule> tensor_parallel_plan(const CausalLM& model) {
  const auto family = model.family();
  const auto c = model.hf_config();
  if (family == "gpt2") {
    const auto C = number(c, "n_embd", 0), H = number(c, "n_head", 1), D = C / H;
    return {column("attn.c_attn", {C, C, C}, D, "attention heads"), row("attn.c_proj", D, "attention heads"),
            column("mlp.c_fc", {}, 1, "MLP features"), row("mlp.c_proj", 1, "MLP features")};
  }
  if (family == "neox") {
    const auto D = number(c, "hidden_size", 0) / number(c, "num_attention_heads", 1);
    // query_key_value holds [q_h, k_h, v_h] per head, heads back to back: whole heads are 3 * D rows.
    return {column("attention.query_key_value", {}, 3 * D, "attention heads"),
            row("attention.dense", D, "attention heads"), column("mlp.dense_h_to_4h", {}, 1, "MLP features"),
            row("mlp.dense_4h_to_h", 1, "MLP features")};
  }
  if (family == "opt") {
    const auto D = number(c, "hidden_size", 0) / number(c, "num_attention_heads", 1);
    // Qwen3's and Gemma 3's q/k norms weigh each head's features: a rank's heads give a share of their gradient.
    return {{"self_attn.q_norm", ParallelStyle::kPartialGradient, {}, 1, ""},
            {"self_attn.k_norm", ParallelStyle::kPartialGradient, {}, 1, ""},
            column("self_attn.q_proj", {}, D, "attention heads"),
            column("self_attn.k_proj", {}, D, "attention heads"),
            column("self_attn.v_proj", {}, D, "attention heads"),
            row("self_attn.out_proj", D, "attention heads"),
            column("fc1", {}, 1, "MLP features"),
            row("fc2", 1, "MLP features")};
  }
  // LLaMA's layout: LLaMA, Qwen2/3, Mistral, Phi-3 (fused projections), Mixtral and Qwen3-MoE (experts whole),
  // Gemma 2/3.
  const auto heads = number(c, "num_attention_heads", 0);
  if (heads == 0) throw ConfigError(concat("tensor parallelism: no plan for the ", family, " family"));
  const auto kv = number(c, "num_key_value_heads", heads);
  const auto D = number(c, "head_dim", number(c, "hidden_size", 0) / heads);
  const auto I = number(c, "intermediate_size", 0);
  // Qwen3's and Gemma 3's q/k norms weigh each head's features: a rank's heads give a share of their gradient.
  return {{"self_attn.q_norm", ParallelStyle::kPartialGradient, {}, 1, ""},
          {"self_attn.k_norm", ParallelStyle::kPartialGradient, {}, 1, ""},
          column("self_attn.q_proj", {}, D, "attention heads"),
          column("self_attn.k_proj", {}, D, "key/value heads"),
          column("self_attn.v_proj", {}, D, "key/value heads"),
          column("self_attn.qkv_proj", {heads * D, kv * D, kv * D}, D, "attention and key/value heads"),
          row("self_attn.o_proj", D, "attention heads"),
          column("mlp.gate_proj", {}, 1, "MLP features"),
          column("mlp.up_proj", {}, 1, "MLP features"),
          column("mlp.gate_up_proj", {I, I}, 1, "MLP features"),
          row("mlp.down_proj", 1, "MLP features")};
}

}  // namespace anvil::models
