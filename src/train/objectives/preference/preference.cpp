#include "anvil/train/preference.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "models/lora.h"
#include "anvil/models/registry.h"
#include "anvil/train/sft.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/lm_loss.h"
#include "distributed/comm.h"
#include "train/objectives/forward_split.h"
#include "train/objectives/preference/preference_data.h"
#include "data/datasets.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;

int64_t resolve_pad(const tokenizer::Tokenizer& tok) { return tok.padding_id(); }

std::shared_ptr<const data::PreferenceDataset> load_set(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                                        const std::string& key, const tokenizer::Tokenizer& tok,
                                                        const chat::ChatTemplate& chat) {
  const auto o = record_read_options(cfg, d, chat, key, config::DataFormat::kPreference, "preference data");
  auto ds = std::make_shared<data::PreferenceDataset>(data::PreferenceDataset::load(d.path, tok, o));
  const auto& s = ds->stats();
  int64_t ranked = 0;
  for (int64_t i = 0; i < ds->size(); ++i) ranked += !(*ds)[i].is_pair();
  log::info(d.path, ": ", ds->size(), " examples",
            ranked ? concat(", ", ranked, " with more than 2 ranked replies") : "", " (", s.summary(), ")");
  for (const auto& e : s.first_errors) log::warn("skipped: ", e);
  return ds;
}

/// Runs `fn(batch)` over every example of `sets` in order, `batch_size` at a time.
template <class Fn>
void for_each_batch(const std::vector<std::shared_ptr<const data::PreferenceDataset>>& sets,
                    const std::vector<data::SampleRef>& refs, int64_t batch_size, int64_t pad_id, Fn&& fn) {
  for (size_t i = 0; i < refs.size(); i += static_cast<size_t>(batch_size)) {
    std::vector<const data::PreferenceSample*> ex;
    std::vector<data::SampleRef> part;
    for (size_t j = i; j < std::min(refs.size(), i + static_cast<size_t>(batch_size)); ++j) {
      ex.push_back(&(*sets[static_cast<size_t>(refs[j].dataset)])[refs[j].index]);
      part.push_back(refs[j]);
    }
    fn(collate_preferences(ex, part, pad_id));
  }
}

/// An objective's summed loss per example and its statistics over the held-out
/// examples (eval mode, no gradients; at most eval.max_batches batches).
std::pair<double, Sums> eval_loss(Objective& objective, models::CausalLM& model, const PreferenceData& data,
                                  const config::EvalConfig& eval, int64_t pad_id, const RankContext& ranks) {
  EvalMode mode(model);
  torch::NoGradGuard no_grad;
  auto refs = data.eval;
  if (eval.max_batches > 0 && static_cast<int64_t>(refs.size()) > eval.max_batches * eval.batch_size)
    refs.resize(static_cast<size_t>(eval.max_batches * eval.batch_size));
  // Several ranks take every world-th batch (each takes one at least, so all
  // hold the same statistics' keys) and sum.
  const auto n_batches = static_cast<int64_t>((refs.size() + static_cast<size_t>(eval.batch_size) - 1) /
                                              static_cast<size_t>(eval.batch_size));
  const bool split = ranks.splits(n_batches);
  Sums sums;
  double loss = 0, examples = 0;
  int64_t k = 0;
  for_each_batch(data.eval_sets, refs, eval.batch_size, pad_id, [&](const Batch& b) {
    const int64_t at = k++;
    if (split && !ranks.runs(at, n_batches)) return;
    if (split && !ranks.mine(at)) {  // the uneven tail: every rank runs it, its owner counts it
      Sums scratch;
      objective.loss_sum(model, b, scratch);
      return;
    }
    loss += objective.loss_sum(model, b, sums).item<double>();
    examples += static_cast<double>(b.num_targets);
  });
  if (split) {
    const auto head = sum_over_ranks(ranks, {loss, examples}, sums);
    loss = head[0], examples = head[1];
  }
  return {loss / examples, std::move(sums)};
}

std::vector<data::SampleRef> all_refs(const std::vector<std::shared_ptr<const data::PreferenceDataset>>& sets) {
  std::vector<data::SampleRef> out;
  for (size_t d = 0; d < sets.size(); ++d)
    for (int64_t i = 0; i < sets[d]->size(); ++i) out.push_back({static_cast<int32_t>(d), i});
  return out;
}

}  // namespace

// ---- formulas ------------------------------------------------------------------

std::string reference_identity(const std::string& path, int64_t seed, const models::CausalLM& model) {
  if (path.empty()) return concat("initial weights, seed ", seed, ", ", model.hf_config().dump());
  auto desc = concat("folder ", stdfs::weakly_canonical(path).string());
  for (const auto& f : stdfs::directory_iterator(path))
    if (f.path().extension() == ".safetensors")
      desc += concat(";", f.path().filename().string(), ":", stdfs::file_size(f.path()), ":",
                     stdfs::last_write_time(f.path()).time_since_epoch().count());
  return desc;
}

