#pragma once
// Supervised fine-tuning: next-token cross-entropy on response tokens (+EOS).

#include <memory>

#include "anvil/data/sampler.h"
#include "anvil/data/sft_dataset.h"
#include "anvil/train/objective.h"

namespace anvil::train {

/// Cross-entropy of next-token prediction summed over labels != ignore.
/// logits (B, T, V), labels (B, T) aligned with the inputs.
at::Tensor causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

class SftBatchSource final : public BatchSource {
 public:
  SftBatchSource(std::shared_ptr<const data::SftDataset> ds, int64_t micro_batch_size, uint64_t seed,
                 int64_t pad_id);
  Batch next() override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;

 private:
  std::shared_ptr<const data::SftDataset> ds_;
  data::EpochSampler sampler_;
  int64_t micro_batch_size_;
  int64_t pad_id_;
};

class SftObjective final : public Objective {
 public:
  SftObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok);
  std::string name() const override { return "sft"; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch) override;
  EvalResult evaluate(models::CausalLM& model) override;
  BatchSource& train_source() override { return *source_; }

 private:
  config::EvalConfig eval_cfg_;
  const tokenizer::Tokenizer& tok_;
  std::shared_ptr<const data::SftDataset> eval_;
  std::unique_ptr<SftBatchSource> source_;
};

}  // namespace anvil::train
