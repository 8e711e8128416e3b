#pragma once
// An Objective is a training algorithm: it turns a batch into a loss and
// knows how to evaluate, and may hook the iteration (a rollout before it,
// a target update after each step) and keep state in checkpoints. The loop
// (trainer.h) is shared by all of them; the Engine (engine.h) owns
// accumulation, clipping, stepping, gathered weights and checkpoints.
// Objectives are registered by name (register_objective), the built-in ones
// and a linking program's alike: docs/library.md.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil {

/// Named scalars: a step's or an evaluation's metrics, as metrics.jsonl and
/// the log print them.
using Metrics = std::map<std::string, double>;

namespace distributed {
class Communicator;
struct ShardingOptions;
}  // namespace distributed

}  // namespace anvil

namespace anvil::train {

/// A micro-batch: named CPU tensors plus the count of units the loss sums
/// over (target tokens for SFT), which the loop uses to normalise.
struct Batch {
  std::map<std::string, at::Tensor> tensors;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;  // input tokens, for throughput
};

/// A deterministic, resumable stream of training micro-batches.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& state) = 0;
  /// Samples in one pass over the training data (for plans and summaries);
  /// 0 when the source does not know.
  virtual int64_t samples_per_epoch() const { return 0; }
  /// Rows (what train.micro_batch_size counts) that one pass over the
  /// training data fills: samples_per_epoch(), unless a row holds several
  /// samples (data.packing). train.num_train_epochs counts steps from it.
  virtual int64_t rows_per_epoch() const { return samples_per_epoch(); }
};

/// One evaluation's scalars (named "eval/...") and sample rows
/// (prompt, generated, and what the generated text is held against) to print.
struct EvalResult {
  Metrics metrics;
  std::vector<std::array<std::string, 3>> samples;
  /// What the samples' third column holds: "reference" (the record's
  /// response) or, for RL objectives, "reward" (the score the generated text
  /// got). It heads the column in the log, TensorBoard and eval-step-N.json.
  std::string third_column = "reference";
};

/// Additive statistics of micro-batches (detached scalar tensors, e.g. the
/// count of correctly ranked pairs): the loop sums them over a step's
/// micro-batches and hands the totals to Objective::step_metrics.
using Sums = std::map<std::string, at::Tensor>;

/// Adds `value` (detached) into `sums[key]`.
void add_sum(Sums& sums, const std::string& key, const at::Tensor& value);

/// This process's share of a multi-process run, for work the ranks split:
/// evaluation batches and prompts are dealt out round-robin and their
/// statistics summed over ranks.
struct RankContext {
  int64_t rank = 0;
  int64_t world = 1;
  /// Sums `values` over ranks, in place (a collective: every rank calls it
  /// with as many values). Unset on one process.
  std::function<void(std::vector<double>& values)> sum;
  /// `all` <- every rank's `mine` (each rank passes as many values), in rank
  /// order (a collective). Unset on one process.
  std::function<void(const std::vector<double>& mine, std::vector<double>& all)> gather;

  /// Whether items are split: several ranks and at least one item each.
  bool splits(int64_t items) const { return world > 1 && items >= world; }
  bool mine(int64_t item) const { return item % world == rank; }
  /// Whether this rank runs item `item` of a split of `items` forwards: its
  /// own, and the uneven tail (the last items % world), which every rank
  /// runs and only its owner (mine) counts. Under full_shard an evaluation's
  /// forwards are collectives (Engine::evaluating), so every rank must run as
  /// many.
  bool runs(int64_t item, int64_t items) const { return mine(item) || item >= items / world * world; }
  void all_sum(std::vector<double>& values) const {
    if (sum) sum(values);
  }
  void all_gather(const std::vector<double>& mine, std::vector<double>& all) const {
    if (gather)
      gather(mine, all);
    else
      all = mine;
  }
};

/// Sums `head` and every value of `sums` over ranks in one collective (every
/// rank must hold the same keys); returns the summed head. The identity on
/// one process.
std::vector<double> sum_over_ranks(const RankContext& ranks, std::vector<double> head, Sums& sums);

class Engine;

/// A model that never trains, held as the run holds the policy (declared in
/// models/, where reward sources below train/ can hold one too).
using models::FrozenModel;

