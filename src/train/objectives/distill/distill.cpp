// On-policy distillation (distill.h): its config section, steps, loss and
// registration.
#include "train/objectives/distill/distill.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "data/mixture.h"
#include "anvil/generation/generate.h"
#include "anvil/train/engine.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/step_batches.h"

namespace anvil::train {

at::Tensor generalized_jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double beta,
                           double temperature) {
  const auto s = (student_logits.to(at::kFloat) / temperature).log_softmax(-1);
  const auto t = (teacher_logits.to(at::kFloat) / temperature).log_softmax(-1);
  // KL(p || q) from log-probs: sum p (log p - log q).
  const auto kl = [](const at::Tensor& lp, const at::Tensor& lq) { return (lp.exp() * (lp - lq)).sum(-1); };
  if (beta == 0) return kl(t, s);
  if (beta == 1) return kl(s, t);
  const auto m = at::logsumexp(at::stack({s + std::log(1 - beta), t + std::log(beta)}), 0);
  return beta * kl(t, m) + (1 - beta) * kl(s, m);
}

namespace {

namespace stdfs = std::filesystem;

/// The `distill:` section (TRL's GKDConfig names).
struct DistillConfig {
  std::string teacher;
  double lmbda = 0.5;
  double beta = 0.5;
  double temperature = 0.9;
  int64_t max_new_tokens = 32;
  bool seq_kd = false;

