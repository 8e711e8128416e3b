#pragma once
// Internal (not installed): the batch source of objectives that make each
// iteration's micro-batches themselves (PPO's rollouts, distill's samples)
// in before_iteration(), drawing prompts from a sampler whose position is
// the source's resumable state.

#include <vector>

#include "anvil/core/error.h"
#include "data/mixture.h"
#include "anvil/train/objective.h"
#include "train/objectives/lm_data.h"
#include "data/datasets.h"

namespace anvil::train {

class StepBatches final : public BatchSource {
 public:
  /// `preview`: what next() gives before any load() (a dry run's plan);
  /// `who` names the objective in errors.
  StepBatches(data::MixtureSampler* prompts, Batch preview, const char* who)
      : prompts_(prompts), preview_(std::move(preview)), who_(who) {}

  /// The iteration's micro-batches, in the order steps read them.
  void load(std::vector<Batch> micro_batches) {
    micro_ = std::move(micro_batches);
    cursor_ = 0;
  }
  Batch next() override {
    if (micro_.empty()) return preview_;
    if (cursor_ >= micro_.size()) throw Error(concat(who_, ": more micro-batches were read than the iteration holds"));
    return micro_[cursor_++];
  }
  nlohmann::json state() const override { return sampler_state(*prompts_); }
  void restore(const nlohmann::json& state) override { restore_sampler(*prompts_, state); }
  int64_t samples_per_epoch() const override { return prompts_->epoch_length(); }

 private:
  data::MixtureSampler* prompts_;
  Batch preview_;
  const char* who_;
  std::vector<Batch> micro_;
  size_t cursor_ = 0;
};

}  // namespace anvil::train
