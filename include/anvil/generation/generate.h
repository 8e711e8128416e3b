#pragma once
// Autoregressive decoding with a KV cache.

#include <cstdint>
#include <vector>

#include "anvil/models/causal_lm.h"

namespace anvil::generation {

struct SamplingOptions {
  int64_t max_new_tokens = 32;
  bool greedy = true;
  double temperature = 1.0;
  int64_t top_k = 0;     // 0 = off
  double top_p = 1.0;    // 1 = off
  int64_t eos_id = -1;   // stop when produced (kept in the output)
  uint64_t seed = 0;     // sampling RNG; the global RNG is never touched
};

/// Continues each prompt; returns only the new tokens of each. The model is
/// put in eval mode for the call and restored afterwards.
std::vector<std::vector<int64_t>> generate(models::CausalLM& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt);

/// Picks the next token from (V) logits per the options.
int64_t sample_next(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen);

}  // namespace anvil::generation
