#pragma once
// An Objective is a training algorithm: it turns a batch into a loss and
// knows how to evaluate. The loop (trainer.h) is shared by all of them and
// owns accumulation, clipping, stepping, eval scheduling and checkpoints.

#include <ATen/core/Tensor.h>

#include <array>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/core/metrics.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::train {

/// A micro-batch: named CPU tensors plus the count of units the loss sums
/// over (target tokens for SFT), which the loop uses to normalise.
struct Batch {
  std::map<std::string, at::Tensor> tensors;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;  // input tokens, for throughput
};

/// A deterministic, resumable stream of training micro-batches.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& state) = 0;
};

/// One evaluation's scalars (named "eval/...") and sample rows
/// (prompt, generated, reference) to print.
struct EvalResult {
  Metrics metrics;
  std::vector<std::array<std::string, 3>> samples;
};

class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;

  /// The loss summed over the batch's `num_targets` units (not averaged).
  virtual at::Tensor loss_sum(models::CausalLM& model, const Batch& batch) = 0;
  /// Evaluates on held-out data; an empty result when there is none.
  virtual EvalResult evaluate(models::CausalLM& model) = 0;
  virtual BatchSource& train_source() = 0;
};

/// Builds the objective named by `cfg.algorithm` (one registration line each).
std::unique_ptr<Objective> make_objective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);

}  // namespace anvil::train
