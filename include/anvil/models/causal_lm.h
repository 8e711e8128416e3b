#pragma once
// What every decoder-only family provides to trainers and generation.

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::models {

/// Per-layer attention keys/values of the tokens seen so far. (B, H, T, D)
struct KVCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
};

/// Token ids the model's config.json records.
struct SpecialTokens {
  int64_t bos = -1;
  int64_t eos = -1;
  int64_t pad = -1;
};

class CausalLM : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  /// (B, T) token ids -> (B, T, V) logits. With `cache`, positions continue
  /// after the cached tokens and the cache is extended.
  virtual at::Tensor forward(const at::Tensor& input_ids, KVCache* cache = nullptr) = 0;

  virtual std::string family() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_positions() const = 0;
  virtual int64_t num_layers() const = 0;

  /// Hugging Face config.json for this model (architectures, model_type, ...).
  virtual nlohmann::json hf_config() const = 0;
  /// Checkpoint keys that may be present in HF files but are not parameters
  /// here (tied heads, legacy buffers).
  virtual bool ignorable_checkpoint_key(const std::string& name) const { return false; }

  SpecialTokens special_tokens;
};

}  // namespace anvil::models
