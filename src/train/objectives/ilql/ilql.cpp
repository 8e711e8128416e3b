// ILQL on the shared engine (docs/algorithms.md).
//
// A micro-batch holds offline_rl samples, right-padded. Every labelled token
// (the response and its end of turn) is an action taken in the state before
// it: state j is the hidden state at the position before action j, and the
// state after the last action is the hidden state at the last token. The Q
// and V heads read those states; the loss is trlx's; every
// ilql.steps_for_target_q_sync steps the target Q heads move toward the Q
// heads (Polyak, on the float32 master values through the engine).
#include "anvil/train/ilql.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <limits>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "data/mixture.h"
#include "anvil/generation/generate.h"
#include "anvil/rewards/rewards.h"
#include "anvil/train/engine.h"
#include "train/objectives/ilql/ilql_data.h"
#include "train/objectives/lm_data.h"

namespace anvil::train {

using rewards::ResponseRewards;

// ---- formulas ------------------------------------------------------------------

IlqlTerms ilql_loss_sums(const at::Tensor& logits, const std::vector<at::Tensor>& qs,
                         const std::vector<at::Tensor>& target_qs, const at::Tensor& vs, const at::Tensor& actions,
                         const at::Tensor& rewards, const at::Tensor& dones, const IlqlLossOptions& o) {
  TORCH_CHECK(!qs.empty() && qs.size() == target_qs.size(), "ilql_loss_sums: one target per Q head");
  const auto A = actions.size(1);
  TORCH_CHECK(vs.size(1) == A + 1 && dones.size(1) == A + 1, "ilql_loss_sums: vs and dones have A + 1 states");
  const auto dt = vs.scalar_type();
  const auto m = dones.narrow(1, 0, A).to(dt);
  const auto a = actions.unsqueeze(-1);
  auto taken = [&](const at::Tensor& x) { return x.gather(-1, a).squeeze(-1); };
  auto ce = [&](const at::Tensor& x) { return x.logsumexp(-1) - taken(x); };
  at::Tensor tq;
  for (const auto& t : target_qs) {
    const auto v = taken(t.detach());
    tq = tq.defined() ? at::minimum(tq, v) : v;
  }
  const auto V = vs.narrow(1, 0, A);
  const auto vnext = vs.narrow(1, 1, A) * dones.narrow(1, 1, A).to(dt);
  const auto y = rewards.to(dt) + o.gamma * vnext.detach();
  IlqlTerms t;
  t.count = m.sum();
  auto stat = [&](const std::string& k, const at::Tensor& x) {
    const auto d = x.detach();
    t.stats[k] = {(d * m).sum(), (d * d * m).sum()};
  };
  for (size_t k = 0; k < qs.size(); ++k) {
    const auto q = taken(qs[k]);
    const auto lq = ((q - y).pow(2) * m).sum(), lc = (ce(qs[k]) * m).sum();
    t.q = t.q.defined() ? t.q + lq : lq;
    t.cql = t.cql.defined() ? t.cql + lc : lc;
    stat(concat("q", k), q);
  }
  const auto diff = tq - V;
  const auto above = diff.ge(0).to(dt);
  const auto w = above * o.tau + (1 - above) * (1 - o.tau);
  t.v = (w * diff.pow(2) * m).sum();
  const auto awac_w = (o.awac_beta * diff).exp().detach();
  t.awac = (ce(logits) * awac_w * m).sum();
  t.loss = t.q + t.v + o.cql_scale * t.cql + o.awac_scale * t.awac;
  stat("v", V);
  stat("advantage", diff);
  stat("awac_weight", awac_w);
  return t;
}

at::Tensor polyak(const at::Tensor& target, const at::Tensor& source, double alpha) {
  return alpha * source + (1 - alpha) * target;
}

at::Tensor ilql_shaped_scores(const at::Tensor& logits, const std::vector<at::Tensor>& target_qs, const at::Tensor& v,
                              double beta) {
  auto scores = logits.log_softmax(-1);
  if (beta == 0) return scores;
  at::Tensor q;
  for (const auto& t : target_qs) q = q.defined() ? at::minimum(q, t) : t;
  return scores + beta * (q - v.unsqueeze(-1));
}

// ---- heads ---------------------------------------------------------------------

bool has_ilql_heads(const models::CausalLM& model) {
  return model.has_head("q1") && model.has_head("target_q1") && model.has_head("v");
}

void add_ilql_heads(models::CausalLM& model, bool two_qs) {
  const auto C = model.hidden_size(), V = model.vocab_size();
  for (const std::string q : {"q1", "q2"}) {
    if (q == "q2" && !two_qs) break;
    if (!model.has_head(q)) model.add_head(q, {V, 2 * C});
    const auto target = "target_" + q;
    if (model.has_head(target)) continue;
    model.add_head(target, {V, 2 * C});
    auto params = model.named_parameters();
    at::NoGradGuard no_grad;
    const auto prefix = "heads." + q;  // "heads.q1.0.weight" -> "heads.target_q1.0.weight"
    for (const auto& p : params)
      if (p.key().rfind(prefix + ".", 0) == 0)
        params["heads." + target + p.key().substr(prefix.size())].copy_(p.value());
  }
  if (!model.has_head("v")) model.add_head("v", {1, 2 * C});
}

std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> ilql_score_fn(models::CausalLM& model, double beta) {
  if (!has_ilql_heads(model))
    throw std::invalid_argument("the model has no ILQL heads (q1, target_q1, v in heads.json)");
  std::vector<std::string> targets{"target_q1"};
  if (model.has_head("target_q2")) targets.push_back("target_q2");
  return [&model, targets, beta](const at::Tensor& hidden, const at::Tensor& logits) {
    std::vector<at::Tensor> tq;
    for (const auto& t : targets) tq.push_back(model.head(t, hidden).to(at::kFloat));
    const auto v = model.head("v", hidden).squeeze(-1).to(at::kFloat);
    return ilql_shaped_scores(logits.to(at::kFloat), tq, v, beta);
  };
}

// ---- data ----------------------------------------------------------------------

Batch collate_offline(const std::vector<const data::OfflineRlSample*>& samples, int64_t pad_id, double mean,
                      double scale) {
  const auto B = static_cast<int64_t>(samples.size());
  std::vector<std::vector<int64_t>> acts(samples.size());
  int64_t T = 1, A = 1;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = *samples[i];
    for (size_t t = 1; t < s.labels.size(); ++t)
      if (s.labels[t] != chat::kIgnoreIndex) acts[i].push_back(static_cast<int64_t>(t));
    T = std::max<int64_t>(T, static_cast<int64_t>(s.input_ids.size()));
    A = std::max<int64_t>(A, static_cast<int64_t>(acts[i].size()));
  }
  auto ids = at::full({B, T}, pad_id, at::kLong), states = at::zeros({B, A + 1}, at::kLong);
  auto actions = at::zeros({B, A}, at::kLong), dones = at::zeros({B, A + 1}, at::kFloat);
  auto rewards = at::zeros({B, A}, at::kFloat);
  auto si = states.accessor<int64_t, 2>(), ai = actions.accessor<int64_t, 2>();
  auto di = dones.accessor<float, 2>(), ri = rewards.accessor<float, 2>();
  Batch b;
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = *samples[static_cast<size_t>(i)];
    const auto& act = acts[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(act.size());
    std::copy(s.input_ids.begin(), s.input_ids.end(), ids[i].data_ptr<int64_t>());
    for (int64_t j = 0; j < n; ++j) {
      const auto t = act[static_cast<size_t>(j)];
      si[i][j] = t - 1;
      ai[i][j] = s.input_ids[static_cast<size_t>(t)];
      di[i][j] = 1;
      if (!s.token_rewards.empty()) ri[i][j] = static_cast<float>(s.token_rewards[static_cast<size_t>(j)] * scale);
    }
    if (n > 0) {
      si[i][n] = act.back();
      const double last = s.token_rewards.empty() ? (s.reward - mean) * scale : ri[i][n - 1] - mean * scale;
      ri[i][n - 1] = static_cast<float>(last);
    }
    b.num_targets += n;
    b.num_tokens += static_cast<int64_t>(s.input_ids.size());
  }
  b.tensors = {{"input_ids", ids}, {"states", states}, {"actions", actions}, {"rewards", rewards}, {"dones", dones}};
  return b;
}