/// A second model a run trains beside the policy (PPO's separate critic).
/// The loss the objective returns may involve it: one backward fills both
/// models' gradients. It gets its own AdamW (the run's optimizer settings at
/// peak learning rate `lr`, following the policy's schedule), its gradients
/// are clipped on their own with train.grad_clip (logged as
/// "<name>/grad_norm"), a non-finite norm skips the step for both, and in a
/// sharded run it is sharded like the policy. Every checkpoint holds it in
/// checkpoint-<step>/<name>/ (an HF folder with its optimizer state, the
/// same whatever the ranks), and a resumed run restores it.
struct CompanionModel {
  std::string name;
  std::shared_ptr<models::CausalLM> model;
  double lr = 0;
};

/// What an objective may need from the run before training starts.
struct RunContext {
  std::filesystem::path output_dir;
  at::Device device = at::kCPU;
  /// Set in a sharded run (several ranks, or a sharding or precision setting).
  std::shared_ptr<distributed::Communicator> comm;
  /// The run's sharding, which frozen models follow (with `frozen` set);
  /// null: ShardingOptions' defaults.
  std::shared_ptr<const distributed::ShardingOptions> sharding;
  /// Whether the run shards every parameter (dist.sharding: full_shard).
  bool full_shard() const;
  /// The ranks that split the data among themselves (what a forward split
  /// among ranks, a reference's log-prob cache, divides over): `comm`, or
  /// under dist.tensor_parallel its data-parallel group, since the ranks of a
  /// tensor-parallel group run the same rows together. Null on one process.
  std::shared_ptr<distributed::Communicator> data_comm() const;
  /// Under dist.context_parallel: the ranks that split each row's positions
  /// among themselves (models::ForwardArgs::context), which read the same
  /// rows. Null otherwise.
  std::shared_ptr<distributed::Communicator> context_comm;
  /// Every rank of the launch, when the algorithm keeps some apart from
  /// training (register_side_ranks): ranks [0, trainers) train over `comm`,
  /// the others run Objective::serve(). Null otherwise.
  std::shared_ptr<distributed::Communicator> world;
  int64_t trainers = 0;

  /// Holds `model` (on any device; it is moved to `device`) frozen, sharded
  /// like the policy in a sharded run: under dist.tensor_parallel its blocks
  /// are cut across the tensor-parallel group as the policy's are. Every rank
  /// must call it, in the same order, with the same architecture (rank 0's
  /// values are kept).
  FrozenModel freeze(std::shared_ptr<models::CausalLM> model) const;
  /// freeze() as a function, for what is built below train/ (a reward source).
  models::FreezeFn freeze_fn() const {
    return [this](std::shared_ptr<models::CausalLM> m) { return freeze(std::move(m)); };
  }

  /// Trains `model` beside the policy (CompanionModel), from Objective::prepare;
  /// returns it, moved to `device`. `name` (a-z, 0-9, _) names its checkpoint
  /// folder and metrics. Every rank must call it, in the same order. Refused
  /// (ConfigError) under dist.tensor_parallel so far.
  std::shared_ptr<models::CausalLM> train(const std::string& name, std::shared_ptr<models::CausalLM> model,
                                          double lr) const;
  /// The models train() registered, for make_engine.
  std::shared_ptr<std::vector<CompanionModel>> companions = std::make_shared<std::vector<CompanionModel>>();
};

/// What a rank apart from training (register_side_ranks) gets in
/// Objective::serve().
struct SideContext {
  at::Device device = at::kCPU;
  std::shared_ptr<distributed::Communicator> world;  // every rank of the launch
  int64_t trainers = 0;                              // ranks [0, trainers) train; this one is of [trainers, world size)
};

