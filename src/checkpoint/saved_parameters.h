#pragma once
// Which of a model's parameters its saved folder holds: the rule
// save_weight_files applies, shared with the checkpoint code that copies
// those parameters (and no others) to host memory for a background write.

#include <functional>
#include <string>

#include "anvil/models/causal_lm.h"

namespace anvil::checkpoint {

/// Whether `model`'s folder holds a parameter, by name: not a reward model's
/// LM head (HF's ...ForSequenceClassification has none), and with LoRA
/// adapters only the adapters, the score head and named heads (the base
/// stays in the folder the adapter names).
std::function<bool(const std::string&)> saved_parameters(models::CausalLM& model);

}  // namespace anvil::checkpoint
