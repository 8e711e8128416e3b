#pragma once
// Internal (not installed): the LM data plumbing behind LmObjective, also
// used by the other objectives: loading a mixture of datasets with held-out
// splits, a resumable rank-sliced stream of collated micro-batches, sampler
// state in checkpoints and the greedy exact-match evaluation.

#include <memory>
#include <string>
#include <vector>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "data/datasets.h"
#include "data/mixture.h"
#include "anvil/train/objective.h"
#include "anvil/train/sft.h"
#include "data/collate.h"

namespace anvil::train {

/// Puts a model in eval mode (no dropout) for a scope and restores its mode
/// after; gradients still flow.
class EvalMode {
 public:
  explicit EvalMode(models::CausalLM& m) : m_(m), was_(m.is_training()) { m_.eval(); }
  ~EvalMode() { m_.train(was_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  models::CausalLM& m_;
  bool was_;
};

Batch to_batch(data::LmBatch b);

/// The value of sum `key` as a double, 0 when the step recorded none.
inline double sum_value(const Sums& sums, const std::string& key) {
  const auto it = sums.find(key);
  return it == sums.end() ? 0.0 : it->second.item<double>();
}

/// A resumable stream of micro-batches over a mixture. Every rank walks the
/// same global stream: a global micro-batch is `world * micro_batch_size`
/// rows and rank r gets rows [r * m, (r + 1) * m). The state is the global
/// position, so it is the same on every rank and for any world size.
class LmBatchSource final : public BatchSource {
 public:
  struct Options {
    int64_t micro_batch_size = 8;
    int64_t max_length = 0;  // row length when packing
    bool packing = false;
    int64_t pad_to_multiple_of = 0;  // unpacked rows: the padded length's multiple (capped at max_length)
    int64_t pad_id = 0;
    int64_t rank = 0;
    int64_t world = 1;
  };
  LmBatchSource(std::vector<std::shared_ptr<const data::LmDataset>> datasets, data::MixtureSampler sampler,
                Options opt);
  Batch next() override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;
  int64_t samples_per_epoch() const override { return sampler_.epoch_length(); }
  /// Packed: the rows next() starts within the first epoch, packed as it
  /// packs them (greedily, in that epoch's order); a later epoch, in its own
  /// order, may fill a few rows more or fewer.
  int64_t rows_per_epoch() const override;
  const data::MixtureSampler& sampler() const { return sampler_; }

 private:
  std::vector<std::shared_ptr<const data::LmDataset>> datasets_;
  data::MixtureSampler sampler_;
  Options opt_;
};

/// A sampler's position as stored in trainer_state.json, and back (a data
/// change since the checkpoint is logged, not fatal). Shared by batch sources.
nlohmann::json sampler_state(const data::MixtureSampler& sampler);
void restore_sampler(data::MixtureSampler& sampler, const nlohmann::json& state);

/// The held-out split of a dataset with `eval_fraction`: a seeded choice of
/// round(fraction * n) samples (at least 1, at most n - 1), both sides sorted.
struct EvalSplit {
  std::vector<int64_t> train, held;
};
EvalSplit split_eval(int64_t n, double eval_fraction, uint64_t seed, size_t dataset_index, const std::string& key);

/// Greedy answers to `prompts`, compared with `references` after decoding:
/// sets eval/exact_match and the first eval.table_rows sample rows of `r`.
void exact_match_eval(models::CausalLM& model, const tokenizer::Tokenizer& tok, const config::EvalConfig& eval,
                      int64_t stop_id, const std::vector<std::vector<int64_t>>& prompts,
                      const std::vector<std::string>& prompt_texts, const std::vector<std::string>& references,
                      EvalResult& r, const RankContext& ranks = {});

/// The train and eval sides of a run over datasets of type `Set`, as
/// data.train / data.eval describe them.
template <class Set>
struct MixtureData {
  std::vector<std::shared_ptr<const Set>> train;
  std::vector<data::MixtureSpec> mixture;
  /// Held-out samples: (dataset, index) over `eval_sets`.
  std::vector<std::shared_ptr<const Set>> eval_sets;
  std::vector<data::SampleRef> eval;
  bool shuffle = true;  // data.shuffle
};
using LmData = MixtureData<data::LmDataset>;

/// How data.* and a dataset's fields read a JSONL file (sft, offline_rl,
/// prompts), rendered in the run's chat format `chat`.
data::ReadOptions read_options(const config::RunConfig& cfg, const config::DatasetConfig& d,
                               const chat::ChatTemplate& chat);

/// data.on_error as the data layer's policy.
data::OnError on_error(const config::RunConfig& cfg);

/// Throws ConfigError when dataset `d` (named `key`) names a format other
/// than `format` (auto passes); `reads` says what the run reads instead.
void check_format(const config::DatasetConfig& d, const std::string& key, config::DataFormat format,
                  const std::string& reads);

/// How data.* and dataset `d` (named `key` in errors) read a JSONL file of
/// records of `format` (prompts, preference); `what` names them in errors.
/// Throws ConfigError when d.format names another format or d.path is a folder.
data::ReadOptions record_read_options(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                      const chat::ChatTemplate& chat, const std::string& key, config::DataFormat format,
                                      const std::string& what);

/// The prompts of dataset `d` ({prompt} records; ppo, distill), logged.
std::shared_ptr<data::PromptDataset> load_prompts(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                                  const std::string& key, const tokenizer::Tokenizer& tok,
                                                  const chat::ChatTemplate& chat);

/// Loads every dataset of data.train / data.eval with
/// `load(const config::DatasetConfig&, const std::string& key)` and splits off
/// each train dataset's eval_fraction as held-out samples.
template <class Set, class Load>
MixtureData<Set> load_mixture(const config::RunConfig& cfg, Load&& load) {
  MixtureData<Set> out;
  out.shuffle = cfg.data.shuffle;
  const auto seed = static_cast<uint64_t>(cfg.train.seed);
  for (size_t i = 0; i < cfg.data.train.size(); ++i) {
    const auto& d = cfg.data.train[i];
    const auto key = concat("data.train[", i, "]");
    std::shared_ptr<const Set> ds = load(d, key);
    data::MixtureSpec spec;
    spec.size = ds->size();
    spec.fraction = d.fraction;
    spec.take = d.size;
    spec.weight = d.weight;
    if (d.eval_fraction > 0) {
      auto split = split_eval(ds->size(), d.eval_fraction, seed, i, key);
      spec.indices = std::move(split.train);
      for (auto h : split.held) out.eval.push_back({static_cast<int32_t>(out.eval_sets.size()), h});
      out.eval_sets.push_back(ds);
      log::info(d.path, ": ", split.held.size(), " samples held out for eval (eval_fraction ", d.eval_fraction, ")");
    }
    out.train.push_back(ds);
    out.mixture.push_back(std::move(spec));
  }
  for (size_t i = 0; i < cfg.data.eval.size(); ++i) {
    std::shared_ptr<const Set> ds = load(cfg.data.eval[i], concat("data.eval[", i, "]"));
    for (int64_t j = 0; j < ds->size(); ++j) out.eval.push_back({static_cast<int32_t>(out.eval_sets.size()), j});
    out.eval_sets.push_back(ds);
  }
  return out;
}

/// A frozen objective's reference model, before RunContext::freeze: the
/// causal LM in `path` (checked against the policy's vocabulary; `key` names
/// the setting in errors), or a copy of the policy's initial weights when
/// `path` is empty.
std::shared_ptr<models::CausalLM> load_reference(const std::string& path, const std::string& key,
                                                 models::CausalLM& policy);

/// Loads every dataset of data.train / data.eval (logging what loading did)
/// and splits off eval_fraction held-out samples; `task` says which formats
/// a data set may have (LmObjective's).
LmData load_lm_data(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat,
                    LmTask task);

}  // namespace anvil::train