class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;

  /// Called once the model is built, before the optimizer and before a
  /// checkpoint is restored: add heads, freeze a reference copy, fill caches.
  /// Throws ConfigError when the model does not suit the objective.
  virtual void prepare(models::CausalLM& model, const RunContext& ctx) {
    (void)model;
    (void)ctx;
  }
  /// Whether prepare() reads the values of the model's parameters (not only
  /// their shapes). Under full_shard on several ranks the model arrives
  /// without them (each rank reads or draws its shards once the engine is
  /// built, models/init.h); the loop then builds it whole on every rank
  /// before prepare(), as a single process has it. The built-in objectives
  /// read none and say false; say false in yours to keep a large model
  /// sharded from its start (clone_model and add_head need no values).
  virtual bool prepare_reads_weights() const { return true; }

  /// The loss summed over the batch's `num_targets` units (not averaged);
  /// statistics for the step's metrics go into `sums`.
  virtual at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) = 0;
  /// Train-time metrics (no prefix) from a step's summed statistics.
  virtual Metrics step_metrics(const Sums& sums) const {
    (void)sums;
    return {};
  }
  /// Metrics worth a column on the console's progress line, by their
  /// metrics.jsonl names, in order: what a user watches between evaluations
  /// (PPO's reward and KL, DPO's accuracy and margin). A column shows the
  /// latest value logged (a rollout's metrics come once per iteration) and
  /// appears once the metric has been logged. None by default.
  virtual std::vector<std::string> console_metrics() const { return {}; }
  /// Evaluates on held-out data; an empty result when there is none. In a
  /// multi-process run every rank calls it and gets the same result.
  virtual EvalResult evaluate(models::CausalLM& model) = 0;
  virtual BatchSource& train_source() = 0;

  /// What `Batch::num_targets` counts, for plans and logs ("trained tokens",
  /// "preference examples").
  virtual std::string target_unit() const { return "trained tokens"; }
  /// --dry-run: what `max_steps` optimizer steps read, for objectives whose
  /// steps do not read the training data directly (PPO trains on rollouts).
  /// Empty: steps read train_source()'s samples, and the plan counts epochs
  /// and tokens from them.
  virtual std::string plan(int64_t max_steps) const {
    (void)max_steps;
    return "";
  }
  /// --dry-run: what row `row` of a training batch is beyond its tokens, shown
  /// with the plan's first sample (KTO: "desirable" or "undesirable"); empty
  /// when the tokens say it all.
  virtual std::string sample_label(const Batch& batch, int64_t row) const {
    (void)batch;
    (void)row;
    return "";
  }
  /// --dry-run: starts every program a run would start (PPO's reward and
  /// environment programs, ILQL's reward program) as the run starts it, sends
  /// it the line it would get for the first prompt with an empty reply,
  /// checks the answer and stops it. Returns a line per program for the plan.
  /// Throws Error naming the key, the command and what went wrong (not
  /// found, not executable, exited with its status and the end of its
  /// stderr, no answer within its timeout, an answer of the wrong form).
  virtual std::vector<std::string> check_programs() { return {}; }

  // ---- iteration hooks (Objective v2). The loop runs iterations: before
  // each, before_iteration(); then steps_per_iteration() optimizer steps,
  // each over train_source()'s micro-batches and followed by after_step().
  // train.max_steps counts optimizer steps; eval and save happen at the end
  // of an iteration whose steps reached their cadence.

  /// Optimizer steps in one iteration (PPO: epochs x minibatches of a rollout).
  virtual int64_t steps_per_iteration() const { return 1; }
  /// Before iteration `iteration` (0-based), with `step` steps done: PPO
  /// generates and scores its rollout here (engine.gathered() keeps sharded
  /// weights whole meanwhile). The metrics returned join the iteration's
  /// first step's line.
  virtual Metrics before_iteration(Engine& engine, int64_t iteration, int64_t step) {
    (void)engine;
    (void)iteration;
    (void)step;
    return {};
  }
  /// After each applied optimizer step (`step` = steps done): ILQL's target
  /// update, PPO's KL controller. A skipped (non-finite) step calls nothing.
  virtual void after_step(Engine& engine, int64_t step) {
    (void)engine;
    (void)step;
  }
  /// When the loop may read a step's loss, gradient norm and sums
  /// (train.overlap_step_reads): once it has queued the next step, so that
  /// the host never waits for the device between steps. after_step() and
  /// step_metrics() of a step then run after the next step is queued.
  enum class StepReads {
    at_once,           ///< before the next step is queued (the default)
    within_iteration,  ///< late, but an iteration's last step before the next before_iteration()
    late,              ///< late, across iterations too
  };
  /// What the loop may do with this objective's steps, in one declaration.
  struct StepNeeds {
    /// Keep at_once (the default) when after_step() changes the model or what
    /// the next step reads; within_iteration when only the next iteration's
    /// before_iteration() needs after_step() done (PPO's KL controller).
    StepReads reads = StepReads::at_once;
    /// Whether loss_sum() reads the host only through the batch's tensors
    /// (never Batch::num_targets, a host read such as item(), or shapes that
    /// depend on values): a CUDA graph may then record a step once and replay
    /// it with later batches of the same shapes (train.cuda_graphs).
    bool replayable = false;
  };
  virtual StepNeeds step_needs() const { return {}; }
  /// Whether split_rows() cuts a micro-batch into parts whose loss_sum()s add
  /// up to the whole's (each row's loss stands alone, normalised by the
  /// step's targets): train.micro_batch_size: auto needs it.
  virtual bool splits_rows() const { return false; }
  /// `batch` cut into `parts` micro-batches of consecutive rows
  /// (ceil(rows / parts) each, the last fewer; fewer parts when there are
  /// fewer rows), each with its own num_targets and num_tokens. Only when
  /// splits_rows().
  virtual std::vector<Batch> split_rows(const Batch& batch, int64_t parts) const;
  /// The objective's own state, saved in every checkpoint (trainer_state.json
  /// "objective") and given to restore() on resume; null when it keeps none.
  virtual nlohmann::json state() const { return nullptr; }
  virtual void restore(const nlohmann::json& state) { (void)state; }
  /// Whether the optimizer trains the model parameter `name` (HF name). A
  /// frozen parameter gets no gradient, no update and no weight decay.
  virtual bool trains(const std::string& name) const {
    (void)name;
    return true;
  }

  /// On a rank apart from training (register_side_ranks): its whole part in
  /// the run, with `model` built whole in dist.param_dtype (no optimizer, no
  /// checkpoint of its own); returns when the training ranks end the run.
  /// They reach it through RunContext::world. Throws by default.
  virtual void serve(models::CausalLM& model, const SideContext& ctx);
  /// After the loop's last iteration on the training ranks (not after an
  /// error): where the side ranks are told the run is over.
  virtual void finish(Engine& engine) { (void)engine; }

  /// Set by the loop before prepare(); evaluate() splits its work by it.
  void set_ranks(RankContext ranks) { ranks_ = std::move(ranks); }

 protected:
  RankContext ranks_;
};

