// KTO (kto.h): its config section, data, batches, loss and registration.
#include "train/kto.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "data/jsonl.h"
#include "data/mixture.h"
#include "models/lora.h"
#include "anvil/train/preference.h"
#include "train/lm_data.h"
#include "train/preference_data.h"

namespace anvil::train {

// ---- formulas ------------------------------------------------------------------

at::Tensor kto_kl(const at::Tensor& policy_kl_logps, const at::Tensor& ref_kl_logps) {
  return (policy_kl_logps - ref_kl_logps).mean().clamp_min(0).detach();
}

KtoLossOutput kto_loss(const at::Tensor& policy_logps, const at::Tensor& ref_logps, const at::Tensor& desirable,
                       const at::Tensor& kl, const KtoLossOptions& opt) {
  const auto logratio = policy_logps - ref_logps;
  const auto good = (1 - at::sigmoid(opt.beta * (logratio - kl))) * opt.desirable_weight;
  const auto bad = (1 - at::sigmoid(opt.beta * (kl - logratio))) * opt.undesirable_weight;
  return {at::where(desirable, good, bad), (opt.beta * logratio).detach()};
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
  average("kl", "kl_batches");
  return m;
}

namespace {

namespace stdfs = std::filesystem;

/// The `kto:` section.
struct KtoConfig {
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
  std::string reference;
  bool disable_dropout = true;

  void visit(config::FieldVisitor& v) {
    v.field("beta", beta, "Strength of the implicit KL penalty to the reference (TRL's beta).", config::positive());
    v.field("desirable_weight", desirable_weight,
            "Weight of a desirable example's loss (lambda_D; TRL advises desirable_weight x desirable examples / "
            "(undesirable_weight x undesirable examples) in [1, 4/3]).",
            config::positive());
    v.field("undesirable_weight", undesirable_weight, "Weight of an undesirable example's loss (lambda_U).",
            config::positive());
    v.field("reference", reference,
            "Reference model folder (HF layout). Empty = model.from, or a frozen copy of the initial weights "
            "when model.from is empty; with LoRA, the policy with its adapters off.");
    v.field("disable_dropout", disable_dropout, "Run the model without dropout while training (as TRL does).");
  }
};

class KtoDataset {
 public:
  static KtoDataset load(const stdfs::path& path, const tokenizer::Tokenizer& tok, const data::ReadOptions& opt);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const KtoSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const data::DatasetStats& stats() const { return stats_; }