  void visit(config::FieldVisitor& v) {
    v.field("teacher", teacher,
            "The teacher's model folder (HF layout; the student's vocabulary). Frozen, and sharded like the "
            "student.");
    v.field("lmbda", lmbda,
            "Probability that a step's responses are the student's own samples (on-policy); otherwise they are "
            "the dataset's responses (TRL's lmbda).",
            config::Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("beta", beta,
            "Generalised JSD interpolation: 0 = forward KL(teacher || student), 1 = reverse KL(student || "
            "teacher) (TRL's beta).",
            config::Rule{"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}});
    v.field("temperature", temperature, "Sampling temperature, also dividing both models' logits in the loss.",
            config::positive());
    v.field("max_new_tokens", max_new_tokens, "Most tokens of a sampled response.", config::positive());
    v.field("seq_kd", seq_kd,
            "Sequence-level KD (TRL's seq_kd): the steps that are not on-policy train on the teacher's samples "
            "(temperature, max_new_tokens) instead of the dataset's responses, so records need no response.");
  }
};

/// A prompt (rendered with the generation header) and the dataset's response
/// to it (token ids with the end of turn; empty when the record has none).
struct DistillSample {
  const chat::PromptSample* prompt;
  std::vector<int64_t> response;
  std::string response_text;
};

/// Rows prompt + response; labels are the response tokens. num_targets =
/// response tokens.
Batch collate(const std::vector<std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>>& rows,
              int64_t pad_id) {
  int64_t T = 1;
  for (const auto& [p, r] : rows) T = std::max<int64_t>(T, static_cast<int64_t>(p->size() + r->size()));
  const auto B = static_cast<int64_t>(rows.size());
  auto ids = at::full({B, T}, pad_id, at::kLong), labels = at::full({B, T}, chat::kIgnoreIndex, at::kLong);
  Batch b;
  for (int64_t i = 0; i < B; ++i) {
    const auto& [p, r] = rows[static_cast<size_t>(i)];
    auto* pi = ids[i].data_ptr<int64_t>();
    auto* pl = labels[i].data_ptr<int64_t>();
    std::copy(p->begin(), p->end(), pi);
    std::copy(r->begin(), r->end(), pi + p->size());
    std::copy(r->begin(), r->end(), pl + p->size());
    b.num_targets += static_cast<int64_t>(r->size());
    b.num_tokens += static_cast<int64_t>(p->size() + r->size());
  }
  b.tensors = {{"input_ids", ids}, {"labels", labels}};
  return b;
}

class DistillObjective final : public Objective {
 public:
  DistillObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat)
      : cfg_(cfg),
        d_(cfg.extensions.get<DistillConfig>("distill")),
        tok_(tok),
        pad_id_(tok.padding_id()),
        tmpl_(&chat) {
    stop_id_ = tmpl_->end_of_turn_id(tok);
    if (d_.teacher.empty()) throw ConfigError("distill.teacher: algorithm distill needs the teacher's model folder");
    data_ = load_mixture<data::PromptDataset>(cfg, [&](const config::DatasetConfig& d, const std::string& key) {
      auto ds = load_prompts(cfg, d, key, tok, chat);
      responses_[ds.get()] = responses(*ds, d.response_field, key);
      return std::shared_ptr<const data::PromptDataset>(ds);
    });
    prompts_ =
        std::make_unique<data::MixtureSampler>(data_.mixture, static_cast<uint64_t>(cfg.train.seed), data_.shuffle);
    const auto& first = sample(data_.train.front().get(), 0);
    source_ = std::make_unique<StepBatches>(
        prompts_.get(),
        collate({{&first.prompt->prompt_ids, first.response.empty() ? &first.prompt->prompt_ids : &first.response}},
                pad_id_),
        "distill");
  }

  std::string name() const override { return "distill"; }
  std::string target_unit() const override { return "response tokens"; }
  BatchSource& train_source() override { return *source_; }

  bool prepare_reads_weights() const override { return false; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override {
    if (model.has_score_head())
      throw ConfigError("model.from: algorithm distill trains a language model, but the model is a reward model");
    teacher_ = ctx.freeze(load_reference(d_.teacher, "distill.teacher", model));
    log::info("distill: teacher ", d_.teacher, " (", teacher_.parameter_bytes(), " parameter bytes)");
  }

  Metrics before_iteration(Engine& engine, int64_t iteration, int64_t step) override {
    (void)step;
    const int64_t mbs = cfg_.train.micro_batch_size;
    // The step's micro-batches over all ranks (grad_accum_steps counts them all, as the engine does).
    const int64_t micro =
        cfg_.train.global_batch_size > 0 ? cfg_.train.global_batch_size / mbs : cfg_.train.grad_accum_steps;
    const auto seed = static_cast<uint64_t>(cfg_.train.seed) * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(iteration);
    std::mt19937_64 coin(seed);
    const bool on_policy = std::uniform_real_distribution<double>(0, 1)(coin) < d_.lmbda;
    std::vector<const DistillSample*> rows;
    std::vector<uint64_t> row_seeds;
    for (int64_t i = 0; i < micro * mbs; ++i) {
      const auto before = prompts_->state();
      const auto ref = prompts_->next();
      rows.push_back(&sample(data_.train[static_cast<size_t>(ref.dataset)].get(), ref.index));
      const auto global = static_cast<uint64_t>(before.epoch * prompts_->epoch_length() + before.offset);
      row_seeds.push_back(seed ^ (global * 0x9E3779B97F4A7C15ull));
    }
    std::vector<std::vector<int64_t>> sampled(rows.size());
    // The student's samples (on-policy), the teacher's (seq_kd) or the dataset's responses. Every rank
    // samples every row (per-row seeds: the same tokens anywhere), with the sampling model whole.
    const bool by_teacher = !on_policy && d_.seq_kd;
    if (on_policy || by_teacher) {
      generation::SamplingOptions so;
      so.greedy = false;
      so.temperature = d_.temperature;
      so.eos_id = stop_id_;
      so.max_new_tokens = d_.max_new_tokens;
      so.row_seeds = row_seeds;
      std::vector<std::vector<int64_t>> prompts;
      for (const auto* r : rows) prompts.push_back(r->prompt->prompt_ids);
      if (on_policy) {
        auto whole = engine.gathered();
        EvalMode eval(engine.model());
        if (!student_decoder_) student_decoder_ = std::make_unique<generation::Decoder>(engine.model());
        sampled = student_decoder_->generate(prompts, so);
      } else {
        auto whole = teacher_.gathered();
        EvalMode eval(*teacher_);
        if (!teacher_decoder_) teacher_decoder_ = std::make_unique<generation::Decoder>(*teacher_);
        sampled = teacher_decoder_->generate(prompts, so);
      }
    } else {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i]->response.empty())
          throw DataError(concat(rows[i]->prompt->where,
                                 ": distill.lmbda < 1 trains on the dataset's responses too, "
                                 "and this record has none (data.train[].response_field; or let the teacher "
                                 "sample them: distill.seq_kd)"));
        sampled[i] = rows[i]->response;
      }
    }
    on_policy_ = on_policy;
    by_teacher_ = by_teacher;
    std::vector<Batch> micro_batches;
    for (int64_t k = 0; k < micro; ++k) {
      std::vector<std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>> chunk;
      for (int64_t j = k * mbs; j < (k + 1) * mbs; ++j)
        chunk.push_back({&rows[static_cast<size_t>(j)]->prompt->prompt_ids, &sampled[static_cast<size_t>(j)]});
      micro_batches.push_back(collate(chunk, pad_id_));
    }
    source_->load(std::move(micro_batches));
    return {};
  }