/// Builds an objective for a run: its config, its tokenizer, and its chat
/// format, resolved once at setup (data.template against what the model
/// records; plain for an algorithm that does not read data.template). The
/// objective renders its data and stops its generations with that object.
using ObjectiveFactory = std::function<std::unique_ptr<Objective>(
    const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat)>;

/// Registers an algorithm: `algorithm: <name>` in a config builds it with
/// `factory`. The built-in ones (sft, pretrain, reward, dpo) are registered
/// the same way. A program that links libanvil registers its own before it
/// loads a config (config::load_config accepts the name from then on).
/// Throws ConfigError when the name is taken or not of a-z, 0-9 and _.
void register_objective(const std::string& name, ObjectiveFactory factory);
/// The same, saying which of the keys that only some algorithms read
/// (train.loss_chunk_size, eval.generate_samples, ...) this objective reads:
/// config::keys_read_by names them (an objective built on the sft one may
/// pass keys_read_by("sft") less what it ignores). Any other such key set in
/// its config is then an error; without the list, none is.
void register_objective(const std::string& name, ObjectiveFactory factory, const std::vector<std::string>& reads);

/// The same for an objective built as `T(cfg, tok, chat)`: how the built-in
/// objectives register (src/train/objectives/sft.cpp, ppo.cpp, ...).
template <class T>
void register_objective(const std::string& name, const std::vector<std::string>& reads) {
  register_objective(
      name,
      [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
         const chat::ChatTemplate& chat) -> std::unique_ptr<Objective> { return std::make_unique<T>(cfg, tok, chat); },
      reads);
}

/// Ranks of a launch that algorithm `name` keeps apart from training, from
/// its config (ppo: ppo.async.rollout_ranks): the last `count(cfg)` ranks
/// build the model whole and run Objective::serve() instead of the loop; the
/// others train, sharded over a communicator of their own. Unregistered: 0.
/// `key` names the config key that sets them, for messages.
void register_side_ranks(const std::string& name, const std::string& key,
                         std::function<int64_t(const config::RunConfig&)> count);
/// The side ranks `cfg.algorithm` asks for (none for most algorithms).
struct SideRanks {
  int64_t count = 0;
  std::string key;
};
SideRanks side_ranks(const config::RunConfig& cfg);

/// Builds the objective named by `cfg.algorithm`, with the run's chat format.
std::unique_ptr<Objective> make_objective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                          const chat::ChatTemplate& chat);

}  // namespace anvil::train
