// The algorithm registry: one line per objective.
#include "anvil/core/error.h"
#include "anvil/train/objective.h"
#include "anvil/train/preference.h"
#include "anvil/train/sft.h"

namespace anvil::train {

std::unique_ptr<Objective> make_objective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok) {
  if (cfg.algorithm == "sft" || cfg.algorithm == "pretrain") return std::make_unique<LmObjective>(cfg, tok);
  if (cfg.algorithm == "reward") return std::make_unique<RewardObjective>(cfg, tok);
  if (cfg.algorithm == "dpo") return std::make_unique<DpoObjective>(cfg, tok);
  throw ConfigError(concat("algorithm: unknown algorithm \"", cfg.algorithm, "\""));
}

}  // namespace anvil::train
