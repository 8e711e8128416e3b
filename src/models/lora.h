#pragma once
// LoRA adapters (Hu et al. 2021) as PEFT builds them: a target linear layer
// computes W x + b + (alpha / r) * B(A(dropout(x))) with A (r, in) initialised
// like nn.Linear (kaiming-uniform) and B (out, r) zero, so training starts
// from the base model exactly. The adapter's parameters are the layer's
// "lora_A.weight" and "lora_B.weight", so a parameter's name is PEFT's key
// without its "base_model.model." prefix. The base weights stay as loaded;
// io/peft.h reads and writes PEFT adapter folders. docs/lora.md.

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

namespace anvil::models {

class CausalLM;

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8;
  double dropout = 0;
  /// Last parts of the target layers' names ("q_proj"), or {"all-linear"}.
  std::vector<std::string> target_modules;
  /// The base model's folder (adapter_config.json's base_model_name_or_path).
  std::string base_model;
};

/// A linear layer of a transformer block that can carry an adapter
/// (layers::Linear, gpt2::Conv1D). The family calls with_adapter() on its
/// output; add_lora() installs the adapter.
class LoraLayer {
 public:
  virtual ~LoraLayer() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  /// Adds scale * (B A) to the base weight (Conv1D's transposed layout).
  virtual void add_to_weight(const at::Tensor& delta_out_in) = 0;

  bool has_adapter() const { return !lora_A.is_empty(); }
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  double lora_scaling = 0;
  double lora_dropout = 0;
  bool lora_enabled = true;
  std::string lora_base_model;

 protected:
  /// `base` + scaling * B(A(dropout(x))) when an enabled adapter is present.
  at::Tensor with_adapter(const at::Tensor& x, const at::Tensor& base, bool training) const;
};

/// The distinct last name parts of the model's adaptable layers, sorted.
std::vector<std::string> lora_target_names(CausalLM& model);

/// Installs adapters on every adaptable layer of the blocks whose last name
/// part is in o.target_modules (empty: the family's default). Throws
/// ConfigError naming `key` and the model's layer names when a target
/// matches nothing, or when the model already has adapters. Returns the
/// resolved target names. New parameters are on the model's device, float32.
std::vector<std::string> add_lora(CausalLM& model, LoraOptions o, const std::string& key = "lora.target_modules");

bool has_lora(CausalLM& model);
/// The options the installed adapters were built with (target_modules: the
/// layers that have one).
LoraOptions lora_options(CausalLM& model);
/// Whether `name` is an adapter parameter ("...lora_A.weight").
bool is_lora_parameter(const std::string& name);
/// Whether a model with adapters trains `name`: the adapters, the named heads
/// ("heads.": PPO's value head, ILQL's Q and V) and a reward model's score
/// head; the base is frozen.
bool lora_trains(const std::string& name);

/// Turns every adapter on or off (a DPO reference is the base model: the
/// policy with adapters off).
void set_lora_enabled(CausalLM& model, bool enabled);

/// Keeps adapters off while it lives.
class LoraDisabled {
 public:
  explicit LoraDisabled(CausalLM& model);
  ~LoraDisabled();
  LoraDisabled(const LoraDisabled&) = delete;
  LoraDisabled& operator=(const LoraDisabled&) = delete;

 private:
  CausalLM* model_;
  bool active_;
};

/// Folds each adapter into its base weight (W += scaling * B A) and removes
/// the adapters: a plain model with the adapted outputs.
void merge_lora(CausalLM& model);

}  // namespace anvil::models
