// The one-step-off schedule's parts (docs/algorithms.md, "One-step-off-policy
// training"): the truncated importance weights, and ppo.async.rollout_ranks,
// the sampling on ranks of their own.
//
// Every hand-off is a blocking collective over the whole launch, at a fixed
// point of the schedule, so a run is as deterministic as ppo.async.emulate on
// the training ranks alone, which is its oracle:
//   before iteration i, the trainers send a command (the batch's iteration and
//     its prompts) and the weights after update i - 1 unit by unit, as the
//     engine gathers them (Engine::unit_parameters: one unit whole at a time):
//     per unit a count and a list of the parameters sent, then each
//     parameter, the k-th from trainer k mod T (cast to dist.param_dtype);
//   the rollout ranks sample batch i + 1 while the trainers train batch i;
//   at the end of iteration i, each rollout rank broadcasts its rows; the
//     trainers score them as a colocated rollout is scored and hold the batch
//     in flight (it is saved with a checkpoint).
// The first iteration samples two batches with the same weights; a resumed
// run sends every parameter again. The rows' per-sample seeds make the tokens
// independent of which rank samples them.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <thread>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "core/test_hooks.h"
#include "distributed/comm.h"
#include "train/objectives/ppo/ppo_state.h"

namespace anvil::train {
namespace {

enum Command : int64_t { kStop = 0, kSample = 1 };
// The command: what, the batch's iteration, the weights' version (the iteration whose weights they are),
// whether weights follow, parameters the trainers' model has; then (dataset, index, global index) per prompt.
constexpr int64_t kCommand = 5;
// A rollout rank's rows follow a header: seconds sampling, tokens sampled, seconds waiting for the trainers,
// the weights' hash (two 32-bit halves) and version.
constexpr int64_t kHeader = 6;

at::ScalarType param_dtype(const config::RunConfig& cfg) {
  switch (cfg.dist.param_dtype) {
    case config::Dtype::kBFloat16:
      return at::kBFloat16;
    case config::Dtype::kFloat16:
      return at::kHalf;
    default:
      return at::kFloat;
  }
}

/// FNV-1a over a tensor's bytes (64-bit words, then the tail).
uint64_t tensor_hash(const at::Tensor& t) {
  const auto c = t.detach().cpu().contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

/// A model's weights' hash: parameter k's tensor_hash times 2k + 1, summed (mod 2^64), so that the
/// parameters may be hashed in any order (the trainers' units, the rollout rank's model order).
uint64_t weight_term(int64_t k, const at::Tensor& t) { return tensor_hash(t) * (2 * static_cast<uint64_t>(k) + 1); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// A rollout rank's part of the trainers' weights broadcasts: unit by unit, a header (how many
/// parameters of the unit follow; 0 ends), their (index, numel) list, then each parameter, the k-th sent
/// from trainer k mod trainers.
void receive_weights(const SideContext& ctx, std::vector<at::Tensor>& params, bool perturb) {
  torch::NoGradGuard no_grad;
  const auto& world = ctx.world;
  const auto longs = at::TensorOptions(at::kLong).device(ctx.device);
  for (int64_t k = 0;;) {
    auto header = at::empty({1}, longs);
    world->broadcast(header, 0, "the weights sent to the rollout ranks (a unit's count)");
    const auto n = header.cpu().item<int64_t>();
    if (n == 0) return;
    auto list = at::empty({2 * n}, longs);
    world->broadcast(list, 0, "the weights sent to the rollout ranks (a unit's list)");
    list = list.cpu().contiguous();
    for (int64_t j = 0; j < n; ++j, ++k) {
      const auto index = list.data_ptr<int64_t>()[2 * j], numel = list.data_ptr<int64_t>()[2 * j + 1];
      if (index < 0 || index >= static_cast<int64_t>(params.size()) ||
          params[static_cast<size_t>(index)].numel() != numel)
        throw ConfigError(concat("ppo.async.rollout_ranks: the trainers send parameter ", index, " of ", numel,
                                 " values, which rank ", world->rank(), "'s model does not have"));
      auto& p = params[static_cast<size_t>(index)];
      auto buf = at::empty({numel}, p.options());
      world->broadcast(buf, static_cast<int>(k % ctx.trainers), "the weights sent to the rollout ranks");
      p.detach().view({-1}).copy_(buf);
      if (perturb && k == 0) p.detach().view({-1})[0].add_(1e-3);  // test hook: ppo.async.check_weights must see it
    }
  }
}

}  // namespace

void PpoObjective::State::correct_off_policy(Engine& engine, std::vector<RolloutRow>& rows, Metrics& m) {
  const auto behaviour = generated_tokens(rows).logp;  // N x A: the log-probs of the weights that sampled them
  {
    auto blocks = engine.evaluating();                       // under full_shard a block at a time, as an evaluation
    forward_logps(engine.model(), rows, false, value_head);  // the proximal log-probs (and values)
  }
  const auto g = generated_tokens(rows);
  const auto w = truncated_is_weights(g.logp, behaviour, g.mask, ppo.async.is_cap).contiguous();
  const auto* wp = w.data_ptr<double>();
  const auto A = static_cast<size_t>(w.size(1));
  for (size_t i = 0; i < rows.size(); ++i) {  // back in their places; 0 at the tokens an environment appended
    rows[i].is_weight.assign(rows[i].response.size(), 0.f);
    for (size_t j = 0; j < g.places[i].size(); ++j)
      rows[i].is_weight[static_cast<size_t>(g.places[i][j])] = static_cast<float>(wp[i * A + j]);
  }
  const double n = g.mask.sum().item<double>();
  if (n > 0) {
    m["rollout/is_weight_mean"] = w.sum().item<double>() / n;
    m["rollout/is_weight_max"] = w.max().item<double>();
    m["rollout/is_weight_clipfrac"] =
        ((at::exp(g.logp - behaviour) > ppo.async.is_cap).to(at::kDouble) * g.mask).sum().item<double>() / n;
  }
}

void move_batch_metrics(Metrics& from, Metrics& batch) {
  for (auto it = from.begin(); it != from.end();) {
    const auto& k = it->first;
    if (k.rfind("time/", 0) == 0 || k.find("_per_s") != std::string::npos) {
      ++it;
      continue;
    }
    batch[k] = it->second;
    it = from.erase(it);
  }
}

void PpoObjective::State::receive_in_flight(Engine& engine) {
  Metrics got;
  in_flight = receive(engine, got);
  in_flight_metrics.clear();
  move_batch_metrics(got, in_flight_metrics);
  for (auto& [k, v] : got) received_timing[k] = v;
}

void PpoObjective::State::request(Engine& engine, int64_t iteration, int64_t weights_of, bool send_weights) {
  const int64_t P = ppo.prompts_per_rollout;
  requested_prompts = draw();
  // Which parameters go: every one the first time a rollout rank gets weights (those the run does not train
  // too), later the trained ones alone (a LoRA run's adapters).
  std::map<std::string, int64_t> index;
  std::map<std::string, bool> trained;
  for (const auto& p : engine.model().named_parameters()) {
    trained[p.key()] = p.value().requires_grad();
    index.emplace(p.key(), static_cast<int64_t>(index.size()));
  }
  const bool every = weights_version < 0;
  auto command = at::zeros({kCommand + 3 * P}, at::kLong);
  auto* c = command.data_ptr<int64_t>();
  c[0] = kSample;
  c[1] = iteration;
  c[2] = send_weights ? weights_of : weights_version;
  c[3] = send_weights ? 1 : 0;
  c[4] = static_cast<int64_t>(index.size());
  for (int64_t g = 0; g < P; ++g) {
    const auto& p = requested_prompts[static_cast<size_t>(g)];
    c[kCommand + 3 * g] = p.ref.dataset;
    c[kCommand + 3 * g + 1] = p.ref.index;
    c[kCommand + 3 * g + 2] = p.global_index;
  }
  const auto device = engine.device();
  world->broadcast(command.to(device), 0, "the rollout ranks' command");
  if (!send_weights) {
    requested = true;
    return;
  }
  // Unit by unit, as the engine gathers them: one unit whole at a time on a trainer.
  torch::NoGradGuard no_grad;
  const auto dtype = param_dtype(cfg);
  const bool check = ppo.async.check_weights;
  const auto units = engine.parameter_units();
  int64_t bytes = 0, k = 0;
  uint64_t hash = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<size_t> go;
    for (size_t j = 0; j < units[u].size(); ++j)
      if (every || trained.at(units[u][j])) go.push_back(j);
    if (go.empty() && !check) continue;
    const auto values = engine.unit_parameters(u);
    if (check)
      for (size_t j = 0; j < values.size(); ++j) hash += weight_term(index.at(units[u][j]), values[j].to(dtype));
    if (go.empty()) continue;
    auto list = at::empty({2 * static_cast<int64_t>(go.size())}, at::kLong);
    for (size_t i = 0; i < go.size(); ++i) {
      list.data_ptr<int64_t>()[2 * i] = index.at(units[u][go[i]]);
      list.data_ptr<int64_t>()[2 * i + 1] = values[go[i]].numel();
    }
    world->broadcast(at::full({1}, static_cast<int64_t>(go.size()), at::kLong).to(device), 0,
                     "the weights sent to the rollout ranks (a unit's count)");
    world->broadcast(list.to(device), 0, "the weights sent to the rollout ranks (a unit's list)");
    for (const auto j : go) {
      // Spread over the trainers: each sends every trainers-th parameter (all of them hold the unit here).
      const int root = static_cast<int>(k++ % trainers);
      auto t = ranks.rank == root ? values[j].to(dtype).contiguous().view({-1})
                                  : at::empty({values[j].numel()}, values[j].options().dtype(dtype));
      world->broadcast(t, root, "the weights sent to the rollout ranks");
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
    }
  }
  world->broadcast(at::zeros({1}, at::kLong).to(device), 0, "the weights sent to the rollout ranks (a unit's count)");
  weights_version = weights_of;
  received_timing["rollout/weights_sent_bytes"] = static_cast<double>(bytes);
  if (check) sent_hash[weights_version] = hash;
  requested = true;
}

std::vector<RolloutRow> PpoObjective::State::receive_rows(Engine& engine) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t P = ppo.prompts_per_rollout, K = ppo.samples_per_prompt;
  const int64_t R = world->world_size() - trainers;
  const RowCodec codec{cfg.data.max_length, ppo.max_new_tokens};
  const int64_t per = P / R * K;
  std::vector<RolloutRow> rows;
  double rollout_s = 0, tokens = 0, waited = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int root = static_cast<int>(trainers + r);
    auto buf = at::empty({kHeader + per * codec.width()}, at::TensorOptions(at::kDouble).device(engine.device()));
    world->broadcast(buf, root, concat("the rows of rollout rank ", root));
    buf = buf.cpu().contiguous();
    const double* h = buf.data_ptr<double>();
    rollout_s = std::max(rollout_s, h[0]);
    tokens += h[1];
    waited = std::max(waited, h[2]);
    if (ppo.async.check_weights) {
      const auto version = static_cast<int64_t>(h[5]);
      const uint64_t hash = (static_cast<uint64_t>(h[3]) << 32) | static_cast<uint64_t>(h[4]);
      const auto it = sent_hash.find(version);
      if (it == sent_hash.end() || it->second != hash)
        throw Error(
            concat("ppo.async.check_weights: rollout rank ", root, " sampled with weights of version ", version,
                   " whose hash (", hash, ") is not that of the weights the trainers sent",
                   it == sent_hash.end() ? std::string(" (no such version was sent)") : concat(" (", it->second, ")")));
    }
    for (int64_t i = 0; i < per; ++i) rows.push_back(codec.get(h + kHeader + i * codec.width()));
  }
  // Hashes of versions no batch will be sampled with again.
  while (!sent_hash.empty() && sent_hash.begin()->first < weights_version) sent_hash.erase(sent_hash.begin());
  received_timing["time/wait_rollout_s"] = seconds_since(t0);
  received_timing["time/rollout_s"] = rollout_s;
  if (rollout_s > 0) received_timing["rollout/tokens_per_s"] = tokens / rollout_s;
  received_timing["time/wait_train_s"] = waited;
  requested = false;
  return rows;
}

