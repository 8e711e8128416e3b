// KTO (kto.h): its loss and metrics, its config section, the objective (with
// its reference model or a precomputed cache of the reference's log-probs)
// and its registration. Its data: kto_data.cpp.
#include "train/objectives/kto/kto.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "io/safetensors.h"
#include "models/lora.h"
#include "anvil/train/preference.h"
#include "train/objectives/kto/kto_data.h"
#include "train/objectives/forward_split.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/preference/preference_data.h"

namespace anvil::train {

// ---- formulas ------------------------------------------------------------------

at::Tensor kto_kl(const at::Tensor& policy_kl_logps, const at::Tensor& ref_kl_logps) {
  return (policy_kl_logps - ref_kl_logps).mean().clamp_min(0).detach();
}

bool kto_uses_kl(KtoLoss loss_type) { return loss_type == KtoLoss::kKto; }

KtoLossOutput kto_loss(const at::Tensor& policy_logps, const at::Tensor& ref_logps, const at::Tensor& desirable,
                       const at::Tensor& kl, const KtoLossOptions& opt) {
  const auto logratio = policy_logps - ref_logps;
  at::Tensor good, bad;
  if (kto_uses_kl(opt.loss_type)) {
    good = 1 - at::sigmoid(opt.beta * (logratio - kl));
    bad = 1 - at::sigmoid(opt.beta * (kl - logratio));
  } else {
    // APO-zero (D'Oosterlinck et al. 2024, eq. 7) unpaired as TRL has it: desirable completions gain likelihood
    // over the reference and undesirable ones lose it, each on its own, with no reference point.
    good = 1 - at::sigmoid(opt.beta * logratio);
    bad = at::sigmoid(opt.beta * logratio);
  }
  return {at::where(desirable, good * opt.desirable_weight, bad * opt.undesirable_weight),
          (opt.beta * logratio).detach()};
}

void add_kto_sums(const KtoLossOutput& out, const at::Tensor& policy_logps, const at::Tensor& desirable,
                  const at::Tensor& kl, Sums& sums) {
  // TRL's KTOTrainer logs, per micro-batch, each side's mean over its examples when it has any, the margin
  // when it has both, and averages those over the micro-batches that had them: sums of the micro-batch means
  // and counts of those micro-batches, without reading the device.
  const auto dt = out.rewards.scalar_type();
  const auto d = desirable.to(dt), u = 1 - d;
  const auto logps = policy_logps.detach().to(dt);
  const auto n_chosen = d.sum(), n_rejected = u.sum();
  const auto has_chosen = n_chosen.gt(0).to(dt), has_rejected = n_rejected.gt(0).to(dt);
  const auto mean = [](const at::Tensor& x, const at::Tensor& side, const at::Tensor& n) {
    return (x * side).sum() / n.clamp_min(1);
  };
  const auto chosen_reward = mean(out.rewards, d, n_chosen), rejected_reward = mean(out.rewards, u, n_rejected);
  add_sum(sums, "rewards/chosen", chosen_reward);
  add_sum(sums, "logps/chosen", mean(logps, d, n_chosen));
  add_sum(sums, "chosen_batches", has_chosen);
  add_sum(sums, "rewards/rejected", rejected_reward);
  add_sum(sums, "logps/rejected", mean(logps, u, n_rejected));
  add_sum(sums, "rejected_batches", has_rejected);
  add_sum(sums, "rewards/margins", (chosen_reward - rejected_reward) * has_chosen * has_rejected);
  add_sum(sums, "margin_batches", has_chosen * has_rejected);
  add_sum(sums, "kl", kl.to(at::kDouble));
  add_sum(sums, "kl_batches", at::scalar_tensor(1.0, at::kDouble));
}

void add_kto_logit_sums(const at::Tensor& mean_logit_sums, const at::Tensor& token_counts, const at::Tensor& desirable,
                        Sums& sums) {
  // TRL weighs each token alike within a micro-batch (its logit total over its token count), then averages
  // the micro-batches that had tokens of that side.
  const auto logits = mean_logit_sums.detach().to(at::kDouble), tokens = token_counts.to(at::kDouble);
  const auto d = desirable.to(at::kDouble);
  const auto side = [&](const at::Tensor& rows, const char* key, const char* batches) {
    const auto n = (tokens * rows).sum();
    add_sum(sums, key, (logits * rows).sum() / n.clamp_min(1));
    add_sum(sums, batches, n.gt(0).to(at::kDouble));
  };
  side(d, "logits/chosen", "logits_chosen_batches");
  side(1 - d, "logits/rejected", "logits_rejected_batches");
}

void add_kto_entropy_sums(const at::Tensor& entropy_sums, const at::Tensor& token_counts, Sums& sums) {
  const auto n = token_counts.to(at::kDouble).sum();
  add_sum(sums, "entropy", entropy_sums.detach().to(at::kDouble).sum() / n.clamp_min(1));
  add_sum(sums, "entropy_batches", at::scalar_tensor(1.0, at::kDouble));
}

Metrics kto_metrics(const Sums& sums, const std::string& prefix) {
  Metrics m;
  const auto average = [&](const char* key, const char* batches) {
    if (const double n = sum_value(sums, batches); n > 0) m[prefix + key] = sum_value(sums, key) / n;
  };
  average("rewards/chosen", "chosen_batches");
  average("logps/chosen", "chosen_batches");
  average("rewards/rejected", "rejected_batches");
  average("logps/rejected", "rejected_batches");
  average("rewards/margins", "margin_batches");  // only where a micro-batch had both sides, as TRL
  average("logits/chosen", "logits_chosen_batches");
  average("logits/rejected", "logits_rejected_batches");
  average("kl", "kl_batches");
  average("entropy", "entropy_batches");
  return m;
}

std::string kto_balance_advice(int64_t desirable, int64_t undesirable, double desirable_weight,
                               double undesirable_weight) {
  // TRL's bounds, each rounded to 2 decimals as TRL prints and compares them; 1.33 is its 4/3.
  const auto nd = static_cast<double>(std::max<int64_t>(desirable, 1)),
             nu = static_cast<double>(std::max<int64_t>(undesirable, 1));
  const auto round2 = [](double x) { return std::round(x * 100) / 100; };
  const double d_lo = round2(nu * undesirable_weight / nd), d_hi = round2(nu * undesirable_weight / nd * 1.33);
  const double u_lo = round2(nd * desirable_weight / nu / 1.33), u_hi = round2(nd * desirable_weight / nu);
  if ((d_lo <= desirable_weight && desirable_weight <= d_hi) ||
      (u_lo <= undesirable_weight && undesirable_weight <= u_hi))
    return "";
  return concat("kto: an epoch of the training data holds ", desirable, " desirable and ", undesirable,
                " undesirable examples, so kto.desirable_weight x ", desirable, " / (kto.undesirable_weight x ",
                undesirable, ") = ", desirable_weight * nd / (undesirable_weight * nu),
                ", outside the [1, 4/3] the KTO paper advises (its eq. 8). Set EITHER kto.desirable_weight in [", d_lo,
                ", ", d_hi, "] or kto.undesirable_weight in [", u_lo, ", ", u_hi,
                "] (but NOT BOTH), as TRL's KTOTrainer advises");
}

namespace {

namespace stdfs = std::filesystem;

/// The `kto:` section.
struct KtoConfig {
  double beta = 0.1;
  KtoLoss loss_type = KtoLoss::kKto;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
  std::string reference;
  bool precompute_reference = false;
  bool disable_dropout = true;

