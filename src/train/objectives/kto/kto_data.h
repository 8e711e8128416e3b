#pragma once
// Internal (not installed): KTO's data (kto.h): unpaired examples read from
// TRL's {prompt, completion, label} records or unpaired from preference
// pairs, and the stream of micro-batches over a mixture of them.

#include <filesystem>
#include <memory>
#include <vector>

#include "data/datasets.h"
#include "data/mixture.h"
#include "train/objectives/kto/kto.h"
#include "train/objectives/lm_data.h"

namespace anvil::train {

/// One file's examples, as data.train[] / data.eval[] reads it.
class KtoDataset {
 public:
  static KtoDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                         const data::ReadOptions& opt);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const KtoSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const data::DatasetStats& stats() const { return stats_; }

 private:
  std::vector<KtoSample> samples_;
  data::DatasetStats stats_;
};

using KtoData = MixtureData<KtoDataset>;

/// The examples `refs` name in `sets`.
std::vector<const KtoSample*> kto_samples(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                                          const std::vector<data::SampleRef>& refs);

/// collate_kto of the examples `refs` name, with where each came from: tensors
/// dataset and index (n) int64 (into `sets`) and position (n) int64, the
/// caller's numbering of the examples (`positions`), by which a precomputed
/// reference finds the log-probs of their KL rows.
Batch collate_kto_refs(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                       const std::vector<data::SampleRef>& refs, const std::vector<int64_t>& positions, int64_t pad_id,
                       int64_t max_length, bool kl_rows);

/// Micro-batches of `micro_batch_size` consecutive examples of the train
/// mixture's stream (every rank reads them all); a batch's position is each
/// example's place in its epoch's order.
class KtoBatchSource final : public BatchSource {
 public:
  KtoBatchSource(std::vector<std::shared_ptr<const KtoDataset>> sets, data::MixtureSampler sampler,
                 int64_t micro_batch_size, int64_t pad_id, int64_t max_length, bool kl_rows);
  Batch next() override;
  nlohmann::json state() const override { return sampler_state(sampler_); }
  void restore(const nlohmann::json& state) override { restore_sampler(sampler_, state); }
  int64_t samples_per_epoch() const override { return sampler_.epoch_length(); }

 private:
  std::vector<std::shared_ptr<const KtoDataset>> sets_;
  data::MixtureSampler sampler_;
  int64_t micro_batch_size_, pad_id_, max_length_;
  bool kl_rows_;
};

}  // namespace anvil::train