std::string Fingerprint::hex() const {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h_;
  return os.str();
}

bool reference_free(DpoLoss loss_type) {
  return loss_type == DpoLoss::kOrpo || loss_type == DpoLoss::kSimpo || loss_type == DpoLoss::kCpo;
}

at::Tensor dpo_logps(const at::Tensor& sums, const at::Tensor& counts, DpoLoss loss_type) {
  // TRL length-normalises the log-probs for IPO (the paper's average
  // log-likelihood), ORPO and SimPO (both papers define them so).
  const bool mean = loss_type == DpoLoss::kIpo || loss_type == DpoLoss::kOrpo || loss_type == DpoLoss::kSimpo;
  return mean ? sums / counts.to(sums.scalar_type()) : sums;
}

DpoLossOutput dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                       const at::Tensor& ref_rejected, const DpoLossOptions& opt) {
  const double beta = opt.beta, eps = opt.label_smoothing;
  if (reference_free(opt.loss_type)) {
    DpoLossOutput out;
    out.chosen_rewards = (beta * policy_chosen).detach();
    out.rejected_rewards = (beta * policy_rejected).detach();
    if (opt.loss_type == DpoLoss::kOrpo) {
      // log odds(p) = log p - log(1 - p), with log(1 - p) = log(-expm1(log p)).
      const auto log_odds = (policy_chosen - policy_rejected) -
                            (at::log(-at::expm1(policy_chosen)) - at::log(-at::expm1(policy_rejected)));
      out.losses = -beta * at::log_sigmoid(log_odds);
      out.log_odds = log_odds.detach();
      return out;
    }
    auto logits = policy_chosen - policy_rejected;
    if (opt.loss_type == DpoLoss::kSimpo) logits = logits - opt.simpo_gamma / beta;
    out.losses = -at::log_sigmoid(beta * logits) * (1 - eps) - at::log_sigmoid(-beta * logits) * eps;
    return out;
  }
  auto logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected);
  at::Tensor losses;
  if (opt.loss_type == DpoLoss::kSigmoid) {
    losses = -at::log_sigmoid(beta * logits) * (1 - eps) - at::log_sigmoid(-beta * logits) * eps;
  } else if (opt.loss_type == DpoLoss::kRobust) {
    losses = (-at::log_sigmoid(beta * logits) * (1 - eps) + at::log_sigmoid(-beta * logits) * eps) / (1 - 2 * eps);
  } else if (opt.loss_type == DpoLoss::kHinge) {
    losses = at::relu(1 - beta * logits);
  } else if (opt.loss_type == DpoLoss::kIpo) {
    losses = (logits - 1 / (2 * beta)).pow(2);
  } else {
    TORCH_CHECK(false, "dpo_loss: unknown loss_type ", static_cast<int>(opt.loss_type));
  }
  return {losses, (beta * (policy_chosen - ref_chosen)).detach(), (beta * (policy_rejected - ref_rejected)).detach(),
          at::Tensor()};
}

void add_dpo_sums(const DpoLossOutput& out, const at::Tensor& policy_chosen, const at::Tensor& policy_rejected,
                  Sums& sums) {
  const auto& c = out.chosen_rewards;
  const auto& r = out.rejected_rewards;
  add_sum(sums, "pairs", at::scalar_tensor(static_cast<double>(c.size(0)), at::kDouble));
  add_sum(sums, "rewards/chosen", c.sum());
  add_sum(sums, "rewards/rejected", r.sum());
  add_sum(sums, "rewards/accuracies", c.gt(r).sum());
  add_sum(sums, "rewards/margins", (c - r).sum());
  add_sum(sums, "logps/chosen", policy_chosen.detach().sum());
  add_sum(sums, "logps/rejected", policy_rejected.detach().sum());
  if (out.log_odds.defined()) {
    add_sum(sums, "log_odds_ratio", at::log_sigmoid(out.log_odds).sum());
    add_sum(sums, "log_odds_chosen", out.log_odds.sum());
  }
}

void add_dpo_token_sums(const TokenStats& stats, const at::Tensor& token_counts, Sums& sums) {
  // Rows alternate chosen, rejected. Each figure is the micro-batch's token mean (0 without tokens), then
  // averaged over the step's micro-batches, as DPOTrainer appends and averages them.
  const auto tokens = token_counts.to(at::kDouble).view({-1, 2});
  const auto per_token = [&](const at::Tensor& values, const at::Tensor& n) {
    return values / n.clamp_min(1) * n.gt(0).to(at::kDouble);
  };
  const auto logits = stats.mean_logit_sums.detach().to(at::kDouble).view({-1, 2});
  const auto chosen_tokens = tokens.select(1, 0).sum(), rejected_tokens = tokens.select(1, 1).sum();
  add_sum(sums, "logits/chosen", per_token(logits.select(1, 0).sum(), chosen_tokens));
  add_sum(sums, "logits/rejected", per_token(logits.select(1, 1).sum(), rejected_tokens));
  add_sum(sums, "entropy", per_token(stats.entropy_sums.detach().to(at::kDouble).sum(), tokens.sum()));
  add_sum(sums, "mean_token_accuracy",
          per_token(stats.top1_counts.to(at::kDouble).view({-1, 2}).select(1, 0).sum(), chosen_tokens));
  add_sum(sums, "token_batches", at::scalar_tensor(1.0, at::kDouble));
}

