#include "train/trained_parameters.h"

#include <algorithm>
#include <unordered_set>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "optim/optimizer.h"

namespace anvil::train {

TrainedParameters trained_parameters(models::CausalLM& model, const Trains& trains, const std::string& who,
                                     const config::OptimizerConfig& opt) {
  const auto exempt = optim::no_decay_parameters(opt, model);
  const std::unordered_set<std::string> no_decay(exempt.begin(), exempt.end());
  TrainedParameters out;
  for (auto& p : model.named_parameters()) {
    if (trains(p.key())) {
      out.all.push_back(p.value());
      (no_decay.count(p.key()) ? out.not_decayed : out.decayed).push_back(p.value());
    } else {
      p.value().set_requires_grad(false);
    }
  }
  if (out.all.empty()) throw ConfigError(concat(who, " trains none of the model's parameters"));
  return out;
}

void log_trainable(models::CausalLM& model, const Trains& trains) {
  int64_t all = 0, trained = 0;
  for (const auto& p : model.named_parameters()) {
    all += p.value().numel();
    if (trains(p.key())) trained += p.value().numel();
  }
  const double pct = 100.0 * static_cast<double>(trained) / static_cast<double>(std::max<int64_t>(all, 1));
  log::info("lora: trainable params: ", trained, " || all params: ", all, " || trainable%: ", pct);
}

}  // namespace anvil::train