namespace {

/// Micro-batches of offline_rl samples in the mixture's order.
class OfflineSource final : public BatchSource {
 public:
  OfflineSource(const MixtureData<data::OfflineRlDataset>& data, uint64_t seed, int64_t micro_batch, int64_t pad_id,
                double mean, double scale)
      : data_(data),
        sampler_(data.mixture, seed, data.shuffle),
        micro_(micro_batch),
        pad_(pad_id),
        mean_(mean),
        scale_(scale) {}
  Batch next() override {
    std::vector<const data::OfflineRlSample*> rows;
    for (int64_t i = 0; i < micro_; ++i) {
      const auto ref = sampler_.next();
      rows.push_back(&(*data_.train[static_cast<size_t>(ref.dataset)])[ref.index]);
    }
    return collate_offline(rows, pad_, mean_, scale_);
  }
  nlohmann::json state() const override { return sampler_state(sampler_); }
  void restore(const nlohmann::json& state) override { restore_sampler(sampler_, state); }
  int64_t samples_per_epoch() const override { return sampler_.epoch_length(); }

 private:
  const MixtureData<data::OfflineRlDataset>& data_;
  data::MixtureSampler sampler_;
  int64_t micro_, pad_;
  double mean_, scale_;
};

}  // namespace

// ---- the objective -------------------------------------------------------------