Metrics dpo_metrics(const Sums& sums, const std::string& prefix) {
  const double n = sum_value(sums, "pairs");
  if (n <= 0) return {};
  Metrics m;
  for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                        "logps/rejected"})
    m[prefix + k] = sum_value(sums, k) / n;
  for (const char* k : {"nll_loss", "log_odds_ratio", "log_odds_chosen"})
    if (sums.count(k)) m[prefix + k] = sum_value(sums, k) / n;
  if (const double batches = sums.count("token_batches") ? sum_value(sums, "token_batches") : 0; batches > 0)
    for (const char* k : {"logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy"})
      m[prefix + k] = sum_value(sums, k) / batches;
  return m;
}

RankingPairs ranking_pairs(const std::vector<int64_t>& replies_per_example,
                           const std::vector<std::optional<double>>& margins) {
  TORCH_CHECK(margins.size() == replies_per_example.size(), "ranking_pairs: one margin per example");
  std::vector<int64_t> better, worse;
  std::vector<double> margin, weight;
  int64_t start = 0;
  for (size_t e = 0; e < replies_per_example.size(); ++e) {
    const auto k = replies_per_example[e];
    TORCH_CHECK(k >= 2, "ranking_pairs: an example needs at least 2 replies, got ", k);
    const double w = 2.0 / static_cast<double>(k * (k - 1));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = i + 1; j < k; ++j) {
        better.push_back(start + i);
        worse.push_back(start + j);
        margin.push_back(margins[e].value_or(0.0));
        weight.push_back(w);
      }
    start += k;
  }
  auto longs = [](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); };
  auto floats = [](const std::vector<double>& v) { return at::tensor(v, at::kDouble).to(at::kFloat); };
  return {longs(better), longs(worse), floats(margin), floats(weight)};
}

at::Tensor ranking_loss_sum(const at::Tensor& rewards, const RankingPairs& pairs, double center_coefficient) {
  const auto dev = rewards.device();
  const auto type = rewards.scalar_type();
  auto rb = rewards.index_select(0, to_device(pairs.better, dev));
  auto rw = rewards.index_select(0, to_device(pairs.worse, dev));
  auto term = -at::log_sigmoid(rb - rw - to_device(pairs.margin, dev).to(type));
  if (center_coefficient > 0) term = term + center_coefficient * (rb + rw).pow(2);
  return (term * to_device(pairs.weight, dev).to(type)).sum();
}

void add_ranking_sums(const at::Tensor& rewards, const RankingPairs& pairs, Sums& sums) {
  auto r = rewards.detach();
  auto rb = r.index_select(0, pairs.better.to(r.device()));
  auto rw = r.index_select(0, pairs.worse.to(r.device()));
  add_sum(sums, "pairs", at::scalar_tensor(static_cast<double>(rb.size(0)), at::kDouble));
  add_sum(sums, "correct", rb.gt(rw).sum());
  add_sum(sums, "margin", (rb - rw).sum());
  add_sum(sums, "replies", at::scalar_tensor(static_cast<double>(r.size(0)), at::kDouble));
  add_sum(sums, "reward", r.sum());
  add_sum(sums, "reward_sq", r.pow(2).sum());
  // RewardTrainer's min_reward, mean_reward and max_reward: each micro-batch's, averaged over the step's.
  add_sum(sums, "min_reward", r.min().to(at::kDouble));
  add_sum(sums, "mean_reward", r.mean().to(at::kDouble));
  add_sum(sums, "max_reward", r.max().to(at::kDouble));
  add_sum(sums, "reward_batches", at::scalar_tensor(1.0, at::kDouble));
}

Metrics ranking_metrics(const Sums& sums, const std::string& prefix) {
  const double pairs = sum_value(sums, "pairs"), n = sum_value(sums, "replies");
  if (pairs <= 0 || n <= 0) return {};
  const double mean = sum_value(sums, "reward") / n;
  Metrics m{{prefix + "accuracy", sum_value(sums, "correct") / pairs},
            {prefix + "margin", sum_value(sums, "margin") / pairs},
            {prefix + "rewards/mean", mean},
            {prefix + "rewards/std", std::sqrt(std::max(0.0, sum_value(sums, "reward_sq") / n - mean * mean))}};
  if (const double batches = sums.count("reward_batches") ? sum_value(sums, "reward_batches") : 0; batches > 0)
    for (const char* k : {"min_reward", "mean_reward", "max_reward"}) m[prefix + k] = sum_value(sums, k) / batches;
  return m;
}

// ---- data ----------------------------------------------------------------------

