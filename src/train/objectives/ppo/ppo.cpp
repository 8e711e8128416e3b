// PPO, GRPO and RLOO on the shared engine (docs/algorithms.md).
//
// An iteration: before_iteration() draws ppo.prompts_per_rollout prompts
// (every rank walks the same prompt stream and generates for its share),
// samples ppo.samples_per_prompt responses each with the KV cache, computes
// the old policy's and the reference's log-probs and the values (a value head
// on the policy's trunk, or a separate critic trained beside it), scores the
// responses, and exchanges the rows so that every rank holds the whole
// rollout. Advantages are then computed identically on every rank, and the
// loop takes ppo_epochs x (rollout / minibatch) optimizer steps; each rank
// trains on its slice of every minibatch, so a run on N ranks takes the same
// steps as one process.
#include "anvil/train/ppo.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <iomanip>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "anvil/core/error.h"
#include "core/device.h"
#include "distributed/comm.h"
#include "distributed/sharding.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "data/mixture.h"
#include "anvil/generation/generate.h"
#include "anvil/checkpoint/hf_model.h"
#include "models/lora.h"
#include "anvil/rewards/rewards.h"
#include "anvil/train/engine.h"
#include "rewards/environment.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/lm_loss.h"
#include "train/objectives/ppo/ppo_metrics.h"
#include "train/objectives/ppo/ppo_rollout.h"
#include "train/objectives/step_batches.h"
#include "train/objectives/ppo/ppo_state.h"

namespace anvil::train {

/// (B, R) log-probabilities of `tokens` at the (B, R, C) hidden states
/// `sel` under softmax(logits / temperature): through the fused head
/// (train.fused_loss), or from the whole (B, R, V) logits. With `entropy`,
/// each position's entropy too (no grad).
at::Tensor token_logps(models::CausalLM& model, const at::Tensor& sel, const at::Tensor& tokens, double temperature,
                       bool fused, at::Tensor* entropy) {
  if (fused && model.final_logit_softcap() == 0) {  // soft-capped logits (Gemma) take the plain head
    const auto head = model.output_head();
    at::Tensor ent;
    auto logp = fused_linear_logprobs(sel.reshape({-1, sel.size(-1)}), head.weight, head.bias, tokens.reshape({-1}),
                                      temperature, {}, entropy ? &ent : nullptr);
    if (entropy) *entropy = ent.view(tokens.sizes());
    return logp.view(tokens.sizes());
  }
  const auto all = (model.logits(sel).to(at::kFloat) / temperature).log_softmax(-1);
  if (entropy) *entropy = -(all.exp() * all).sum(-1).detach();
  return all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
}

PpoObjective::PpoObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                           const chat::ChatTemplate& chat)
    : s_(std::make_unique<State>(cfg, tok)) {
  const auto& p = s_->ppo;
  s_->pad_id = tok.padding_id();
  s_->stop_id = chat.end_of_turn_id(tok);
  s_->kl_coef = p.kl_coef;
  s_->data = load_mixture<data::PromptDataset>(cfg, [&](const config::DatasetConfig& d, const std::string& key) {
    return load_prompts(cfg, d, key, tok, chat);
  });
  s_->prompts =
      std::make_unique<data::MixtureSampler>(s_->data.mixture, static_cast<uint64_t>(cfg.train.seed), s_->data.shuffle);
  RolloutRow first;
  first.prompt = (*s_->data.train.front())[0].prompt_ids;
  s_->source = std::make_unique<StepBatches>(s_->prompts.get(), collate_rollout({&first}, s_->pad_id), "ppo");
  s_->rollout_rows = p.prompts_per_rollout * p.samples_per_prompt;
  if (p.advantage != Advantage::kGae && p.advantage != Advantage::kReinforcePp && p.samples_per_prompt < 2)
    throw ConfigError(concat("ppo.samples_per_prompt: advantage ", kAdvantages.name(p.advantage),
                             " compares the samples of a prompt, so it needs at least 2, got ", p.samples_per_prompt));
  if (s_->rollout_rows % s_->minibatch_rows() != 0)
    throw ConfigError(concat("ppo.prompts_per_rollout: a rollout of ", p.prompts_per_rollout, " x ",
                             p.samples_per_prompt, " = ", s_->rollout_rows,
                             " sequences does not split into minibatches of ", s_->minibatch_rows(),
                             " (train.global_batch_size, or micro_batch_size x grad_accum_steps)"));
  // With an environment, its reward at done is the score, and the reward sources are optional extras.
  s_->rewards = std::make_unique<ResponseRewards>(p.reward, "ppo.reward", p.rewards, "ppo.rewards",
                                                  p.environment.command.empty());
  if (!p.environment.command.empty()) s_->chat = &chat;
  s_->value_head = p.advantage == Advantage::kGae;
}

PpoObjective::~PpoObjective() = default;

BatchSource& PpoObjective::train_source() { return *s_->source; }