 private:
  std::vector<KtoSample> samples_;
  data::DatasetStats stats_;
};

std::string completion_text(const data::Record& rec, const std::string& field) {
  const auto& v = rec.at(field);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && v.size() == 1 && v[0].is_object() && v[0].contains("role") && v[0]["role"] == "assistant" &&
      v[0].contains("content") && v[0]["content"].is_string())
    return v[0]["content"].get<std::string>();
  rec.fail(field, concat("expected a string or a list of one assistant message, got ", v.dump()));
}

KtoDataset KtoDataset::load(const stdfs::path& path, const tokenizer::Tokenizer& tok, const data::ReadOptions& opt) {
  KtoDataset ds;
  const auto& tmpl = data::chat_format(opt);
  const auto& pf = opt.prompt_field;
  const auto r = data::read_jsonl(path, opt.on_error, [&](const data::Record& rec) {
    const bool paired = rec.has("chosen") || rec.has("rejected");
    if (paired ? !(rec.has(pf) && rec.has("chosen") && rec.has("rejected"))
               : !(rec.has(pf) && rec.has("completion") && rec.has("label"))) {
      std::string fields;
      for (const auto& [k, v] : rec.json().items()) fields += (fields.empty() ? "" : ", ") + k;
      throw DataError(concat(rec.where(), ": expected a KTO record: {\"", pf,
                             "\", \"completion\", \"label\": true | false} (TRL's unpaired preference format) or a "
                             "pair {\"",
                             pf,
                             "\", \"chosen\", \"rejected\"} (unpaired into a desirable and an "
                             "undesirable example); this line has fields ",
                             fields.empty() ? std::string("none") : fields,
                             ". data.train[].prompt_field maps another prompt name"));
    }
    std::vector<std::pair<std::string, bool>> completions;
    if (paired) {
      completions = {{completion_text(rec, "chosen"), true}, {completion_text(rec, "rejected"), false}};
    } else {
      if (!rec.at("label").is_boolean())
        rec.fail("label", concat("expected true (desirable) or false (undesirable), got ", rec.at("label").dump()));
      completions = {{completion_text(rec, "completion"), rec.at("label").get<bool>()}};
    }
    const auto msgs = data::record_messages(rec, pf, "", false);
    std::vector<int64_t> prompt_ids;
    std::vector<std::vector<int64_t>> ids;
    try {
      prompt_ids = data::encode_record_prompt(tok, tmpl, msgs, data::is_text_prompt(rec, pf), data::record_tools(rec));
      for (const auto& [text, good] : completions) ids.push_back(tmpl.encode_reply(tok, text));
    } catch (const DataError& e) {
      if (std::string_view(e.what()).substr(0, rec.where().size()) == rec.where()) throw;
      throw DataError(concat(rec.where(), ": ", e.what()));
    }
    std::string prompt;
    for (size_t i = 0; i < msgs.size(); ++i) prompt += (i ? "\n" : "") + msgs[i].content;
    for (size_t i = 0; i < completions.size(); ++i) {
      auto& c = ids[i];
      std::vector<int64_t> uncut;
      if (opt.max_length > 0) {
        const auto room = opt.max_length - static_cast<int64_t>(prompt_ids.size());
        if (static_cast<int64_t>(c.size()) > room) {
          if (opt.drop_overflow) {
            ++ds.stats_.dropped_overflow;
            continue;
          }
          if (room < 1) {
            ++ds.stats_.dropped_no_target;
            continue;
          }
          uncut = c;
          c.resize(static_cast<size_t>(room));
          ++ds.stats_.truncated;
        }
      }
      ds.samples_.push_back(
          {prompt_ids, std::move(c), std::move(uncut), completions[i].second, prompt, completions[i].first});
    }
  });
  ds.stats_.lines = r.lines;
  ds.stats_.skipped_errors = r.skipped;
  ds.stats_.first_errors = r.first_errors;
  if (ds.samples_.empty()) throw DataError(concat(path.string(), ": no usable samples (", ds.stats_.summary(), ")"));
  return ds;
}

using KtoData = MixtureData<KtoDataset>;

}  // namespace

Batch collate_kto(const std::vector<const KtoSample*>& ex, int64_t pad_id, int64_t max_length) {
  TORCH_CHECK(!ex.empty(), "collate_kto: empty batch");
  const auto n = static_cast<int64_t>(ex.size());
  std::vector<std::pair<const std::vector<int64_t>*, std::vector<int64_t>>> rows;  // prompt, completion
  for (int64_t i = 0; i < n; ++i)
    rows.push_back({&ex[static_cast<size_t>(i)]->prompt_ids, ex[static_cast<size_t>(i)]->completion_ids});
  for (int64_t i = 0; i < n; ++i) {
    const auto* other = ex[static_cast<size_t>((i + n - 1) % n)];
    auto c = other->uncut_completion_ids.empty() ? other->completion_ids : other->uncut_completion_ids;
    const auto& p = ex[static_cast<size_t>(i)]->prompt_ids;
    if (max_length > 0 && static_cast<int64_t>(p.size() + c.size()) > max_length)
      c.resize(static_cast<size_t>(std::max<int64_t>(1, max_length - static_cast<int64_t>(p.size()))));
    rows.push_back({&p, std::move(c)});
  }
  int64_t T = 0;
  for (const auto& [p, c] : rows) T = std::max<int64_t>(T, static_cast<int64_t>(p->size() + c.size()));
  auto ids = at::full({2 * n, T}, pad_id, at::kLong);
  auto labels = at::full({2 * n, T}, chat::kIgnoreIndex, at::kLong);
  auto mask = at::zeros({2 * n, T}, at::kBool);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pl = labels.data_ptr<int64_t>();
  Batch b;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& [p, c] = rows[r];
    const auto row = static_cast<int64_t>(r) * T, P = static_cast<int64_t>(p->size());
    std::copy(p->begin(), p->end(), pi + row);
    std::copy(c.begin(), c.end(), pi + row + P);
    std::copy(c.begin(), c.end(), pl + row + P);
    mask[static_cast<int64_t>(r)].narrow(0, 0, P + static_cast<int64_t>(c.size())).fill_(true);
    b.num_tokens += P + static_cast<int64_t>(c.size());
  }
  std::vector<uint8_t> good;
  for (const auto* e : ex) good.push_back(e->desirable);
  b.tensors["input_ids"] = ids;
  b.tensors["labels"] = labels;
  b.tensors["attention_mask"] = mask;
  b.tensors["desirable"] = at::tensor(at::ArrayRef<uint8_t>(good), at::kByte).to(at::kBool);
  b.num_targets = n;
  return b;
}