Batch collate_preferences(const std::vector<const data::PreferenceSample*>& examples,
                          const std::vector<data::SampleRef>& refs, int64_t pad_id) {
  TORCH_CHECK(!examples.empty() && refs.size() == examples.size(), "collate_preferences: bad batch");
  int64_t rows = 0, T = 0;
  for (const auto* e : examples)
    for (const auto& r : e->replies) {
      ++rows;
      T = std::max<int64_t>(T, static_cast<int64_t>(e->prompt_ids.size() + r.size()));
    }
  auto ids = at::full({rows, T}, pad_id, at::kLong);
  auto labels = at::full({rows, T}, chat::kIgnoreIndex, at::kLong);
  auto mask = at::zeros({rows, T}, at::kBool);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pl = labels.data_ptr<int64_t>();
  std::vector<int64_t> per, dataset, index;
  std::vector<std::optional<double>> margins;
  Batch b;
  int64_t row = 0;
  for (size_t e = 0; e < examples.size(); ++e) {
    const auto& ex = *examples[e];
    const auto P = static_cast<int64_t>(ex.prompt_ids.size());
    for (const auto& reply : ex.replies) {
      std::copy(ex.prompt_ids.begin(), ex.prompt_ids.end(), pi + row * T);
      std::copy(reply.begin(), reply.end(), pi + row * T + P);
      std::copy(reply.begin(), reply.end(), pl + row * T + P);
      mask[row].narrow(0, 0, P + static_cast<int64_t>(reply.size())).fill_(true);
      b.num_tokens += P + static_cast<int64_t>(reply.size());
      ++row;
    }
    per.push_back(static_cast<int64_t>(ex.replies.size()));
    margins.push_back(ex.margin);
    dataset.push_back(refs[e].dataset);
    index.push_back(refs[e].index);
  }
  const auto pairs = ranking_pairs(per, margins);
  b.tensors["input_ids"] = ids;
  b.tensors["labels"] = labels;
  b.tensors["attention_mask"] = mask;
  b.tensors["replies"] = at::tensor(per, at::kLong);
  b.tensors["better"] = pairs.better;
  b.tensors["worse"] = pairs.worse;
  b.tensors["margin"] = pairs.margin;
  b.tensors["weight"] = pairs.weight;
  b.tensors["dataset"] = at::tensor(dataset, at::kLong);
  b.tensors["index"] = at::tensor(index, at::kLong);
  b.num_targets = static_cast<int64_t>(examples.size());
  return b;
}

PreferenceData load_preference_data(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                    const chat::ChatTemplate& chat) {
  return load_mixture<data::PreferenceDataset>(
      cfg, [&](const config::DatasetConfig& d, const std::string& key) { return load_set(cfg, d, key, tok, chat); });
}

PreferenceBatchSource::PreferenceBatchSource(std::vector<std::shared_ptr<const data::PreferenceDataset>> datasets,
                                             data::MixtureSampler sampler, int64_t micro_batch_size, int64_t pad_id,
                                             int64_t rank, int64_t world)
    : datasets_(std::move(datasets)),
      sampler_(std::move(sampler)),
      micro_batch_size_(micro_batch_size),
      pad_id_(pad_id),
      rank_(rank),
      world_(world) {
  TORCH_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "PreferenceBatchSource: bad rank/world");
}

Batch PreferenceBatchSource::next() {
  std::vector<const data::PreferenceSample*> ex;
  std::vector<data::SampleRef> refs;
  for (int64_t g = 0; g < world_ * micro_batch_size_; ++g) {
    const auto r = sampler_.next();
    if (g / micro_batch_size_ != rank_) continue;
    ex.push_back(&(*datasets_[static_cast<size_t>(r.dataset)])[r.index]);
    refs.push_back(r);
  }
  return collate_preferences(ex, refs, pad_id_);
}

nlohmann::json PreferenceBatchSource::state() const { return sampler_state(sampler_); }

void PreferenceBatchSource::restore(const nlohmann::json& state) { restore_sampler(sampler_, state); }

// ---- reward --------------------------------------------------------------------

struct RewardObjective::State {
  config::RunConfig cfg;
  int64_t pad_id;
  PreferenceData data;
  std::unique_ptr<PreferenceBatchSource> source;

  /// (rows) float32 scores of a collated batch.
  at::Tensor rewards(models::CausalLM& model, const Batch& batch) const;
};

RewardObjective::RewardObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                 const chat::ChatTemplate& chat)
    : s_(new State{cfg, resolve_pad(tok), load_preference_data(cfg, tok, chat), nullptr}) {
  data::MixtureSampler sampler(s_->data.mixture, static_cast<uint64_t>(cfg.train.seed), s_->data.shuffle);
  s_->source = std::make_unique<PreferenceBatchSource>(s_->data.train, std::move(sampler), cfg.train.micro_batch_size,
                                                       s_->pad_id);
}

RewardObjective::~RewardObjective() = default;

BatchSource& RewardObjective::train_source() { return *s_->source; }