  void visit(config::FieldVisitor& v) {
    v.field("beta", beta, "Strength of the implicit KL penalty to the reference (TRL's beta).", config::positive());
    config::enum_field(
        v, "loss_type", loss_type,
        "kto (the KTO paper's loss: each completion against the micro-batch's KL estimate z0, from its "
        "mismatched KL rows) or apo_zero_unpaired (TRL's unpaired APO-zero: desirable completions made "
        "likelier than under the reference, undesirable ones less likely; no z0, so no KL rows are scored).",
        kKtoLosses, kKtoLosses.rule());
    v.field("desirable_weight", desirable_weight,
            "Weight of a desirable example's loss (lambda_D; TRL advises desirable_weight x desirable examples / "
            "(undesirable_weight x undesirable examples) in [1, 4/3], and the run warns outside it).",
            config::positive());
    v.field("undesirable_weight", undesirable_weight, "Weight of an undesirable example's loss (lambda_U).",
            config::positive());
    v.field("reference", reference,
            "Reference model folder (HF layout). Empty = model.from, or a frozen copy of the initial weights "
            "when model.from is empty; with LoRA, the policy with its adapters off.");
    v.field("precompute_reference", precompute_reference,
            "Compute the reference log-probs of every example (and, for loss_type kto, of every KL row) once "
            "before training, cache them in output_dir/reference_logps.safetensors and free the reference model "
            "(TRL's precompute_ref_log_probs). With loss_type kto it needs the same micro-batches every epoch: "
            "data.shuffle false, no data.train[].weight, an epoch a multiple of train.micro_batch_size.");
    v.field("disable_dropout", disable_dropout, "Run the model without dropout while training (as TRL does).");
  }
};

class KtoObjective final : public Objective {
 public:
  KtoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat)
      : cfg_(cfg),
        kto_(cfg.extensions.get<KtoConfig>("kto")),
        loss_opt_{kto_.beta, kto_.desirable_weight, kto_.undesirable_weight, kto_.loss_type},
        kl_rows_(kto_uses_kl(kto_.loss_type)),
        tok_(tok),
        pad_id_(tok.padding_id()),
        stop_id_(chat.end_of_turn_id(tok)) {
    data_ = load_mixture<KtoDataset>(cfg, [&](const config::DatasetConfig& d, const std::string& key) {
      const auto o =
          record_read_options(cfg, d, chat, key, config::DataFormat::kPreference, "KTO or preference records");
      auto ds = std::make_shared<KtoDataset>(KtoDataset::load(d.path, tok, o));
      int64_t good = 0;
      for (int64_t i = 0; i < ds->size(); ++i) good += (*ds)[i].desirable;
      log::info(d.path, ": ", ds->size(), " examples, ", good, " desirable and ", ds->size() - good, " undesirable (",
                ds->stats().summary(), ")");
      for (const auto& e : ds->stats().first_errors) log::warn("skipped: ", e);
      return std::shared_ptr<const KtoDataset>(std::move(ds));
    });
    auto sampler = train_sampler();
    warn_on_balance(sampler.plan());
    const auto epoch = sampler.epoch_length(), m = cfg.train.micro_batch_size;
    if (kto_.precompute_reference && kl_rows_ && epoch % m != 0)
      throw ConfigError(
          concat("kto.precompute_reference: with loss_type kto the KL rows' reference log-probs are precomputed for "
                 "fixed micro-batches, but an epoch of ",
                 epoch, " examples is not a multiple of train.micro_batch_size (", m,
                 "), so micro-batches would straddle epochs and pair other completions with each prompt; take a "
                 "multiple of it (data.train[].size), or set kto.loss_type: apo_zero_unpaired (no KL rows)"));
    source_ =
        std::make_unique<KtoBatchSource>(data_.train, std::move(sampler), m, pad_id_, cfg.data.max_length, kl_rows_);
  }