namespace {

/// Micro-batches of `micro_batch_size` examples from the train mixture.
class KtoBatchSource final : public BatchSource {
 public:
  KtoBatchSource(std::vector<std::shared_ptr<const KtoDataset>> sets, data::MixtureSampler sampler,
                 int64_t micro_batch_size, int64_t pad_id, int64_t max_length)
      : sets_(std::move(sets)),
        sampler_(std::move(sampler)),
        micro_batch_size_(micro_batch_size),
        pad_id_(pad_id),
        max_length_(max_length) {}
  Batch next() override {
    std::vector<const KtoSample*> ex;
    for (int64_t i = 0; i < micro_batch_size_; ++i) {
      const auto r = sampler_.next();
      ex.push_back(&(*sets_[static_cast<size_t>(r.dataset)])[r.index]);
    }
    return collate_kto(ex, pad_id_, max_length_);
  }
  nlohmann::json state() const override { return sampler_state(sampler_); }
  void restore(const nlohmann::json& state) override { restore_sampler(sampler_, state); }
  int64_t samples_per_epoch() const override { return sampler_.epoch_length(); }

 private:
  std::vector<std::shared_ptr<const KtoDataset>> sets_;
  data::MixtureSampler sampler_;
  int64_t micro_batch_size_, pad_id_, max_length_;
};

class KtoObjective final : public Objective {
 public:
  KtoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat)
      : cfg_(cfg),
        kto_(cfg.extensions.get<KtoConfig>("kto")),
        tok_(tok),
        pad_id_(tok.padding_id()),
        stop_id_(chat.end_of_turn_id(tok)) {
    data_ = load_mixture<KtoDataset>(cfg, [&](const config::DatasetConfig& d, const std::string& key) {
      const auto o = record_read_options(cfg, d, chat, key, "preference", "KTO or preference records");
      auto ds = std::make_shared<KtoDataset>(KtoDataset::load(d.path, tok, o));
      int64_t good = 0;
      for (int64_t i = 0; i < ds->size(); ++i) good += (*ds)[i].desirable;
      log::info(d.path, ": ", ds->size(), " examples, ", good, " desirable and ", ds->size() - good, " undesirable (",
                ds->stats().summary(), ")");
      for (const auto& e : ds->stats().first_errors) log::warn("skipped: ", e);
      return std::shared_ptr<const KtoDataset>(std::move(ds));
    });
    data::MixtureSampler sampler(data_.mixture, static_cast<uint64_t>(cfg.train.seed), data_.shuffle);
    source_ = std::make_unique<KtoBatchSource>(data_.train, std::move(sampler), cfg.train.micro_batch_size, pad_id_,
                                               cfg.data.max_length);
  }

  std::string name() const override { return "kto"; }
  std::string target_unit() const override { return "KTO examples"; }
  BatchSource& train_source() override { return *source_; }
  Metrics step_metrics(const Sums& sums) const override { return kto_metrics(sums); }
  StepReads step_reads() const override { return StepReads::late; }  // no after_step