void RewardObjective::prepare(models::CausalLM& model, const RunContext&) {
  if (!model.has_score_head()) {
    model.add_score_head();
    log::info("reward: added a score head (", model.hidden_size(), " -> 1) to the ", model.family(), " model");
  }
  // The scored token is the last non-pad one (HF's rule), so the saved
  // config.json must name the pad id this run uses.
  if (model.special_tokens.pad < 0) model.special_tokens.pad = s_->pad_id;
  if (model.special_tokens.pad != s_->pad_id)
    throw ConfigError(concat("model.from: the model's pad_token_id ", model.special_tokens.pad,
                             " differs from the tokenizer's pad id ", s_->pad_id,
                             "; a reward model reads its score at the last non-pad token, so they must agree"));
}

at::Tensor RewardObjective::State::rewards(models::CausalLM& model, const Batch& batch) const {
  const auto device = model.parameters().front().device();
  auto ids = to_device(batch.tensors.at("input_ids"), device);
  auto hidden = model.hidden_states(ids, {});
  return model.score(hidden, models::last_non_pad_index(ids, pad_id));
}

at::Tensor RewardObjective::loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) {
  NoDropout guard(model, reward_config(s_->cfg).disable_dropout);
  auto r = s_->rewards(model, batch);
  RankingPairs pairs{batch.tensors.at("better"), batch.tensors.at("worse"), batch.tensors.at("margin"),
                     batch.tensors.at("weight")};
  add_ranking_sums(r, pairs, sums);
  return ranking_loss_sum(r, pairs, reward_config(s_->cfg).center_rewards_coefficient);
}

EvalResult RewardObjective::evaluate(models::CausalLM& model) {
  EvalResult result;
  if (s_->data.eval.empty()) return result;
  const auto [loss, sums] = eval_loss(*this, model, s_->data, s_->cfg.eval, s_->pad_id, ranks_);
  result.metrics = ranking_metrics(sums, "eval/");
  result.metrics["eval/loss"] = loss;
  return result;
}

// ---- DPO -----------------------------------------------------------------------

struct DpoObjective::State {
  config::RunConfig cfg;
  const tokenizer::Tokenizer& tok;
  int64_t pad_id, stop_id;
  DpoLossOptions loss_opt;
  PreferenceData data;
  std::unique_ptr<PreferenceBatchSource> source;
  FrozenModel reference;                         // empty once its log-probs are precomputed
  models::CausalLM* policy_reference = nullptr;  // LoRA: the policy, adapters off
  std::string reference_desc;
  /// Precomputed reference sums per (train set) and (eval set): (N, K) float64.
  std::vector<at::Tensor> cached_train, cached_eval;

  /// Reference log-prob sums of a batch's rows (R): from the cache or the model.
  at::Tensor reference_sums(const Batch& batch, bool eval);
  /// The reference model's log-prob sums of a batch's rows.
  at::Tensor reference_forward(const Batch& batch);
  void precompute(const RunContext& ctx);
  std::string fingerprint() const;
};

DpoObjective::DpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                           const chat::ChatTemplate& chat)
    : s_(new State{cfg,
                   tok,
                   resolve_pad(tok),
                   chat.end_of_turn_id(tok),
                   {dpo_config(cfg).loss_type, dpo_config(cfg).beta, dpo_config(cfg).label_smoothing,
                    dpo_config(cfg).simpo_gamma},
                   load_preference_data(cfg, tok, chat),
                   nullptr,
                   {},
                   nullptr,
                   {},
                   {},
                   {}}) {
  auto check_pairs = [&](const std::vector<std::shared_ptr<const data::PreferenceDataset>>& sets, const char* key) {
    for (size_t d = 0; d < sets.size(); ++d)
      for (int64_t i = 0; i < sets[d]->size(); ++i)
        if (!(*sets[d])[i].is_pair())
          throw DataError(concat(
              key, ": example ", i + 1, " (prompt \"", (*sets[d])[i].prompt, "\") ranks ", (*sets[d])[i].replies.size(),
              " replies; DPO trains on chosen/rejected pairs (ranked lists are for algorithm: reward)"));
  };
  check_pairs(s_->data.train, "data.train");
  check_pairs(s_->data.eval_sets, "data.eval");
  data::MixtureSampler sampler(s_->data.mixture, static_cast<uint64_t>(cfg.train.seed), s_->data.shuffle);
  s_->source = std::make_unique<PreferenceBatchSource>(s_->data.train, std::move(sampler), cfg.train.micro_batch_size,
                                                       s_->pad_id);
}

DpoObjective::~DpoObjective() = default;

BatchSource& DpoObjective::train_source() { return *s_->source; }