std::string PpoObjective::plan(int64_t max_steps) const {
  const auto& p = s_->ppo;
  const int64_t per = steps_per_iteration();
  const int64_t rollouts = (max_steps + per - 1) / per;
  const int64_t epoch = s_->prompts->epoch_length();
  const int64_t mb = s_->minibatch_rows();
  std::ostringstream os;
  os << rollouts << (rollouts == 1 ? " rollout" : " rollouts") << " of " << p.prompts_per_rollout << " prompts x "
     << p.samples_per_prompt << (p.samples_per_prompt == 1 ? " sample" : " samples") << " = " << s_->rollout_rows
     << " responses of up to " << p.max_new_tokens << " new tokens; each rollout trains " << per << " steps ("
     << p.ppo_epochs << (p.ppo_epochs == 1 ? " epoch" : " epochs") << " x " << s_->rollout_rows / mb
     << " minibatches of " << mb << " responses)";
  if (epoch > 0)
    os << "; the rollouts draw " << rollouts * p.prompts_per_rollout << " prompts = " << std::setprecision(3)
       << static_cast<double>(rollouts * p.prompts_per_rollout) / static_cast<double>(epoch) << std::setprecision(6)
       << " epochs of " << epoch << " prompts";
  if (p.dynamic_sampling)
    os << "; dynamic_sampling may draw up to " << p.dynamic_sampling_max_rounds << " x " << p.prompts_per_rollout
       << " prompts per rollout";
  if (!p.environment.command.empty())
    os << "; each response is an episode of up to " << p.max_turns << " assistant turns with ppo.environment, "
       << p.max_new_tokens << " tokens in all (appended messages included)";
  os << "\n  tokens per step: up to " << mb * p.max_new_tokens << " response tokens (" << mb << " responses x "
     << p.max_new_tokens << "), with their prompts";
  return os.str();
}