  void prepare(models::CausalLM& model, const RunContext& ctx) override {
    if (model.has_score_head())
      throw ConfigError("model.from: algorithm kto trains a language model, but the model is a reward model");
    if (models::has_lora(model) && kto_.reference.empty()) {
      policy_reference_ = &model;
      log::info("kto: reference model: the policy with its LoRA adapters off (no second copy)");
      return;
    }
    const auto& path = !kto_.reference.empty() ? kto_.reference : cfg_.model.from;
    reference_ = ctx.freeze(load_reference(path, "kto.reference", model));
    log::info("kto: reference model from ", path.empty() ? std::string("the initial weights") : path, " (",
              reference_.parameter_bytes(), " parameter bytes)");
  }

  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override {
    const auto device = model.parameters().front().device();
    const auto n = batch.num_targets;
    const auto ids = to_device(batch.tensors.at("input_ids"), device),
               labels = to_device(batch.tensors.at("labels"), device);
    const bool fused = cfg_.train.fused_loss;
    at::Tensor policy, policy_kl;
    {
      NoDropout guard(model, kto_.disable_dropout);
      // The policy's forward with gradients: its padding takes no part in a mixture of experts'
      // load-balancing loss (TRL passes the completion's attention mask).
      policy = model_sequence_logps(model, ids.narrow(0, 0, n), labels.narrow(0, 0, n), fused,
                                    batch.tensors.at("attention_mask").narrow(0, 0, n))
                   .first;
      torch::NoGradGuard no_grad;  // z0 takes no gradient (TRL computes it under no_grad)
      policy_kl = model_sequence_logps(model, ids.narrow(0, n, n), labels.narrow(0, n, n), fused).first;
    }
    const auto ref = reference_sums(ids, labels).to(policy.scalar_type());
    const auto kl = kto_kl(policy_kl, ref.narrow(0, n, n));
    const auto desirable = to_device(batch.tensors.at("desirable"), device);
    const auto out = kto_loss(policy, ref.narrow(0, 0, n), desirable, kl,
                              {kto_.beta, kto_.desirable_weight, kto_.undesirable_weight});
    add_kto_sums(out, policy, desirable, kl, sums);
    return out.losses.sum();
  }

  EvalResult evaluate(models::CausalLM& model) override {
    EvalResult result;
    if (data_.eval.empty()) return result;
    auto whole = reference_.gathered();  // the ranks split the batches unevenly
    {
      EvalMode mode(model);
      torch::NoGradGuard no_grad;
      auto refs = data_.eval;
      const auto& e = cfg_.eval;
      if (e.max_batches > 0 && static_cast<int64_t>(refs.size()) > e.max_batches * e.batch_size)
        refs.resize(static_cast<size_t>(e.max_batches * e.batch_size));
      const auto bs = static_cast<size_t>(e.batch_size);
      const auto n_batches = static_cast<int64_t>((refs.size() + bs - 1) / bs);
      const bool split = ranks_.splits(n_batches);
      Sums sums;
      double loss = 0, examples = 0;
      for (int64_t k = 0; k < n_batches; ++k) {
        if (split && !ranks_.mine(k)) continue;
        std::vector<const KtoSample*> ex;
        for (size_t j = static_cast<size_t>(k) * bs; j < std::min(refs.size(), static_cast<size_t>(k + 1) * bs); ++j)
          ex.push_back(&(*data_.eval_sets[static_cast<size_t>(refs[j].dataset)])[refs[j].index]);
        const auto b = collate_kto(ex, pad_id_, cfg_.data.max_length);
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
  /// The reference's summed log-probs of every row (no gradient).
  at::Tensor reference_sums(const at::Tensor& ids, const at::Tensor& labels) {
    torch::NoGradGuard no_grad;
    auto& m = policy_reference_ ? *policy_reference_ : *reference_;
    std::optional<models::LoraDisabled> base;
    std::optional<EvalMode> eval;
    if (policy_reference_) base.emplace(m), eval.emplace(m);
    const auto device = m.parameters().front().device();
    return model_sequence_logps(m, ids.to(device), labels.to(device), cfg_.train.fused_loss).first;
  }

  config::RunConfig cfg_;
  KtoConfig kto_;
  const tokenizer::Tokenizer& tok_;
  int64_t pad_id_, stop_id_;
  KtoData data_;
  std::unique_ptr<KtoBatchSource> source_;
  FrozenModel reference_;
  models::CausalLM* policy_reference_ = nullptr;
};

// Checked with the rest of the config, as dpo.reference is: a missing folder fails --dry-run, naming the key.
void check_kto(const KtoConfig& k, const config::RunConfig&, const config::Checks& checks) {
  checks.model_folder("kto.reference", k.reference);
}

// Registered as a linking program registers its own (examples/custom_objective).
const bool kRegistered = [] {
  config::register_section<KtoConfig>(
      "kto", "Options of the kto algorithm (KTO: unpaired desirable and undesirable completions).", "kto", check_kto);
  // It reads what dpo reads of data and eval, and the fused head.
  const auto reads = dpo_reads();
  register_objective<KtoObjective>("kto", reads);
  return true;
}();

}  // namespace

}  // namespace anvil::train