void DpoObjective::prepare(models::CausalLM& model, const RunContext& ctx) {
  if (model.has_score_head())
    throw ConfigError("model.from: algorithm dpo trains a language model, but the model is a reward model");
  if (reference_free(dpo_config(s_->cfg).loss_type)) {
    log::info("dpo: loss_type ", kDpoLosses.name(dpo_config(s_->cfg).loss_type),
              " compares the policy's own log-probs; no reference model");
    return;
  }
  const auto& path = !dpo_config(s_->cfg).reference.empty() ? dpo_config(s_->cfg).reference : s_->cfg.model.from;
  s_->reference_desc = reference_identity(path, s_->cfg.train.seed, model);
  const auto cache = ctx.output_dir / "reference_logps.safetensors";
  if (dpo_config(s_->cfg).precompute_reference && stdfs::exists(cache)) {
    io::SafetensorsFile f(cache);
    const auto it = f.metadata().find("fingerprint");
    if (it != f.metadata().end() && it->second == s_->fingerprint()) {
      for (size_t d = 0; d < s_->data.train.size(); ++d) s_->cached_train.push_back(f.get(concat("train.", d)));
      for (size_t d = 0; d < s_->data.eval_sets.size(); ++d) s_->cached_eval.push_back(f.get(concat("eval.", d)));
      log::info("dpo: reference log-probs read from ", cache.string());
      return;
    }
    log::info("dpo: ", cache.string(), " was computed for other data or another reference; recomputing");
  }
  if (models::has_lora(model) && dpo_config(s_->cfg).reference.empty()) {
    // As TRL does with a PEFT model: the reference is the policy with its
    // adapters off, so no second copy is held.
    s_->policy_reference = &model;
    log::info("dpo: reference model: the policy with its LoRA adapters off (no second copy)");
    if (dpo_config(s_->cfg).precompute_reference) s_->precompute(ctx);
    return;
  }
  auto reference = load_reference(path, "dpo.reference", model);
  s_->reference = ctx.freeze(std::move(reference));
  const auto tp = ctx.comm ? ctx.comm->world_size() / ctx.data_comm()->world_size() : 1;
  log::info("dpo: reference model from ", path.empty() ? std::string("the initial weights") : path,
            dpo_config(s_->cfg).precompute_reference
                ? std::string(" (precomputing its log-probs)")
                : concat(" (kept in memory, ", s_->reference.parameter_bytes(), " parameter bytes",
                         s_->reference.sharded() && ctx.full_shard()
                             ? concat(" on this rank: ", tp > 1 ? concat("tensor parallel ", tp, " x ") : std::string(),
                                      "full_shard over ", ctx.data_comm()->world_size(), " ranks")
                             : std::string(),
                         ")"));
  if (dpo_config(s_->cfg).precompute_reference) s_->precompute(ctx);
}

std::string DpoObjective::State::fingerprint() const {
  Fingerprint h;  // the reference and every token
  h.mix(reference_desc);
  for (const auto* sets : {&data.train, &data.eval_sets})
    for (const auto& ds : *sets) {
      h.mix(static_cast<uint64_t>(ds->size()));
      for (int64_t i = 0; i < ds->size(); ++i) {
        const auto& s = (*ds)[i];
        h.mix(s.prompt_ids);
        for (const auto& r : s.replies) {
          h.mix(~0ull);
          h.mix(r);
        }
      }
    }
  return h.hex();
}

void DpoObjective::State::precompute(const RunContext& ctx) {
  torch::NoGradGuard no_grad;
  io::TensorMap tensors;
  int64_t world = 1;
  auto run = [&](const std::vector<std::shared_ptr<const data::PreferenceDataset>>& sets, const char* name,
                 std::vector<at::Tensor>& into) {
    for (const auto& ds : sets) into.push_back(at::zeros({ds->size(), 2}, at::kFloat));
    const auto refs = all_refs(sets);
    const auto bs = static_cast<size_t>(cfg.eval.batch_size);
    // Several ranks each score every world-th batch and the caches are summed (train/forward_split.h).
    const ForwardSplit split(ctx.data_comm(), static_cast<int64_t>((refs.size() + bs - 1) / bs), ctx.device);
    if (split.split()) world = split.world();
    int64_t k = 0;
    for_each_batch(sets, refs, cfg.eval.batch_size, pad_id, [&](const Batch& b) {
      const int64_t at = k++;
      if (!split.runs(at)) return;
      auto sums = reference_forward(b).cpu().view({-1, 2});
      if (!split.keeps(at)) return;
      const auto d = b.tensors.at("dataset"), i = b.tensors.at("index");
      for (int64_t e = 0; e < d.size(0); ++e)
        into[static_cast<size_t>(d[e].item<int64_t>())].select(0, i[e].item<int64_t>()).copy_(sums[e]);
    });
    split.combine(into, concat("dpo reference log-probs of the ", name, " sets"));
    for (size_t d = 0; d < into.size(); ++d) tensors[concat(name, ".", d)] = into[d];
  };
  run(data.train, "train", cached_train);
  run(data.eval_sets, "eval", cached_eval);
  const auto cache = ctx.output_dir / "reference_logps.safetensors";
  io::save_safetensors(cache, tensors, {{"fingerprint", fingerprint()}});
  log::info("dpo: reference log-probs of ", all_refs(data.train).size() + all_refs(data.eval_sets).size(),
            " pairs cached in ", cache.string(), world > 1 ? concat(" (split over ", world, " ranks)") : std::string(),
            "; the reference model is freed");
  reference.reset();
  policy_reference = nullptr;
}