std::vector<std::string> PpoObjective::check_programs() {
  const auto& p = s_->ppo;
  const auto& sample = (*s_->data.train.front())[0];
  // What the first rollout's first sample would send, had the policy ended its reply at once.
  auto out = s_->rewards->check(sample, {sample.prompt, "", sample.record, true});
  if (p.environment.command.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  auto conversation = sample.messages;
  if (sample.text_prompt || conversation.empty()) conversation = {{"user", sample.prompt}};
  conversation.push_back({"assistant", ""});
  const bool final = p.max_turns == 1;
  rewards::EnvironmentReply reply;
  {
    rewards::EnvironmentProgram environment(p.environment.command, p.environment.timeout_s);
    reply = environment.step(rewards::environment_line(sample.record, conversation, 1, final, true, sample.where));
  }  // stopped: its stdin closed, waited for
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  out.push_back(
      concat("ppo.environment.command \"", p.environment.command, "\" started, answered ",
             reply.done ? concat("done with reward ", reply.reward) : concat("a ", reply.message.role, " message"),
             " to turn 1 of ", sample.where, " (an empty reply, final ", final ? "true" : "false", ") and stopped, in ",
             std::lround(took.count() * 1000), " ms"));
  return out;
}

int64_t PpoObjective::steps_per_iteration() const {
  return s_->ppo.ppo_epochs * (s_->rollout_rows / s_->minibatch_rows());
}

void PpoObjective::prepare(models::CausalLM& model, const RunContext& ctx) {
  if (model.has_score_head())
    throw ConfigError("model.from: algorithm ppo trains a policy (a causal LM), but the model is a reward model");
  s_->ranks = ranks_;
  if (ctx.sharding && ctx.sharding->tensor_parallel && ctx.sharding->tensor_parallel->world_size() > 1)
    s_->tensor_parallel = ctx.sharding->tensor_parallel;
  if (!s_->ppo.environment.command.empty() && !s_->environment) {
    s_->environment =
        std::make_unique<rewards::EnvironmentProgram>(s_->ppo.environment.command, s_->ppo.environment.timeout_s);
    log::info("ppo: environment \"", s_->ppo.environment.command, "\" started; rollouts of up to ", s_->ppo.max_turns,
              " assistant turns and ", s_->ppo.max_new_tokens, " tokens after the prompt");
  }
  if (s_->ppo.prompts_per_rollout % ranks_.world != 0)
    throw ConfigError(concat("ppo.prompts_per_rollout: ", s_->ppo.prompts_per_rollout, " prompts do not divide among ",
                             ranks_.world, ctx.world ? " training ranks" : " ranks"));
  if (const auto R = s_->ppo.async.rollout_ranks; R > 0) {
    if (!ctx.world) throw ConfigError("ppo.async.rollout_ranks: the run was launched without rollout ranks");
    if (s_->ppo.prompts_per_rollout % R != 0)
      throw ConfigError(concat("ppo.prompts_per_rollout: ", s_->ppo.prompts_per_rollout,
                               " prompts do not divide among ", R, " rollout ranks (ppo.async.rollout_ranks)"));
    s_->world = ctx.world;
    s_->trainers = ctx.trainers;
    log::info("ppo.async.rollout_ranks: ranks ", ctx.trainers, "-", ctx.world->world_size() - 1,
              " sample each rollout while ranks 0-", ctx.trainers - 1, " train on the one before");
  }
  const auto& critic_from = s_->ppo.critic_from;
  if (!critic_from.empty()) {
    auto critic = checkpoint::load_model_dir(critic_from);
    if (critic->vocab_size() != model.vocab_size())
      throw ConfigError(concat("ppo.critic_from: ", critic_from, " has a vocabulary of ", critic->vocab_size(),
                               " tokens, the policy ", model.vocab_size(), "; the critic reads the policy's tokens"));
    if (critic->has_score_head()) {
      log::info("ppo: critic from the reward model ", critic_from, "; its score head is the value head");
    } else {
      critic->add_score_head();
      log::info("ppo: critic from ", critic_from, " with a new value head (", critic->hidden_size(), " -> 1)");
    }
    const double lr = s_->ppo.critic_learning_rate > 0 ? s_->ppo.critic_learning_rate : s_->cfg.optimizer.lr;
    s_->critic = ctx.train("critic", std::move(critic), lr);
  } else if (s_->value_head && !model.has_head("value")) {
    model.add_head("value", 1);
    log::info("ppo: added a value head (", model.hidden_size(), " -> 1) on the policy's final hidden states");
  }
  // The reference: ppo.reference, else model.from, else the initial weights.
  const auto& ref_path = !s_->ppo.reference.empty() ? s_->ppo.reference : s_->cfg.model.from;
  if (models::has_lora(model) && s_->ppo.reference.empty()) {
    // As PEFT users do: the reference is the policy with its adapters off.
    log::info("ppo: reference model: the policy with its LoRA adapters off (no second copy)");
    s_->rewards->prepare(ctx.freeze_fn(), "ppo");
    return;
  }
  auto reference = load_reference(ref_path, "ppo.reference", model);
  s_->reference = ctx.freeze(std::move(reference));
  log::info("ppo: reference model from ", ref_path.empty() ? std::string("the initial weights") : ref_path, " (",
            s_->reference.parameter_bytes(), " parameter bytes on this rank)");
  s_->rewards->prepare(ctx.freeze_fn(), "ppo");
}

at::Tensor PpoObjective::State::values(models::CausalLM& policy, const at::Tensor& ids, const at::Tensor& pos,
                                       const at::Tensor& sel) {
  if (!critic) return policy.head("value", sel).squeeze(-1).to(at::kFloat);
  EvalMode no_dropout(*critic);
  const auto hidden = critic->hidden_states(ids, {});
  const auto H = hidden.size(-1);
  return critic->token_scores(hidden.gather(1, pos.unsqueeze(-1).expand({pos.size(0), pos.size(1), H})));
}

std::vector<RolloutRow> PpoObjective::State::generate(models::CausalLM& policy, const std::vector<RolloutPrompt>& mine,
                                                      int64_t per_prompt, uint64_t seed, bool greedy) {
  if (environment) return episodes(policy, mine, per_prompt, seed, greedy);
  std::vector<std::vector<int64_t>> prompts;
  auto so = sampling(greedy);
  for (const auto& p : mine)
    for (int64_t k = 0; k < per_prompt; ++k) {
      prompts.push_back(p.sample->prompt_ids);
      // One stream per sample, from its place in the prompt stream: the same
      // responses whatever the ranks and the generation batches.
      so.row_seeds.push_back(seed ^ (static_cast<uint64_t>(p.global_index * per_prompt + k) * 0x9E3779B97F4A7C15ull));
    }
  const auto out = decoder_of(policy).generate(prompts, so);
  std::vector<RolloutRow> rows(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    rows[i].prompt = prompts[i];
    rows[i].response = out[i];
    rows[i].ended = !out[i].empty() && out[i].back() == stop_id;
  }
  return rows;
}

void PpoObjective::State::forward_logps(models::CausalLM& model, std::vector<RolloutRow>& rows, bool reference_model,
                                        bool values) {
  torch::NoGradGuard no_grad;
  EvalMode eval(model);
  const auto device = model.parameters().front().device();
  const auto mbs = static_cast<size_t>(cfg.train.micro_batch_size);
  for (size_t start = 0; start < rows.size(); start += mbs) {
    const auto end = std::min(rows.size(), start + mbs);
    std::vector<const RolloutRow*> chunk;
    for (size_t i = start; i < end; ++i) chunk.push_back(&rows[i]);
    const auto b = collate_rollout(chunk, pad_id);
    const auto ids = to_device(b.tensors.at("input_ids"), device);
    const auto pos = to_device(b.tensors.at("positions"), device);
    const auto hidden = model.hidden_states(ids, {});
    const auto H = hidden.size(-1);
    const auto sel = hidden.gather(1, pos.unsqueeze(-1).expand({pos.size(0), pos.size(1), H}));
    const auto logp =
        token_logps(model, sel, to_device(b.tensors.at("tokens"), device), ppo.temperature, cfg.train.fused_loss).cpu();
    at::Tensor v;
    if (values) v = this->values(model, ids, pos, sel).cpu();
    for (size_t i = start; i < end; ++i) {
      auto& r = rows[i];
      const auto n = static_cast<int64_t>(r.response.size());
      const auto row = logp[static_cast<int64_t>(i - start)].narrow(0, 0, n).contiguous();
      std::vector<float> lp(row.data_ptr<float>(), row.data_ptr<float>() + n);
      (reference_model ? r.ref_logp : r.old_logp) = std::move(lp);
      if (values) {
        const auto vr = v[static_cast<int64_t>(i - start)].narrow(0, 0, n).contiguous();
        r.values.assign(vr.data_ptr<float>(), vr.data_ptr<float>() + n);
      }
    }
  }
}

std::vector<double> PpoObjective::State::score(const std::vector<RolloutPrompt>& prompts,
                                               const std::vector<RolloutRow>& rows, int64_t per_prompt,
                                               std::vector<std::vector<double>>* components) {
  std::vector<const chat::PromptSample*> of;
  std::vector<std::vector<int64_t>> responses;
  std::vector<bool> ended;
  for (size_t i = 0; i < rows.size(); ++i) {
    of.push_back(prompts[i / static_cast<size_t>(per_prompt)].sample);
    if (environment) {  // the reward sources read the last assistant turn
      responses.push_back(rows[i].answer);
    } else {
      responses.push_back(rows[i].response);
      if (rows[i].ended) responses.back().pop_back();  // the end of turn is the template's, not the answer's
    }
    ended.push_back(rows[i].ended);
  }
  auto out = rewards->score(of, responses, ended, tok, components);
  if (environment)
    for (size_t i = 0; i < rows.size(); ++i) out[i] += rows[i].env_reward;
  return out;
}

std::vector<RolloutPrompt> PpoObjective::State::draw() {
  // Every rank walks the whole prompt stream; each then takes its share.
  std::vector<RolloutPrompt> all;
  for (int64_t g = 0; g < ppo.prompts_per_rollout; ++g) {
    const auto before = prompts->state();
    const auto ref = prompts->next();
    const int64_t global = before.epoch * prompts->epoch_length() + before.offset;
    all.push_back({&(*data.train[static_cast<size_t>(ref.dataset)])[ref.index], global, ref});
  }
  return all;
}

std::vector<RolloutPrompt> PpoObjective::State::share(const std::vector<RolloutPrompt>& all, int64_t rank,
                                                      int64_t ranks) const {
  const auto per = static_cast<int64_t>(all.size()) / ranks;
  return {all.begin() + rank * per, all.begin() + (rank + 1) * per};
}

std::vector<RolloutRow> PpoObjective::State::sample_share(models::CausalLM& policy,
                                                          const std::vector<RolloutPrompt>& mine, uint64_t seed,
                                                          bool with_values, Metrics& m) {
  const auto t0 = std::chrono::steady_clock::now();
  auto local = generate(policy, mine, ppo.samples_per_prompt, seed, false);
  const double rollout_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t produced = 0;
  for (const auto& row : local) produced += static_cast<int64_t>(row.response.size());
  m["time/rollout_s"] = rollout_s;
  if (rollout_s > 0) m["rollout/tokens_per_s"] = static_cast<double>(produced) / rollout_s;
  forward_logps(policy, local, false, with_values);
  return local;
}

std::vector<RolloutRow> PpoObjective::State::collect(Engine& engine, uint64_t seed, Metrics& m) {
  const auto mine = share(draw(), ranks.rank, ranks.world);
  std::vector<RolloutRow> local;
  {
    auto whole = engine.gathered();  // sharded weights stay whole for the whole rollout
    local = sample_share(engine.model(), mine, seed, value_head, m);
  }
  return score_share(engine, mine, std::move(local), m);
}

namespace {

/// Every rank of `group` takes its first rank's `scores` and per-source `parts`.
void agree_on_scores(distributed::Communicator& group, const at::Device& device, std::vector<double>& scores,
                     std::vector<std::vector<double>>& parts) {
  std::vector<double> flat(scores);
  for (const auto& p : parts) flat.insert(flat.end(), p.begin(), p.end());
  auto t = at::tensor(flat, at::kDouble).to(device);
  group.broadcast(t, 0, "tensor parallel: the rollout's scores");
  t = t.cpu().contiguous();
  const auto* v = t.data_ptr<double>();
  std::copy(v, v + scores.size(), scores.begin());
  v += scores.size();
  for (auto& p : parts) {
    std::copy(v, v + p.size(), p.begin());
    v += p.size();
  }
}

}  // namespace

std::vector<RolloutRow> PpoObjective::State::score_share(Engine& engine, const std::vector<RolloutPrompt>& mine,
                                                         std::vector<RolloutRow> local, Metrics& m) {
  const int64_t P = ppo.prompts_per_rollout, K = ppo.samples_per_prompt, W = ranks.world;
  if (environment) {
    // The episodes, over the whole rollout: assistant turns, appended tokens and the environment's reward.
    std::vector<double> st(3, 0.0);
    for (const auto& row : local) {
      st[0] += static_cast<double>(row.turns);
      st[1] += static_cast<double>(std::count(row.appended.begin(), row.appended.end(), uint8_t{1}));
      st[2] += row.env_reward;
    }
    if (W > 1) ranks.all_sum(st);
    const auto n = static_cast<double>(P * K);
    m["env/turns"] = st[0] / n;
    m["env/appended_tokens"] = st[1] / n;
    m["env/reward"] = st[2] / n;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (reference) {
    forward_logps(*reference, local, true, false);
  } else {  // LoRA: the base model is the policy with its adapters off
    auto blocks = engine.evaluating();
    models::LoraDisabled base(engine.model());
    forward_logps(engine.model(), local, true, false);
  }
  {
    auto whole = rewards->gathered();
    std::vector<std::vector<double>> parts;
    auto scores = score(mine, local, K, &parts);
    // The ranks of a tensor-parallel group sampled the same rows; a reward program need not score them alike
    // (a judge that samples), so the group takes its first rank's scores.
    if (tensor_parallel) agree_on_scores(*tensor_parallel, engine.device(), scores, parts);
    for (size_t i = 0; i < local.size(); ++i) local[i].score = scores[i];
    // Each source's unweighted scores over the whole rollout (TRL's rewards/<name>/mean and std).
    const auto names = rewards->names();
    if (!names.empty()) {
      std::vector<double> st(2 * names.size(), 0.0);
      for (size_t j = 0; j < names.size(); ++j)
        for (double x : parts[j]) st[2 * j] += x, st[2 * j + 1] += x * x;
      if (W > 1) ranks.all_sum(st);
      const auto n = static_cast<double>(P * K);
      for (size_t j = 0; j < names.size(); ++j) {
        const double mean = st[2 * j] / n;
        m["rewards/" + names[j] + "/mean"] = mean;
        m["rewards/" + names[j] + "/std"] =
            n > 1 ? std::sqrt(std::max(0.0, (st[2 * j + 1] / n - mean * mean) * n / (n - 1))) : 0.0;
      }
    }
  }
  m["time/reward_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (W == 1) return local;
  // Every rank gets every row: each packs its (P / W) * K rows, gathered in rank order.
  RowCodec codec{cfg.data.max_length, ppo.max_new_tokens};
  std::vector<double> mine_packed(static_cast<size_t>((P / W) * K * codec.width()), 0.0), packed;
  for (size_t i = 0; i < local.size(); ++i)
    codec.put(local[i], mine_packed.data() + static_cast<int64_t>(i) * codec.width());
  ranks.all_gather(mine_packed, packed);
  std::vector<RolloutRow> rows;
  for (int64_t i = 0; i < P * K; ++i) rows.push_back(codec.get(packed.data() + i * codec.width()));
  return rows;
}

std::vector<RolloutRow> PpoObjective::State::fill_groups(Engine& engine, uint64_t seed, std::vector<RolloutRow> first,
                                                         Metrics& m) {
  // Every rank holds every row of a round, so every rank decides alike.
  const int64_t P = ppo.prompts_per_rollout, K = ppo.samples_per_prompt;
  const auto want = static_cast<size_t>(P * K);
  std::vector<RolloutRow> kept, dropped;
  int64_t seen = 0, n_dropped = 0, rounds = 0;
  auto sort_groups = [&](std::vector<RolloutRow>& rows) {
    for (size_t g = 0; g + static_cast<size_t>(K) <= rows.size(); g += static_cast<size_t>(K)) {
      const auto b = rows.begin() + static_cast<std::ptrdiff_t>(g), e = b + K;
      const bool same = std::all_of(b, e, [&](const RolloutRow& r) { return r.score == b->score; });
      ++seen;
      n_dropped += same;
      auto& into = same ? dropped : kept;
      if (!same && kept.size() >= want) continue;  // more than the rollout needs: not used
      into.insert(into.end(), std::make_move_iterator(b), std::make_move_iterator(e));
    }
    ++rounds;
  };
  sort_groups(first);
  while (kept.size() < want && rounds < ppo.dynamic_sampling_max_rounds) {
    Metrics more;                             // the first round's reward statistics stand; times add up
    auto rows = collect(engine, seed, more);  // fresh prompts: row seeds follow their place in the stream
    for (const char* k : {"time/rollout_s", "time/reward_s"}) m[k] += more[k];
    sort_groups(rows);
  }
  const auto short_groups = static_cast<int64_t>((want - std::min(want, kept.size())) / static_cast<size_t>(K));
  for (size_t i = 0; kept.size() < want; ++i) kept.push_back(std::move(dropped[i]));
  m["dynamic_sampling/rounds"] = static_cast<double>(rounds);
  m["dynamic_sampling/dropped_groups"] = static_cast<double>(n_dropped);
  m["dynamic_sampling/dropped_fraction"] = static_cast<double>(n_dropped) / static_cast<double>(seen);
  m["dynamic_sampling/short_groups"] = static_cast<double>(short_groups);
  if (short_groups > 0)
    log::warn("ppo.dynamic_sampling: ", short_groups, " of ", P, " groups still scored alike after ", rounds,
              " rounds (ppo.dynamic_sampling_max_rounds); they stay in the rollout with no advantage");
  return kept;
}

std::pair<at::Tensor, at::Tensor> PpoObjective::State::advantages(const std::vector<RolloutRow>& rows, Metrics& m) {
  const auto N = static_cast<int64_t>(rows.size());
  const int64_t K = ppo.samples_per_prompt;
  // The formulas run over each row's generated tokens, side by side (tokens an environment appended are no actions).
  const auto g = generated_tokens(rows);
  const auto &mask = g.mask, &logp = g.logp, &ref = g.ref, &values = g.values;
  std::vector<double> raw;
  int64_t eos = 0;
  double length = 0;
  for (const auto& r : rows) {
    raw.push_back(r.score);
    eos += r.ended;
    length += static_cast<double>(r.response.size());
  }
  // Scores -> (scaled, clipped) -> per-token rewards -> advantages.
  auto scores = at::tensor(raw, at::kDouble);
  if (ppo.reward.scale == "running") {
    moments.update(raw);
    scores = scores / moments.std;
  }
  if (ppo.reward.clip > 0) scores = scores.clamp(-ppo.reward.clip, ppo.reward.clip);
  if (ppo.overlong_penalty.buffer > 0) {
    // DAPO's soft overlong punishment, on the length of what was generated (the end of turn included).
    const auto& o = ppo.overlong_penalty;
    std::vector<double> penalty;
    for (const auto& r : rows)
      penalty.push_back(overlong_penalty(static_cast<int64_t>(r.response.size()),
                                         o.length > 0 ? o.length : ppo.max_new_tokens, o.buffer, o.factor));
    const auto pen = at::tensor(penalty, at::kDouble);
    m["objective/overlong_penalty"] = pen.mean().item<double>();
    scores = scores + pen;
  }
  const auto kl = kl_estimate(logp, ref, ppo.kl_estimator) * mask;
  const auto non_score = -kl_coef * kl;
  at::Tensor adv, ret;
  if (ppo.advantage == Advantage::kGae) {
    std::tie(adv, ret) = gae(token_rewards(kl, scores, mask, kl_coef), values, mask, ppo.gamma, ppo.lam);
    if (ppo.whiten_advantages) adv = masked_whiten(adv, mask);
  } else if (ppo.advantage == Advantage::kReinforcePp || ppo.advantage == Advantage::kReinforcePpBaseline) {
    // REINFORCE++: the KL-penalised token rewards summed to the end; the baseline variant first takes each
    // score's group mean away. Whitened over the rollout's tokens.
    adv = reinforce_pp_advantages(scores, kl, mask, kl_coef, ppo.advantage == Advantage::kReinforcePpBaseline ? K : 0,
                                  ppo.whiten_advantages);
    ret = at::zeros_like(adv);
  } else {
    // Sequence-level: GRPO on the scores (its KL is a loss term), RLOO on the
    // KL-penalised reward (TRL's RLOOTrainer); every token gets its sequence's.
    const bool grpo = ppo.advantage == Advantage::kGrpo;
    const auto compared = grpo ? scores : scores + non_score.sum(1);
    auto seq = grpo ? grpo_advantages(compared, K, ppo.scale_rewards) : rloo_advantages(compared, K);
    if (ppo.advantage == Advantage::kRloo && ppo.whiten_advantages) seq = (seq - seq.mean()) / (seq.std() + 1e-8);
    adv = seq.unsqueeze(1) * mask;
    ret = at::zeros_like(adv);
    // GRPOTrainer's and RLOOTrainer's names; RLOO's KL is the reward's penalty, GRPO's the loss's (step_metrics).
    const bool kl_penalty = !grpo && kl_coef > 0;
    for (const auto& [k, v] : group_rollout_metrics(
             rows, g, compared, K, grpo && ppo.scale_rewards == ScaleRewards::kBatch, kl_penalty ? kl : at::Tensor()))
      m[k] = v;
  }
  // Metrics of the rollout (TRL's names).
  rollout_kl = kl.sum(1).mean().item<double>();
  m["objective/kl"] = rollout_kl;
  m["objective/kl_coef"] = kl_coef;
  m["objective/entropy"] = (-logp * mask).sum(1).mean().item<double>();
  m["objective/non_score_reward"] = non_score.sum(1).mean().item<double>();
  m["objective/scores"] = at::tensor(raw, at::kDouble).mean().item<double>();
  m["objective/rlhf_reward"] = (scores + non_score.sum(1)).mean().item<double>();  // with the overlong penalty
  m["val/num_eos_tokens"] = static_cast<double>(eos);
  m["val/response_length"] = length / static_cast<double>(N);
  return {at_response_places(adv.to(at::kFloat), g), at_response_places(ret.to(at::kFloat), g)};
}

std::vector<Batch> PpoObjective::State::schedule(const std::vector<RolloutRow>& rows, const at::Tensor& adv,
                                                 const at::Tensor& ret, uint64_t seed) const {
  // Epochs x minibatches of micro-batches. Like every batch source, it yields
  // the whole step's micro-batches on every rank, and the loop keeps
  // micro-batches rank, rank + world, ...
  const auto N = static_cast<int64_t>(rows.size());
  const int64_t mb = minibatch_rows(), mbs = cfg.train.micro_batch_size;
  std::vector<Batch> micro;
  for (int64_t e = 0; e < ppo.ppo_epochs; ++e) {
    const auto order = data::permutation(N, seed * 31 + static_cast<uint64_t>(e) + 1);
    for (int64_t start = 0; start < N; start += mb)
      for (int64_t k = start; k < start + mb; k += mbs) {
        std::vector<const RolloutRow*> chunk;
        std::vector<int64_t> index;
        for (int64_t j = k; j < std::min(k + mbs, start + mb); ++j) {
          chunk.push_back(&rows[static_cast<size_t>(order[static_cast<size_t>(j)])]);
          index.push_back(order[static_cast<size_t>(j)]);
        }
        micro.push_back(collate_rollout(chunk, pad_id, adv, ret, index, weighting()));
      }
  }
  return micro;
}

std::vector<RolloutRow> PpoObjective::State::sample(Engine& engine, int64_t iteration, Metrics& m) {
  const auto seed = iteration_seed(cfg.train.seed, iteration);
  auto rows = collect(engine, seed, m);
  if (ppo.dynamic_sampling) rows = fill_groups(engine, seed, std::move(rows), m);
  return rows;
}

Metrics PpoObjective::before_iteration(Engine& engine, int64_t iteration, int64_t step) {
  (void)step;
  auto& s = *s_;
  Metrics m;
  if (s.learn_seconds > 0) m["time/train_s"] = s.learn_seconds;
  const auto seed = iteration_seed(s.cfg.train.seed, iteration);
  const auto& async = s.ppo.async;
  std::vector<RolloutRow> rows;
  if (!async.one_step_off()) {
    rows = s.sample(engine, iteration, m);
  } else {
    // One step off: train the batch the last iteration sampled (the first iteration samples its own), and
    // sample the next with these weights, before their update: here (emulate), or on the rollout ranks while
    // this iteration trains. A batch's sampling metrics are logged with the iteration that trains it.
    int64_t sampled_by = iteration;
    if (s.requested) s.receive_in_flight(engine);  // the last iteration's last step was skipped (not finite)
    if (!s.in_flight.empty()) {
      rows = std::move(s.in_flight);
      sampled_by = s.in_flight_iteration;
      for (auto& [k, v] : s.in_flight_metrics) m[k] = v;
    } else if (async.rollout_ranks > 0) {
      s.request(engine, iteration, iteration, true);
      rows = s.receive(engine, m);
    } else {
      rows = s.sample(engine, iteration, m);
    }
    s.in_flight.clear();
    s.in_flight_metrics.clear();
    if (async.rollout_ranks > 0) {
      // The first iteration's second batch is sampled by the weights just sent.
      s.request(engine, iteration + 1, iteration, sampled_by != iteration);
      for (auto& [k, v] : std::exchange(s.received_timing, {})) m[k] = v;  // the last hand-offs' times
    } else {
      Metrics next;
      s.in_flight = s.sample(engine, iteration + 1, next);
      move_batch_metrics(next, s.in_flight_metrics);
      for (auto& [k, v] : next) m[k] = v;
    }
    s.in_flight_iteration = iteration;
    m["rollout/staleness"] = static_cast<double>(iteration - sampled_by);
    if (async.correction == OffPolicyCorrection::kTruncatedIs) s.correct_off_policy(engine, rows, m);
  }
  const auto [adv, ret] = s.advantages(rows, m);
  s.source->load(s.schedule(rows, adv, ret, seed));
  s.steps_done_in_iteration = 0;
  s.learn_start = std::chrono::steady_clock::now();
  return m;
}

at::Tensor PpoObjective::loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) {
  const auto& p = s_->ppo;
  EvalMode no_dropout(model);  // as TRL: dropout would make the ratio noisy
  const auto device = model.parameters().front().device();
  auto t = [&](const char* k) { return to_device(batch.tensors.at(k), device); };
  const auto ids = t("input_ids"), pos = t("positions"), mask = t("mask");
  const auto hidden = model.hidden_states(ids, {});
  const auto H = hidden.size(-1);
  const auto sel = hidden.gather(1, pos.unsqueeze(-1).expand({pos.size(0), pos.size(1), H}));
  at::Tensor entropy;
  const auto logp = token_logps(model, sel, t("tokens"), p.temperature, s_->cfg.train.fused_loss, &entropy);
  at::Tensor values;
  if (s_->value_head) values = s_->values(model, ids, pos, sel);
  const auto weights = t("weights");
  const auto terms = ppo_loss_sums(
      logp, t("old_logp"), t("advantages"), values, t("old_values"), t("returns"), mask,
      {p.cliprange, p.cliprange_value, p.cliprange_high, p.importance_sampling_level == ImportanceSampling::kSequence},
      weights, batch.tensors.count("is_weight") ? t("is_weight") : at::Tensor());
  auto loss = terms.policy;
  add_sum(sums, "pg_loss", terms.policy);
  add_sum(sums, "clipfrac", terms.clipfrac);
  add_sum(sums, "clip_low", terms.clip_low);
  add_sum(sums, "clip_high", terms.clip_high);
  add_sum(sums, "approxkl", terms.approxkl);
  add_sum(sums, "ratio", terms.ratio);
  add_sum(sums, "tokens", mask.sum());
  // The loss's divisor (tokens, or responses for sequence_mean and constant): the loss/ metrics use it too.
  add_sum(sums, "targets", at::scalar_tensor(static_cast<double>(batch.num_targets), at::kDouble));
  add_sum(sums, "entropy", (entropy * mask).sum());
  if (values.defined()) {
    loss = loss + p.vf_coef * terms.value;
    add_sum(sums, "vf_loss", terms.value);
    add_sum(sums, "vf_clipfrac", terms.vf_clipfrac);
  }
  if (p.advantage == Advantage::kGrpo && s_->kl_coef > 0) {
    const auto per_token = kl_estimate(logp, t("ref_logp"), KlEstimator::kK3);
    loss = loss + s_->kl_coef * (per_token * weights).sum();  // aggregated like the policy loss
    add_sum(sums, "kl", (per_token * mask).sum());
  }
  return loss;
}

Metrics PpoObjective::step_metrics(const Sums& sums) const {
  return ppo_step_metrics(sums, logs_group_metrics(s_->ppo.advantage));
}

std::vector<std::string> PpoObjective::console_metrics() const {
  // The reward and KL under the names the run logs them by: GRPOTrainer's and RLOOTrainer's, or PPOTrainer's.
  std::vector<std::string> out{"objective/scores", "objective/kl"};
  if (logs_group_metrics(s_->ppo.advantage)) out = {"reward", "kl"};
  if (!s_->ppo.environment.command.empty()) out.push_back("env/turns");
  return out;
}

void PpoObjective::after_step(Engine& engine, int64_t step) {
  auto& s = *s_;
  ++s.steps_done_in_iteration;
  // rollout_ranks: at the iteration's end (or the run's), the batch sampled meanwhile comes in, so that a
  // checkpoint holds it.
  if (s.requested && (s.steps_done_in_iteration == steps_per_iteration() || step >= s.cfg.train.max_steps))
    s.receive_in_flight(engine);
  if (s.steps_done_in_iteration < steps_per_iteration()) return;
  s.learn_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.learn_start).count();
  // The rollout's measured KL moves the coefficient (Ziegler et al.; trlx).
  if (s.ppo.target_kl > 0)
    s.kl_coef = adaptive_kl_update(s.kl_coef, s.rollout_kl, s.ppo.target_kl, s.ppo.kl_horizon,
                                   static_cast<double>(s.rollout_rows));
}

nlohmann::json PpoObjective::state() const {
  nlohmann::json j{{"kl_coef", s_->kl_coef}, {"reward_moments", s_->moments.to_json()}};
  if (s_->ppo.async.one_step_off()) {  // the batch in flight, so that a resume trains what the run would have
    auto rows = nlohmann::json::array();
    for (const auto& r : s_->in_flight)
      rows.push_back({{"prompt", r.prompt},
                      {"response", r.response},
                      {"ended", r.ended},
                      {"old_logp", r.old_logp},
                      {"ref_logp", r.ref_logp},
                      {"values", r.values},
                      {"score", r.score},
                      {"appended", r.appended}});
    j["in_flight"] = {
        {"sampled_by_iteration", s_->in_flight_iteration}, {"rows", rows}, {"metrics", s_->in_flight_metrics}};
  }
  return j;
}

void PpoObjective::restore(const nlohmann::json& state) {
  s_->kl_coef = state.at("kl_coef").get<double>();
  s_->moments = RunningMoments::from_json(state.at("reward_moments"));
  if (!s_->ppo.async.one_step_off()) return;
  if (!state.contains("in_flight"))
    throw CheckpointError(
        "trainer state: the one-step-off schedule (ppo.async) resumes a checkpoint that holds its batch in "
        "flight; this one was saved without ppo.async.emulate or ppo.async.rollout_ranks");
  const auto& f = state.at("in_flight");
  s_->in_flight_iteration = f.at("sampled_by_iteration").get<int64_t>();
  s_->in_flight_metrics = f.value("metrics", Metrics{});
  s_->in_flight.clear();
  for (const auto& r : f.at("rows")) {
    RolloutRow row;
    r.at("prompt").get_to(row.prompt);
    r.at("response").get_to(row.response);
    row.ended = r.at("ended").get<bool>();
    r.at("old_logp").get_to(row.old_logp);
    r.at("ref_logp").get_to(row.ref_logp);
    r.at("values").get_to(row.values);
    row.score = r.at("score").get<double>();
    r.at("appended").get_to(row.appended);
    s_->in_flight.push_back(std::move(row));
  }
}

EvalResult PpoObjective::evaluate(models::CausalLM& model) {
  auto& s = *s_;
  EvalResult result;
  result.third_column = "reward";
  if (s.data.eval.empty()) return result;
  std::vector<RolloutPrompt> all;
  for (const auto& ref : s.data.eval) {
    if (static_cast<int64_t>(all.size()) >= s.cfg.eval.generate_samples) break;
    all.push_back(
        {&(*s.data.eval_sets[static_cast<size_t>(ref.dataset)])[ref.index], static_cast<int64_t>(all.size())});
  }
  if (all.empty()) return result;
  const bool split = s.ranks.splits(static_cast<int64_t>(all.size()));
  std::vector<RolloutPrompt> mine;
  for (size_t i = 0; i < all.size(); ++i)
    if (!split || s.ranks.mine(static_cast<int64_t>(i))) mine.push_back(all[i]);
  std::vector<RolloutRow> rows;
  {
    models::WholeParameters whole(model);  // multi-turn episodes call generate as often as each rank's need
    rows = s.generate(model, mine, 1, 0, true);
  }
  std::vector<double> scores;
  std::vector<std::vector<double>> parts;
  {
    auto whole = s.rewards->gathered();  // ranks score different numbers of rows
    scores = s.score(mine, rows, 1, &parts);
  }
  const auto names = s.rewards->names();
  std::vector<double> totals(3 + names.size(), 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    totals[0] += scores[i];
    totals[1] += static_cast<double>(rows[i].response.size());
    totals[2] += static_cast<double>(rows[i].turns);
    for (size_t j = 0; j < names.size(); ++j) totals[3 + j] += parts[j][i];
    if (static_cast<int64_t>(result.samples.size()) < s.cfg.eval.table_rows) {
      auto response = rows[i].response;
      if (rows[i].ended) response.pop_back();
      result.samples.push_back({mine[i].sample->prompt, s.tok.decode(response), concat(scores[i])});
    }
  }
  if (split) s.ranks.all_sum(totals);
  const auto n = static_cast<double>(all.size());
  result.metrics["eval/reward"] = totals[0] / n;
  result.metrics["eval/response_length"] = totals[1] / n;
  if (s.rewards->is_exact_match() && !s.environment) result.metrics["eval/exact_match"] = totals[0] / n;
  if (s.environment) result.metrics["eval/turns"] = totals[2] / n;
  for (size_t j = 0; j < names.size(); ++j) result.metrics["eval/rewards/" + names[j]] = totals[3 + j] / n;
  return result;
}

}  // namespace anvil::train