  Metrics step_metrics(const Sums& sums) const override {
    const double n = sums.count("rows") ? sums.at("rows").item<double>() : 0;
    if (n <= 0) return {};
    Metrics m{{"distill/on_policy", sums.at("on_policy").item<double>() / n},
              {"distill/response_length", sums.at("response_tokens").item<double>() / n}};
    if (d_.seq_kd) m["distill/teacher_sampled"] = sums.at("teacher_sampled").item<double>() / n;
    return m;
  }

  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override {
    const auto rows = static_cast<double>(batch.tensors.at("input_ids").size(0));
    add_sum(sums, "rows", at::scalar_tensor(rows, at::kDouble));
    add_sum(sums, "on_policy", at::scalar_tensor(on_policy_ ? rows : 0.0, at::kDouble));
    if (d_.seq_kd) add_sum(sums, "teacher_sampled", at::scalar_tensor(by_teacher_ ? rows : 0.0, at::kDouble));
    add_sum(sums, "response_tokens", at::scalar_tensor(static_cast<double>(batch.num_targets), at::kDouble));
    return divergence_sum(model, batch);
  }

  EvalResult evaluate(models::CausalLM& model) override {
    EvalResult result;
    held_out_divergence(model, result);
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> texts, references;
    for (const auto& ref : data_.eval) {
      if (static_cast<int64_t>(prompts.size()) >= cfg_.eval.generate_samples) break;
      const auto& s = sample(data_.eval_sets[static_cast<size_t>(ref.dataset)].get(), ref.index);
      if (s.response.empty()) continue;
      prompts.push_back(s.prompt->prompt_ids);
      texts.push_back(s.prompt->prompt);
      references.push_back(s.response_text);
    }
    if (!prompts.empty())
      exact_match_eval(model, tok_, cfg_.eval, stop_id_, prompts, texts, references, result, ranks_);
    return result;
  }

 private:
  /// The divergence summed over the response tokens of `batch` (its labels).
  at::Tensor divergence_sum(models::CausalLM& model, const Batch& batch) {
    const auto device = model.parameters().front().device();
    const auto ids = to_device(batch.tensors.at("input_ids"), device);
    const auto labels = to_device(batch.tensors.at("labels"), device);
    const auto T = ids.size(1);
    // Position t predicts token t + 1: the positions before each response token.
    const auto mask = labels.narrow(1, 1, T - 1).ne(chat::kIgnoreIndex);
    const auto student = model.forward(ids).narrow(1, 0, T - 1).index({mask});
    at::Tensor teacher;
    {
      torch::NoGradGuard no_grad;
      auto& t = *teacher_;
      teacher = t.forward(ids.to(t.parameters().front().device())).narrow(1, 0, T - 1).to(device).index({mask});
    }
    return generalized_jsd(student, teacher, d_.beta, d_.temperature).sum();
  }