at::Tensor DpoObjective::State::reference_forward(const Batch& batch) {
  torch::NoGradGuard no_grad;
  auto& m = policy_reference ? *policy_reference : *reference;
  std::optional<models::LoraDisabled> base;
  std::optional<EvalMode> eval;
  if (policy_reference) base.emplace(m), eval.emplace(m);  // the frozen reference is in eval mode too
  const auto device = m.parameters().front().device();
  return model_sequence_logps(m, to_device(batch.tensors.at("input_ids"), device),
                              to_device(batch.tensors.at("labels"), device), cfg.train.fused_loss)
      .first;
}

at::Tensor DpoObjective::State::reference_sums(const Batch& batch, bool eval) {
  if (!reference && !policy_reference) {
    const auto& cache = eval ? cached_eval : cached_train;
    const auto d = batch.tensors.at("dataset"), i = batch.tensors.at("index");
    std::vector<at::Tensor> rows;
    for (int64_t e = 0; e < d.size(0); ++e)
      rows.push_back(cache[static_cast<size_t>(d[e].item<int64_t>())][i[e].item<int64_t>()]);
    return at::stack(rows).view({-1});  // (E * 2): chosen, rejected per example
  }
  return reference_forward(batch);
}

at::Tensor DpoObjective::loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) {
  const auto device = model.parameters().front().device();
  const auto& type = s_->loss_opt.loss_type;
  // TRL's ORPOTrainer takes its NLL over the chosen rows' prompt and reply: one forward gives every token's
  // log-prob, the replies' sums come from the same.
  const bool whole_row_nll = type == DpoLoss::kOrpo && dpo_config(s_->cfg).orpo_nll == OrpoNll::kPromptAndReply;
  at::Tensor policy_sums, counts, whole_row_nll_mean;
  // The losses of TRL's DPOTrainer also log its token statistics; ORPOTrainer and CPOTrainer (orpo, simpo,
  // cpo) log none of them (their logits/* average every padded position: not logged).
  TokenStats stats;
  stats.want_mean_logits = stats.want_entropy = stats.want_top1 = !reference_free(type);
  {
    NoDropout guard(model, dpo_config(s_->cfg).disable_dropout);
    const auto ids = to_device(batch.tensors.at("input_ids"), device);
    const auto labels = to_device(batch.tensors.at("labels"), device);
    const auto& real = batch.tensors.at("attention_mask");
    if (whole_row_nll) {
      const auto all = ids.masked_fill(to_device(real, device).logical_not(), chat::kIgnoreIndex);
      const auto [logp, targets] = model_token_logps(model, ids, all, s_->cfg.train.fused_loss, real);  // (2E, T)
      const auto reply = next_token_targets(labels, chat::kIgnoreIndex).ne(chat::kIgnoreIndex);
      policy_sums = (logp * reply).sum(-1);
      counts = reply.sum(-1);
      // The mean over the micro-batch's chosen tokens (rows alternate chosen, rejected), as CrossEntropyLoss.
      const auto chosen = at::arange(0, logp.size(0), 2, targets.options());
      const auto n = targets.index_select(0, chosen).ne(chat::kIgnoreIndex).sum().clamp_min(1);
      whole_row_nll_mean = -logp.index_select(0, chosen).sum() / n.to(logp.scalar_type());
    } else {
      std::tie(policy_sums, counts) = model_sequence_logps(model, ids, labels, s_->cfg.train.fused_loss, real, &stats);
    }
  }
  // Rows alternate chosen, rejected (every example is a pair).
  const bool eval = !model.is_training();
  auto policy = dpo_logps(policy_sums, counts, type).view({-1, 2});
  auto pc = policy.select(1, 0), pr = policy.select(1, 1);
  DpoLossOutput out;
  if (reference_free(type)) {
    out = dpo_loss(pc, pr, {}, {}, s_->loss_opt);
  } else {
    auto ref_sums = s_->reference_sums(batch, eval).to(device, policy_sums.scalar_type());
    auto ref = dpo_logps(ref_sums, counts, type).view({-1, 2});
    out = dpo_loss(pc, pr, ref.select(1, 0), ref.select(1, 1), s_->loss_opt);
  }
  add_dpo_sums(out, pc, pr, sums);
  if (stats.want_entropy) add_dpo_token_sums(stats, counts, sums);
  if (whole_row_nll) {
    // The micro-batch's loss as TRL's: NLL mean - mean(beta log sigma(log odds)), returned summed over its pairs
    // (the engine divides by the step's pairs).
    const auto pairs = static_cast<double>(pc.size(0));
    add_sum(sums, "nll_loss", (whole_row_nll_mean * pairs).detach());
    return out.losses.sum() + whole_row_nll_mean * pairs;
  }
  // The chosen reply's mean token NLL per pair: RPO's term, ORPO's SFT term
  // (dpo.orpo_nll: reply), CPO's (and TRL's CPO-SimPO's) behaviour-cloning term.
  const double nll_weight = type == DpoLoss::kOrpo                             ? 1.0
                            : type == DpoLoss::kCpo || type == DpoLoss::kSimpo ? dpo_config(s_->cfg).cpo_alpha
                                                                               : dpo_config(s_->cfg).rpo_alpha;
  if (nll_weight > 0) {
    auto chosen =
        policy_sums.view({-1, 2}).select(1, 0) / counts.view({-1, 2}).select(1, 0).to(policy_sums.scalar_type());
    add_sum(sums, "nll_loss", -chosen.detach().sum());
    return (out.losses - nll_weight * chosen).sum();
  }
  return out.losses.sum();
}