  std::string name() const override { return "kto"; }
  std::string target_unit() const override { return "KTO examples"; }
  std::string sample_label(const Batch& batch, int64_t row) const override {
    return batch.tensors.at("desirable")[row].item<bool>() ? "desirable" : "undesirable";
  }
  BatchSource& train_source() override { return *source_; }
  Metrics step_metrics(const Sums& sums) const override { return kto_metrics(sums); }
  std::vector<std::string> console_metrics() const override { return {"kl", "rewards/margins"}; }
  StepNeeds step_needs() const override { return {StepReads::late}; }  // no after_step

  bool prepare_reads_weights() const override { return false; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override {
    if (model.has_score_head())
      throw ConfigError("model.from: algorithm kto trains a language model, but the model is a reward model");
    const auto& path = !kto_.reference.empty() ? kto_.reference : cfg_.model.from;
    const auto cache = ctx.output_dir / "reference_logps.safetensors";
    if (kto_.precompute_reference) {
      reference_desc_ = reference_identity(path, cfg_.train.seed, model);
      if (read_cache(cache)) return;
    }
    if (models::has_lora(model) && kto_.reference.empty()) {
      policy_reference_ = &model;
      log::info("kto: reference model: the policy with its LoRA adapters off (no second copy)");
    } else {
      reference_ = ctx.freeze(load_reference(path, "kto.reference", model));
      log::info("kto: reference model from ", path.empty() ? std::string("the initial weights") : path, " (",
                kto_.precompute_reference ? std::string("precomputing its log-probs")
                                          : concat(reference_.parameter_bytes(), " parameter bytes"),
                ")");
    }
    if (kto_.precompute_reference) precompute(cache, ctx);
  }

  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override {
    const auto device = model.parameters().front().device();
    const auto n = batch.num_targets;
    const bool eval = !model.is_training();
    const auto ids = to_device(batch.tensors.at("input_ids"), device),
               labels = to_device(batch.tensors.at("labels"), device);
    const bool fused = cfg_.train.fused_loss;
    at::Tensor policy, counts, policy_kl;
    TokenStats stats;
    stats.want_mean_logits = stats.want_entropy = true;
    {
      NoDropout guard(model, kto_.disable_dropout);
      // The policy's forward with gradients: its padding takes no part in a mixture of experts'
      // load-balancing loss (TRL passes the completion's attention mask).
      std::tie(policy, counts) = model_sequence_logps(model, ids.narrow(0, 0, n), labels.narrow(0, 0, n), fused,
                                                      batch.tensors.at("attention_mask").narrow(0, 0, n), &stats);
      if (kl_rows_) {
        torch::NoGradGuard no_grad;  // z0 takes no gradient (TRL computes it under no_grad)
        policy_kl = model_sequence_logps(model, ids.narrow(0, n, n), labels.narrow(0, n, n), fused).first;
      }
    }
    const auto ref = reference_sums(batch, ids, labels, eval).to(device, policy.scalar_type());
    // apo_zero_unpaired has no reference point: TRL logs its kl as 0.
    const auto kl = kl_rows_ ? kto_kl(policy_kl, ref.narrow(0, n, n))
                             : at::zeros({}, at::TensorOptions().dtype(policy.scalar_type()).device(device));
    const auto desirable = to_device(batch.tensors.at("desirable"), device);
    const auto out = kto_loss(policy, ref.narrow(0, 0, n), desirable, kl, loss_opt_);
    add_kto_sums(out, policy, desirable, kl, sums);
    add_kto_logit_sums(stats.mean_logit_sums, counts, desirable, sums);
    add_kto_entropy_sums(stats.entropy_sums, counts, sums);
    return out.losses.sum();
  }

  EvalResult evaluate(models::CausalLM& model) override {
    EvalResult result;
    if (data_.eval.empty()) return result;
    auto whole = reference_.gathered();  // the ranks split the batches unevenly
    {
      EvalMode mode(model);
      torch::NoGradGuard no_grad;
      const auto refs = eval_refs();
      const auto bs = cfg_.eval.batch_size, total = static_cast<int64_t>(refs.size());
      const auto n_batches = (total + bs - 1) / bs;
      const bool split = ranks_.splits(n_batches);
      Sums sums;
      double loss = 0, examples = 0;
      for (int64_t k = 0; k < n_batches; ++k) {
        if (split && !ranks_.runs(k, n_batches)) continue;
        const auto b = eval_batch(refs, k * bs, std::min(total, (k + 1) * bs));
        if (split && !ranks_.mine(k)) {  // the uneven tail: every rank runs it, its owner counts it
          Sums scratch;
          loss_sum(model, b, scratch);
          continue;
        }
        loss += loss_sum(model, b, sums).item<double>();
        examples += static_cast<double>(b.num_targets);
      }
      if (split) {
        const auto head = sum_over_ranks(ranks_, {loss, examples}, sums);
        loss = head[0], examples = head[1];
      }
      result.metrics = kto_metrics(sums, "eval/");
      result.metrics["eval/loss"] = loss / examples;
    }
    // Greedy answers to the held-out prompts of desirable examples.
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> texts, references;
    for (const auto& ref : data_.eval) {
      if (static_cast<int64_t>(prompts.size()) >= cfg_.eval.generate_samples) break;
      const auto& s = (*data_.eval_sets[static_cast<size_t>(ref.dataset)])[ref.index];
      if (!s.desirable) continue;
      prompts.push_back(s.prompt_ids);
      texts.push_back(s.prompt);
      references.push_back(s.completion);
    }
    exact_match_eval(model, tok_, cfg_.eval, stop_id_, prompts, texts, references, result, ranks_);
    return result;
  }

 private:
  /// The train mixture's sampler from its start (with data.shuffle false and no weights, every epoch's order).
  data::MixtureSampler train_sampler() const {
    return data::MixtureSampler(data_.mixture, static_cast<uint64_t>(cfg_.train.seed), data_.shuffle);
  }

  /// The held-out examples the eval loss reads (at most eval.max_batches batches), in order.
  std::vector<data::SampleRef> eval_refs() const {
    auto refs = data_.eval;
    const auto& e = cfg_.eval;
    if (e.max_batches > 0 && static_cast<int64_t>(refs.size()) > e.max_batches * e.batch_size)
      refs.resize(static_cast<size_t>(e.max_batches * e.batch_size));
    return refs;
  }

  /// The eval batch of refs[begin, end), positioned by their place in `refs`.
  Batch eval_batch(const std::vector<data::SampleRef>& refs, int64_t begin, int64_t end) const {
    std::vector<data::SampleRef> part(refs.begin() + begin, refs.begin() + end);
    std::vector<int64_t> positions;
    for (int64_t j = begin; j < end; ++j) positions.push_back(j);
    return collate_kto_refs(data_.eval_sets, part, positions, pad_id_, cfg_.data.max_length, kl_rows_);
  }

  /// TRL's advice when the weights do not balance an epoch's desirable and undesirable examples.
  void warn_on_balance(const std::vector<data::SampleRef>& epoch) const {
    int64_t good = 0;
    for (const auto* s : kto_samples(data_.train, epoch)) good += s->desirable;
    const auto bad = static_cast<int64_t>(epoch.size()) - good;
    if (const auto advice = kto_balance_advice(good, bad, kto_.desirable_weight, kto_.undesirable_weight);
        !advice.empty())
      log::warn(advice);
  }

  /// The reference's summed log-probs of every row of the batch (R; no gradient): from the cache or the model.
  at::Tensor reference_sums(const Batch& batch, const at::Tensor& ids, const at::Tensor& labels, bool eval) {
    if (reference_ || policy_reference_) return reference_forward(ids, labels);
    const auto& sets = eval ? cached_eval_ : cached_train_;
    const auto& dataset = batch.tensors.at("dataset");
    const auto& index = batch.tensors.at("index");
    const auto d = dataset.accessor<int64_t, 1>();
    const auto i = index.accessor<int64_t, 1>();
    std::vector<float> sums;
    for (int64_t e = 0; e < dataset.size(0); ++e)
      sums.push_back(sets[static_cast<size_t>(d[e])].accessor<float, 1>()[i[e]]);
    const auto out = at::tensor(sums, at::kFloat);
    if (!kl_rows_) return out;
    return at::cat({out, (eval ? eval_kl_ : train_kl_).index_select(0, batch.tensors.at("position"))});
  }

  at::Tensor reference_forward(const at::Tensor& ids, const at::Tensor& labels) {
    torch::NoGradGuard no_grad;
    auto& m = policy_reference_ ? *policy_reference_ : *reference_;
    std::optional<models::LoraDisabled> base;
    std::optional<EvalMode> eval;
    if (policy_reference_) base.emplace(m), eval.emplace(m);
    const auto device = m.parameters().front().device();
    return model_sequence_logps(m, ids.to(device), labels.to(device), cfg_.train.fused_loss).first;
  }

  bool read_cache(const stdfs::path& cache);
  void precompute(const stdfs::path& cache, const RunContext& ctx);
  // Several ranks each score every world-th batch and the sums are combined (train/forward_split.h).
  std::vector<at::Tensor> example_sums(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                                       const RunContext& ctx);
  at::Tensor kl_row_sums(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                         const std::vector<data::SampleRef>& refs, int64_t batch_size, const RunContext& ctx);
  std::string fingerprint() const;

  int64_t split_over_ = 1;  // the ranks the last precompute's batches were split over
  config::RunConfig cfg_;
  KtoConfig kto_;
  KtoLossOptions loss_opt_;
  bool kl_rows_;
  const tokenizer::Tokenizer& tok_;
  int64_t pad_id_, stop_id_;
  KtoData data_;
  std::unique_ptr<KtoBatchSource> source_;
  FrozenModel reference_;
  models::CausalLM* policy_reference_ = nullptr;
  // kto.precompute_reference: what identifies the reference, and its log-probs (float32): of each example by
  // (dataset, index) of the train and eval sets, and, for loss_type kto, of each KL row by its example's place in
  // the train epoch's order and in the eval loss's order.
  std::string reference_desc_;
  std::vector<at::Tensor> cached_train_, cached_eval_;
  at::Tensor train_kl_, eval_kl_;
};

// ---- kto.precompute_reference --------------------------------------------------
// As dpo.precompute_reference (docs/algorithms.md): the reference scores every example once before training,
// the result goes to output_dir/reference_logps.safetensors under a fingerprint of the reference and the
// data, and the reference model is freed. With loss_type kto the KL rows are scored too. A KL row pairs an
// example's prompt with the previous completion of its micro-batch, so it is scored by the example's place
// in an epoch's order: the config checks and the constructor make the micro-batches the same every epoch
// (TRL's sequential sampler), and eval batches are the same at every evaluation.

std::string KtoObjective::fingerprint() const {
  Fingerprint h;
  h.mix(reference_desc_);
  h.mix(kl_rows_ ? concat("kl rows: micro-batches of ", cfg_.train.micro_batch_size, ", eval batches of ",
                          cfg_.eval.batch_size, ", max_length ", cfg_.data.max_length)
                 : std::string("no kl rows"));
  for (const auto* sets : {&data_.train, &data_.eval_sets})
    for (const auto& ds : *sets) {
      h.mix(static_cast<uint64_t>(ds->size()));
      for (int64_t i = 0; i < ds->size(); ++i) {
        const auto& s = (*ds)[i];
        h.mix(s.prompt_ids);
        h.mix(~0ull);
        h.mix(s.completion_ids);
        h.mix(~0ull);
        h.mix(s.uncut_completion_ids);
      }
    }
  if (kl_rows_)
    for (const auto& refs : {train_sampler().plan(), eval_refs()})
      for (const auto& r : refs) {
        h.mix(static_cast<uint64_t>(r.dataset));
        h.mix(static_cast<uint64_t>(r.index));
      }
  return h.hex();
}

bool KtoObjective::read_cache(const stdfs::path& cache) {
  if (!stdfs::exists(cache)) return false;
  io::SafetensorsFile f(cache);
  const auto it = f.metadata().find("fingerprint");
  if (it == f.metadata().end() || it->second != fingerprint()) {
    log::info("kto: ", cache.string(), " was computed for other data, batches or another reference; recomputing");
    return false;
  }
  for (size_t d = 0; d < data_.train.size(); ++d) cached_train_.push_back(f.get(concat("train.", d)));
  for (size_t d = 0; d < data_.eval_sets.size(); ++d) cached_eval_.push_back(f.get(concat("eval.", d)));
  if (kl_rows_) {
    train_kl_ = f.get("train_kl");
    eval_kl_ = eval_refs().empty() ? at::empty({0}, at::kFloat) : f.get("eval_kl");
  }
  log::info("kto: reference log-probs read from ", cache.string());
  return true;
}

std::vector<at::Tensor> KtoObjective::example_sums(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                                                   const RunContext& ctx) {
  std::vector<at::Tensor> out;
  const auto bs = cfg_.eval.batch_size;
  for (const auto& ds : sets) {
    auto sums = at::zeros({ds->size()}, at::kFloat);
    const ForwardSplit split(ctx.data_comm(), (ds->size() + bs - 1) / bs, ctx.device);
    if (split.split()) split_over_ = split.world();
    for (int64_t i = 0, k = 0; i < ds->size(); i += bs, ++k) {
      if (!split.runs(k)) continue;
      std::vector<const KtoSample*> ex;
      for (int64_t j = i; j < std::min(ds->size(), i + bs); ++j) ex.push_back(&(*ds)[j]);
      const auto b = collate_kto(ex, pad_id_, cfg_.data.max_length, /*kl_rows=*/false);
      const auto logps = reference_forward(b.tensors.at("input_ids"), b.tensors.at("labels")).cpu();
      if (split.keeps(k)) sums.narrow(0, i, static_cast<int64_t>(ex.size())).copy_(logps);
    }
    split.combine({sums}, "kto reference log-probs of the examples");
    out.push_back(sums);
  }
  return out;
}

at::Tensor KtoObjective::kl_row_sums(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                                     const std::vector<data::SampleRef>& refs, int64_t batch_size,
                                     const RunContext& ctx) {
  const auto total = static_cast<int64_t>(refs.size());
  auto out = at::zeros({total}, at::kFloat);
  const ForwardSplit split(ctx.data_comm(), (total + batch_size - 1) / batch_size, ctx.device);
  if (split.split()) split_over_ = split.world();
  for (int64_t i = 0, k = 0; i < total; i += batch_size, ++k) {
    if (!split.runs(k)) continue;
    const auto n = std::min(total, i + batch_size) - i;
    const std::vector<data::SampleRef> part(refs.begin() + i, refs.begin() + i + n);
    const auto b = collate_kto(kto_samples(sets, part), pad_id_, cfg_.data.max_length, /*kl_rows=*/true);
    const auto logps =
        reference_forward(b.tensors.at("input_ids").narrow(0, n, n), b.tensors.at("labels").narrow(0, n, n)).cpu();
    if (split.keeps(k)) out.narrow(0, i, n).copy_(logps);
  }
  split.combine({out}, "kto reference log-probs of the KL rows");
  return out;
}

void KtoObjective::precompute(const stdfs::path& cache, const RunContext& ctx) {
  torch::NoGradGuard no_grad;
  io::TensorMap tensors;
  cached_train_ = example_sums(data_.train, ctx);
  cached_eval_ = example_sums(data_.eval_sets, ctx);
  for (size_t d = 0; d < cached_train_.size(); ++d) tensors[concat("train.", d)] = cached_train_[d];
  for (size_t d = 0; d < cached_eval_.size(); ++d) tensors[concat("eval.", d)] = cached_eval_[d];
  int64_t kl = 0;
  if (kl_rows_) {
    train_kl_ = kl_row_sums(data_.train, train_sampler().plan(), cfg_.train.micro_batch_size, ctx);
    eval_kl_ = kl_row_sums(data_.eval_sets, eval_refs(), cfg_.eval.batch_size, ctx);
    tensors["train_kl"] = train_kl_;
    if (eval_kl_.numel() > 0) tensors["eval_kl"] = eval_kl_;
    kl = train_kl_.numel() + eval_kl_.numel();
  }
  io::save_safetensors(cache, tensors, {{"fingerprint", fingerprint()}});
  int64_t examples = 0;
  for (const auto& t : cached_train_) examples += t.numel();
  for (const auto& t : cached_eval_) examples += t.numel();
  log::info("kto: reference log-probs of ", examples, " examples", kl_rows_ ? concat(" and ", kl, " KL rows") : "",
            " cached in ", cache.string(),
            split_over_ > 1 ? concat(" (split over ", split_over_, " ranks)") : std::string(),
            "; the reference model is freed");
  reference_.reset();
  policy_reference_ = nullptr;
}

// Checked with the rest of the config, as dpo.reference is: a missing folder fails --dry-run, naming the key.
void check_kto(const KtoConfig& k, const config::RunConfig& cfg, const config::Checks& checks) {
  checks.model_folder("kto.reference", k.reference);
  if (!k.precompute_reference || !kto_uses_kl(k.loss_type)) return;
  // A KL row pairs a prompt with another completion of its micro-batch, so precomputed KL rows need the same
  // micro-batches every epoch, as TRL needs its sequential sampler.
  const std::string why =
      "kto.precompute_reference with loss_type kto scores each KL row (a prompt with the previous completion "
      "of its micro-batch) once, so every epoch must draw the same micro-batches";
  if (cfg.data.shuffle)
    checks.fail("data.shuffle", why +
                                    ": set data.shuffle: false (TRL requires its sequential sampler), or "
                                    "kto.loss_type: apo_zero_unpaired (no KL rows)");
  for (size_t i = 0; i < cfg.data.train.size(); ++i)
    if (cfg.data.train[i].weight > 0)
      checks.fail(concat("data.train[", i, "].weight"),
                  why + ", and weights draw each epoch's datasets at random: use fraction or size instead");
}

}  // namespace

// Registered as a linking program registers its own (examples/custom_objective), from the list of built-in
// objectives (objective_registry.cpp).
void register_kto_objective() {
  config::register_section<KtoConfig>(
      "kto", "Options of the kto algorithm (KTO: unpaired desirable and undesirable completions).", "kto", check_kto,
      {{"precompute_ref_log_probs", "kto.precompute_reference"}});
  // It reads what dpo reads of data and eval, and the fused head.
  const auto reads = dpo_reads();
  register_objective<KtoObjective>("kto", reads);
}

}  // namespace anvil::train