struct IlqlObjective::State {
  config::RunConfig cfg;
  const IlqlConfig& o;
  const tokenizer::Tokenizer& tok;
  int64_t pad_id = 0, stop_id = -1;
  MixtureData<data::OfflineRlDataset> data;
  std::vector<std::shared_ptr<const data::PromptDataset>> eval_sets;
  std::unique_ptr<OfflineSource> source;
  std::unique_ptr<ResponseRewards> rewards;
  std::vector<std::string> qs;
  RankContext ranks;

  State(const config::RunConfig& c, const tokenizer::Tokenizer& t) : cfg(c), o(ilql_config(cfg)), tok(t) {}
};

IlqlObjective::IlqlObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                             const chat::ChatTemplate& chat)
    : s_(std::make_unique<State>(cfg, tok)) {
  auto& s = *s_;
  s.pad_id = tok.padding_id();
  s.stop_id = chat.end_of_turn_id(tok);
  s.qs = s.o.two_qs ? std::vector<std::string>{"q1", "q2"} : std::vector<std::string>{"q1"};
  auto train_cfg = cfg;
  train_cfg.data.eval.clear();  // held-out prompts are read below
  s.data = load_mixture<data::OfflineRlDataset>(train_cfg, [&](const config::DatasetConfig& d, const std::string& key) {
    check_format(d, key, config::DataFormat::kOfflineRl,
                 "algorithm ilql trains on offline_rl records ({prompt, response, reward})");
    if (d.eval_fraction > 0)
      throw ConfigError(concat(key,
                               ".eval_fraction: algorithm ilql evaluates by sampling held-out prompts; give "
                               "them as data.eval (prompts records)"));
    auto ds =
        std::make_shared<data::OfflineRlDataset>(data::OfflineRlDataset::load(d.path, tok, read_options(cfg, d, chat)));
    log::info(d.path, ": ", ds->size(), " offline RL samples (", ds->stats().summary(), ")");
    return ds;
  });
  for (size_t i = 0; i < cfg.data.eval.size(); ++i) {
    const auto& d = cfg.data.eval[i];
    const auto key = concat("data.eval[", i, "]");
    check_format(d, key, config::DataFormat::kPrompts, "algorithm ilql evaluates on prompts records ({prompt, ...})");
    auto o = read_options(cfg, d, chat);
    s.eval_sets.push_back(std::make_shared<data::PromptDataset>(data::PromptDataset::load(d.path, tok, o)));
  }
  // trlx standardises the rewards over the dataset: (r - mean) / (std + eps).
  double mean = 0, scale = 1;
  if (s.o.normalize_rewards) {
    double sum = 0, sq = 0, n = 0;
    for (const auto& ds : s.data.train)
      for (int64_t i = 0; i < ds->size(); ++i) {
        const double r = (*ds)[i].reward;
        sum += r, sq += r * r, n += 1;
      }
    mean = sum / n;
    if (n > 1) {
      const double var = std::max(0.0, (sq - n * mean * mean) / (n - 1));
      scale = 1.0 / (std::sqrt(var) + std::numeric_limits<double>::epsilon());
    }
    log::info("ilql: rewards standardised over ", static_cast<int64_t>(n), " responses (mean ", mean, ", std ",
              1.0 / scale, ")");
  }
  s.source = std::make_unique<OfflineSource>(s.data, static_cast<uint64_t>(cfg.train.seed), cfg.train.micro_batch_size,
                                             s.pad_id, mean, scale);
  s.rewards = std::make_unique<ResponseRewards>(s.o.reward, "ilql.reward", false);
}