  /// eval/loss, as GKDTrainer evaluates: the training loss on the eval
  /// records' own responses (teacher forcing), per response token, over
  /// eval.batch_size records at a time (at most eval.max_batches batches).
  /// Records without a response are left out; none at all: no eval/loss.
  void held_out_divergence(models::CausalLM& model, EvalResult& result) {
    std::vector<const DistillSample*> given;
    for (const auto& ref : data_.eval)
      if (const auto& s = sample(data_.eval_sets[static_cast<size_t>(ref.dataset)].get(), ref.index);
          !s.response.empty())
        given.push_back(&s);
    if (given.empty()) return;
    auto whole = teacher_.gathered();  // the ranks split the batches unevenly
    EvalMode mode(model);
    torch::NoGradGuard no_grad;
    const auto total = static_cast<int64_t>(given.size()), bs = cfg_.eval.batch_size;
    int64_t n_batches = (total + bs - 1) / bs;
    if (cfg_.eval.max_batches > 0) n_batches = std::min(n_batches, cfg_.eval.max_batches);
    const bool split = ranks_.splits(n_batches);
    std::vector<double> sums{0, 0};  // divergence, response tokens
    for (int64_t k = 0; k < n_batches; ++k) {
      if (split && !ranks_.runs(k, n_batches)) continue;
      std::vector<std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>> rows;
      for (int64_t i = k * bs; i < std::min(total, (k + 1) * bs); ++i)
        rows.push_back({&given[static_cast<size_t>(i)]->prompt->prompt_ids, &given[static_cast<size_t>(i)]->response});
      const auto b = collate(rows, pad_id_);
      const double divergence = divergence_sum(model, b).item<double>();
      if (split && !ranks_.mine(k)) continue;  // the uneven tail: every rank runs it, its owner counts it
      sums[0] += divergence;
      sums[1] += static_cast<double>(b.num_targets);
    }
    if (split) ranks_.all_sum(sums);
    result.metrics["eval/loss"] = sums[0] / std::max(1.0, sums[1]);
  }

  /// The dataset's responses (field `field`, encoded as replies), "" where a record has none.
  std::vector<DistillSample> responses(const data::PromptDataset& ds, const std::string& field,
                                       const std::string& key) {
    std::vector<DistillSample> out;
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto& p = ds[i];
      DistillSample s{&p, {}, {}};
      if (p.record.contains(field) && p.record[field].is_string()) {
        s.response_text = p.record[field].get<std::string>();
        s.response = tmpl_->encode_reply(tok_, s.response_text);
        if (cfg_.data.max_length > 0) {
          const auto room = std::max<int64_t>(1, cfg_.data.max_length - static_cast<int64_t>(p.prompt_ids.size()));
          if (static_cast<int64_t>(s.response.size()) > room) s.response.resize(static_cast<size_t>(room));
        }
      } else if (p.record.contains(field)) {
        throw DataError(concat(p.where, ": ", key, ".response_field \"", field, "\": expected a string"));
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  const DistillSample& sample(const data::PromptDataset* ds, int64_t i) const {
    return responses_.at(ds)[static_cast<size_t>(i)];
  }

  config::RunConfig cfg_;
  DistillConfig d_;
  const tokenizer::Tokenizer& tok_;
  int64_t pad_id_, stop_id_ = -1;
  const chat::ChatTemplate* tmpl_;
  MixtureData<data::PromptDataset> data_;
  std::map<const data::PromptDataset*, std::vector<DistillSample>> responses_;
  std::unique_ptr<data::MixtureSampler> prompts_;
  std::unique_ptr<StepBatches> source_;
  FrozenModel teacher_;
  std::unique_ptr<generation::Decoder> student_decoder_, teacher_decoder_;  // the samples' decoders
  bool on_policy_ = false;   // the step's responses are the student's samples
  bool by_teacher_ = false;  // the teacher's samples (seq_kd)
};

// Checked with the rest of the config, as dpo.reference is: a missing folder fails --dry-run, naming the key.
void check_distill(const DistillConfig& d, const config::RunConfig&, const config::Checks& checks) {
  checks.model_folder("distill.teacher", d.teacher);
}

}  // namespace

// Called from the list of built-in objectives (objective_registry.cpp).
void register_distill_objective() {
  config::register_section<DistillConfig>(
      "distill", "Options of the distill algorithm (on-policy distillation from a teacher: GKD).", "distill",
      check_distill, {{"teacher_model_name_or_path", "distill.teacher"}});
  // It reads what sft reads of data and eval (prompts, responses, greedy eval), but
  // neither the fused head nor packing.
  auto reads = config::dataset_keys({"eval_fraction", "prompt_field", "response_field", "token_dtype"});
  reads.insert(reads.end(),
               {"data.template", "data.on_overflow", "data.on_error", "eval.max_batches", "eval.generate_samples",
                "eval.max_new_tokens", "eval.table_rows", "train.num_train_epochs", "dist.tensor_parallel"});
  register_objective<DistillObjective>("distill", reads);
}

}  // namespace anvil::train