EvalResult DpoObjective::evaluate(models::CausalLM& model) {
  EvalResult result;
  if (s_->data.eval.empty()) return result;
  // The ranks split the batches unevenly, so a sharded reference is whole meanwhile.
  auto whole = s_->reference.gathered();
  const auto [loss, sums] = eval_loss(*this, model, s_->data, s_->cfg.eval, s_->pad_id, ranks_);
  result.metrics = dpo_metrics(sums, "eval/");
  result.metrics["eval/loss"] = loss;
  // Greedy answers to held-out prompts against the chosen reply.
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> texts, references;
  for (const auto& ref : s_->data.eval) {
    if (static_cast<int64_t>(prompts.size()) >= s_->cfg.eval.generate_samples) break;
    const auto& s = (*s_->data.eval_sets[static_cast<size_t>(ref.dataset)])[ref.index];
    prompts.push_back(s.prompt_ids);
    texts.push_back(s.prompt);
    references.push_back(s.reply_texts.front());
  }
  exact_match_eval(model, s_->tok, s_->cfg.eval, s_->stop_id, prompts, texts, references, result, ranks_);
  return result;
}

// reward and dpo: registered as a linking program registers its objectives
// (examples/custom_objective).
namespace {

void check_dpo(const DpoConfig& d, const config::RunConfig&, const config::Checks& checks) {
  const auto* name = kDpoLosses.name(d.loss_type);
  if (d.label_smoothing > 0 && (d.loss_type == DpoLoss::kIpo || d.loss_type == DpoLoss::kHinge))
    checks.fail("dpo.label_smoothing",
                concat("applies to loss_type sigmoid (cDPO) and robust; ", name, " takes 0, got ", d.label_smoothing));
  if (reference_free(d.loss_type)) {
    if (!d.reference.empty())
      checks.fail("dpo.reference", concat("loss_type ", name, " uses no reference model; leave it empty"));
    if (d.precompute_reference)
      checks.fail("dpo.precompute_reference", concat("loss_type ", name, " uses no reference model"));
    if (d.rpo_alpha > 0)
      checks.fail("dpo.rpo_alpha",
                  concat("loss_type ", name,
                         d.loss_type == DpoLoss::kOrpo ? " has the chosen reply's NLL built in"
                                                       : " weighs the chosen reply's NLL with dpo.cpo_alpha"));
    if (d.label_smoothing > 0 && d.loss_type == DpoLoss::kOrpo)
      checks.fail("dpo.label_smoothing", "applies to loss_type sigmoid, robust, simpo and cpo; orpo takes 0");
  }
  if (d.loss_type != DpoLoss::kOrpo && d.orpo_nll != DpoConfig{}.orpo_nll)
    checks.fail("dpo.orpo_nll", concat("applies to loss_type orpo; the run's loss_type is ", name));
  checks.model_folder("dpo.reference", d.reference);
}

}  // namespace

// Called from the list of built-in objectives (objective_registry.cpp).
void register_preference_objectives() {
  config::register_section<RewardConfig>("reward", "Reward-model training (algorithm: reward).", "reward");
  config::register_section<DpoConfig>("dpo", "Direct preference optimisation (algorithm: dpo).", "dpo", check_dpo);
  auto reward = config::dataset_keys({"eval_fraction", "prompt_field"});
  reward.insert(reward.end(), {"data.template", "data.on_overflow", "data.on_error", "eval.max_batches",
                               "train.num_train_epochs", "dist.tensor_parallel"});
  register_objective<RewardObjective>("reward", reward);
  register_objective<DpoObjective>("dpo", dpo_reads());
}

std::vector<std::string> dpo_reads() {
  auto keys = config::dataset_keys({"eval_fraction", "prompt_field"});
  keys.insert(keys.end(), {"data.template", "data.on_overflow", "data.on_error", "train.fused_loss", "eval.max_batches",
                           "eval.generate_samples", "eval.max_new_tokens", "eval.table_rows", "train.num_train_epochs",
                           "dist.tensor_parallel"});
  return keys;
}

}  // namespace anvil::train