IlqlObjective::~IlqlObjective() = default;

BatchSource& IlqlObjective::train_source() { return *s_->source; }

bool IlqlObjective::trains(const std::string& name) const { return name.rfind("heads.target_", 0) != 0; }

std::vector<std::string> IlqlObjective::check_programs() {
  // The rewards score the eval's samples: the first eval prompt's, had the policy ended its reply at once.
  for (const auto& ds : s_->eval_sets)
    if (ds->size() > 0) {
      const auto& sample = (*ds)[0];
      return s_->rewards->check(sample, {sample.prompt, "", sample.record, true});
    }
  return {};
}

void IlqlObjective::prepare(models::CausalLM& model, const RunContext& ctx) {
  if (model.has_score_head())
    throw ConfigError("model.from: algorithm ilql trains a policy (a causal LM), but the model is a reward model");
  s_->ranks = ranks_;
  const bool had = has_ilql_heads(model);
  add_ilql_heads(model, s_->o.two_qs);
  if (!had)
    log::info("ilql: added heads ", s_->o.two_qs ? "q1, q2, target_q1, target_q2" : "q1, target_q1", ", v (MLPs ",
              model.hidden_size(), " -> ", 2 * model.hidden_size(), " -> vocab / 1)");
  s_->rewards->prepare(ctx.freeze_fn(), "ilql");
}

at::Tensor IlqlObjective::loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) {
  const auto& o = s_->o;
  const auto device = model.parameters().front().device();
  auto t = [&](const char* k) { return to_device(batch.tensors.at(k), device); };
  const auto ids = t("input_ids"), states = t("states");
  const auto hidden = model.hidden_states(ids, {});
  const auto H = hidden.size(-1), A = states.size(1) - 1;
  const auto hs = hidden.gather(1, states.unsqueeze(-1).expand({states.size(0), A + 1, H}));  // (B, A + 1, C)
  const auto ha = hs.narrow(1, 0, A);
  std::vector<at::Tensor> qs, tqs;
  for (const auto& q : s_->qs) {
    qs.push_back(model.head(q, ha).to(at::kFloat));
    torch::NoGradGuard no_grad;
    tqs.push_back(model.head("target_" + q, ha.detach()).to(at::kFloat));
  }
  const auto vs = model.head("v", hs).squeeze(-1).to(at::kFloat);
  const auto terms = ilql_loss_sums(model.logits(ha).to(at::kFloat), qs, tqs, vs, t("actions"), t("rewards"),
                                    t("dones"), {o.tau, o.gamma, o.cql_scale, o.awac_scale, o.awac_beta});
  add_sum(sums, "loss_q", terms.q);
  add_sum(sums, "loss_v", terms.v);
  add_sum(sums, "loss_cql", terms.cql);
  add_sum(sums, "loss_awac", terms.awac);
  add_sum(sums, "count", terms.count);
  for (const auto& [k, v] : terms.stats) {
    add_sum(sums, k + ".sum", v.first);
    add_sum(sums, k + ".sq", v.second);
  }
  return terms.loss;
}

Metrics IlqlObjective::step_metrics(const Sums& sums) const {
  const auto get = [&](const std::string& k) { return sum_value(sums, k); };
  const auto& o = s_->o;
  const double n = std::max(1.0, get("count"));
  Metrics m{{"losses/loss_q", get("loss_q") / n},
            {"losses/loss_v", get("loss_v") / n},
            {"losses/loss_cql", get("loss_cql") / n},
            {"losses/loss_awac", get("loss_awac") / n}};
  m["losses/loss"] = m["losses/loss_q"] + m["losses/loss_v"] + o.cql_scale * m["losses/loss_cql"] +
                     o.awac_scale * m["losses/loss_awac"];
  auto stat = [&](const std::string& key, const std::string& name) {
    if (!sums.count(key + ".sum")) return;
    const double mean = get(key + ".sum") / n;
    m[name + "/mean"] = mean;
    m[name + "/std"] = std::sqrt(std::max(0.0, get(key + ".sq") / n - mean * mean));
  };
  stat("v", "values");
  stat("q0", "qvalues/0");
  stat("q1", "qvalues/1");
  stat("advantage", "advantages");
  stat("awac_weight", "awac_weight");
  return m;
}

