#pragma once
// Which of a model's parameters an engine's optimizer steps (Objective::trains,
// LoRA's adapters), and which of those weight decay applies to. Private to
// src/train (the engines, train/engine.cpp).

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"

namespace anvil::train {

/// Whether the optimizer trains the parameter of this HF name.
using Trains = std::function<bool(const std::string&)>;

/// The parameters `trains` accepts, those weight decay applies to first.
struct TrainedParameters {
  std::vector<at::Tensor> all;  // in the model's order
  std::vector<at::Tensor> decayed, not_decayed;
};
/// The model's parameters `trains` accepts; the others are frozen here (no
/// gradient). Throws ConfigError naming `who` when it accepts none.
TrainedParameters trained_parameters(models::CausalLM& model, const Trains& trains, const std::string& who,
                                     const config::OptimizerConfig& opt);

/// PEFT's print_trainable_parameters line, logged.
void log_trainable(models::CausalLM& model, const Trains& trains);

}  // namespace anvil::train