std::vector<RolloutRow> PpoObjective::State::receive(Engine& engine, Metrics& m) {
  auto rows = receive_rows(engine);
  // Scored as a colocated rollout is: each trainer its share, then every trainer gets every row.
  const int64_t per = ppo.prompts_per_rollout / ranks.world * ppo.samples_per_prompt;
  const auto first = rows.begin() + ranks.rank * per;
  std::vector<RolloutRow> local(std::make_move_iterator(first), std::make_move_iterator(first + per));
  return score_share(engine, share(requested_prompts, ranks.rank, ranks.world), std::move(local), m);
}

void PpoObjective::finish(Engine& engine) {
  auto& s = *s_;
  if (!s.world) return;
  if (s.requested) (void)s.receive_rows(engine);  // a batch no iteration will train
  auto command = at::zeros({kCommand + 3 * s.ppo.prompts_per_rollout}, at::kLong);
  command.data_ptr<int64_t>()[0] = kStop;
  s.world->broadcast(command.to(engine.device()), 0, "the rollout ranks' command");
}

void PpoObjective::serve(models::CausalLM& model, const SideContext& ctx) {
  auto& s = *s_;
  const auto& world = ctx.world;
  const int64_t T = ctx.trainers, R = world->world_size() - T, me = world->rank() - T;
  const int64_t P = s.ppo.prompts_per_rollout;
  if (P % R != 0)
    throw ConfigError(concat("ppo.prompts_per_rollout: ", P, " prompts do not divide among ", R,
                             " rollout ranks (ppo.async.rollout_ranks)"));
  // What sampling needs of the policy: the value head (its values are the behaviour's; a separate critic
  // stays with the trainers), and the environment program for multi-turn rollouts.
  const bool values = s.value_head && s.ppo.critic_from.empty();
  if (values && !model.has_head("value")) model.add_head("value", 1);
  model.to(ctx.device, param_dtype(s.cfg));
  if (!s.ppo.environment.command.empty() && !s.environment)
    s.environment =
        std::make_unique<rewards::EnvironmentProgram>(s.ppo.environment.command, s.ppo.environment.timeout_s);
  std::vector<at::Tensor> params = model.parameters();
  const RowCodec codec{s.cfg.data.max_length, s.ppo.max_new_tokens};
  const int64_t per = P / R * s.ppo.samples_per_prompt;
  log::info("ppo.async.rollout_ranks: rank ", world->rank(), " samples ", P / R, " prompts of each rollout for the ", T,
            " training ranks");
  auto idle_since = std::chrono::steady_clock::now();
  int64_t version = -1;
  bool perturb = test_hooks::rollout_perturb();
  for (;;) {
    auto command = at::empty({kCommand + 3 * P}, at::TensorOptions(at::kLong).device(ctx.device));
    world->broadcast(command, 0, "the rollout ranks' command");
    command = command.cpu().contiguous();
    const auto* c = command.data_ptr<int64_t>();
    const double waited = seconds_since(idle_since);
    if (c[0] == kStop) return;
    const int64_t iteration = c[1];
    if (c[4] != static_cast<int64_t>(params.size()))
      throw ConfigError(concat("ppo.async.rollout_ranks: the trainers' model has ", c[4], " parameters, rank ",
                               world->rank(), "'s ", params.size(),
                               "; every rank builds the same model from the same config"));
    if (c[3] != 0) {
      receive_weights(ctx, params, perturb);
      perturb = false;
      version = c[2];
    }
    std::vector<RolloutPrompt> all;
    for (int64_t g = 0; g < P; ++g) {
      const auto dataset = c[kCommand + 3 * g], index = c[kCommand + 3 * g + 1];
      if (dataset < 0 || dataset >= static_cast<int64_t>(s.data.train.size()) || index < 0 ||
          index >= static_cast<int64_t>(s.data.train[static_cast<size_t>(dataset)]->size()))
        throw ConfigError(concat("ppo.async.rollout_ranks: the trainers ask rank ", world->rank(), " for sample ",
                                 index, " of data.train[", dataset,
                                 "], which its data does not have; every rank "
                                 "reads the same data.train"));
      all.push_back({&(*s.data.train[static_cast<size_t>(dataset)])[index],
                     c[kCommand + 3 * g + 2],
                     {static_cast<int32_t>(dataset), index}});
    }
    Metrics m;
    const auto rows =
        s.sample_share(model, s.share(all, me, R), iteration_seed(s.cfg.train.seed, iteration), values, m);
    auto buf = at::zeros({kHeader + per * codec.width()}, at::kDouble);
    double* h = buf.data_ptr<double>();
    h[0] = m["time/rollout_s"];
    for (const auto& r : rows) h[1] += static_cast<double>(r.response.size());
    h[2] = waited;
    if (s.ppo.async.check_weights) {
      uint64_t hash = 0;
      for (size_t k = 0; k < params.size(); ++k) hash += weight_term(static_cast<int64_t>(k), params[k]);
      h[3] = static_cast<double>(hash >> 32);
      h[4] = static_cast<double>(hash & 0xffffffffull);
    }
    h[5] = static_cast<double>(version);
    for (size_t i = 0; i < rows.size(); ++i) codec.put(rows[i], h + kHeader + static_cast<int64_t>(i) * codec.width());
    if (const auto fault = test_hooks::rollout_fault(); fault.iteration == iteration) {
      log::warn("test hook: rollout rank ", world->rank(), fault.kill ? " is killed" : " hangs",
                " instead of sending the batch of iteration ", iteration);
      if (fault.kill) std::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    idle_since = std::chrono::steady_clock::now();
    buf = buf.to(ctx.device);
    for (int64_t r = 0; r < R; ++r) {
      const int root = static_cast<int>(T + r);
      if (root == world->rank()) {
        world->broadcast(buf, root, concat("the rows of rollout rank ", root));
      } else {  // another rollout rank's rows, which this one does not need
        auto other = at::empty_like(buf);
        world->broadcast(other, root, concat("the rows of rollout rank ", root));
      }
    }
  }
}

}  // namespace anvil::train