void IlqlObjective::after_step(Engine& engine, int64_t step) {
  const auto& o = s_->o;
  if (step % o.steps_for_target_q_sync != 0) return;
  // target <- alpha q + (1 - alpha) target, on the float32 master values.
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::string>> pairs;  // (target, source)
  for (const auto& p : engine.model().named_parameters(/*recurse=*/true)) {
    for (const auto& q : s_->qs) {
      const auto prefix = "heads." + q + ".";
      if (p.key().rfind(prefix, 0) != 0) continue;
      const auto target = "heads.target_" + q + "." + p.key().substr(prefix.size());
      pairs.emplace_back(target, p.key());
      names.push_back(target);
      names.push_back(p.key());
    }
  }
  const auto values = engine.get_parameters(names);
  std::map<std::string, at::Tensor> updated;
  for (const auto& [target, source] : pairs)
    updated.emplace(target, polyak(values.at(target), values.at(source), o.alpha));
  engine.set_parameters(updated);
}

EvalResult IlqlObjective::evaluate(models::CausalLM& model) {
  auto& s = *s_;
  EvalResult result;
  result.third_column = "reward";
  std::vector<const chat::PromptSample*> all;
  for (const auto& ds : s.eval_sets)
    for (int64_t i = 0; i < ds->size() && static_cast<int64_t>(all.size()) < s.cfg.eval.generate_samples; ++i)
      all.push_back(&(*ds)[i]);
  if (all.empty()) return result;
  const bool split = s.ranks.splits(static_cast<int64_t>(all.size()));
  std::vector<const chat::PromptSample*> mine;
  std::vector<std::vector<int64_t>> prompts;
  generation::SamplingOptions so;
  so.greedy = false;
  so.temperature = s.o.temperature;
  so.top_k = s.o.top_k;
  so.eos_id = s.stop_id;
  so.max_new_tokens = s.o.max_new_tokens;
  so.batch_size = s.cfg.eval.batch_size;
  so.score_fn = ilql_score_fn(model, s.o.beta);
  for (size_t i = 0; i < all.size(); ++i) {
    if (split && !s.ranks.mine(static_cast<int64_t>(i))) continue;
    mine.push_back(all[i]);
    prompts.push_back(all[i]->prompt_ids);
    // One stream per prompt: the same samples whatever the ranks and batches.
    so.row_seeds.push_back(static_cast<uint64_t>(s.cfg.train.seed) ^ ((i + 1) * 0x9E3779B97F4A7C15ull));
  }
  auto out = generation::generate(model, prompts, so);
  std::vector<bool> ended;
  for (auto& r : out) {
    ended.push_back(!r.empty() && r.back() == s.stop_id);
    if (ended.back()) r.pop_back();
  }
  std::vector<double> scores(out.size(), 0.0);
  if (s.rewards->enabled()) {
    auto whole = s.rewards->gathered();  // ranks score different numbers of rows
    scores = s.rewards->score(mine, out, ended, s.tok);
  }
  std::vector<double> totals{0, 0};
  for (size_t i = 0; i < out.size(); ++i) {
    totals[0] += scores[i];
    totals[1] += static_cast<double>(out[i].size());
    if (static_cast<int64_t>(result.samples.size()) < s.cfg.eval.table_rows)
      result.samples.push_back(
          {mine[i]->prompt, s.tok.decode(out[i]), s.rewards->enabled() ? concat(scores[i]) : std::string()});
  }
  if (split) s.ranks.all_sum(totals);
  const auto n = static_cast<double>(all.size());
  if (s.rewards->enabled()) result.metrics["eval/reward"] = totals[0] / n;
  result.metrics["eval/response_length"] = totals[1] / n;
  if (s.rewards->is_exact_match()) result.metrics["eval/exact_match"] = totals[0] / n;
  return result;
}

// ilql: registered through register_objective as a linking program registers its own
// (examples/custom_objective), from the list of built-in objectives (objective_registry.cpp).
void register_ilql_objective() {
  config::register_section<IlqlConfig>("ilql", "Offline RL: ILQL (algorithm: ilql; docs/algorithms.md).", "ilql",
                                       [](const IlqlConfig& o, const config::RunConfig&, const config::Checks& checks) {
                                         checks.model_folder("ilql.reward.model", o.reward.model);
                                       });
  auto reads = config::dataset_keys({"prompt_field", "response_field"});
  reads.insert(reads.end(), {"data.template", "data.on_overflow", "data.on_error", "eval.generate_samples",
                             "eval.table_rows", "train.num_train_epochs"});
  register_objective<IlqlObjective>("ilql", reads);
}

}  // namespace anvil::train
