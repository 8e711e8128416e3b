// The two engines: one plain process (HF-layout checkpoints), and sharded
// ranks over distributed::ShardedModel. Everything the loop does to the model,
// the optimizer and the checkpoint goes through here.
#include "train/step_engine.h"
#include "train/engine_setup.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <unordered_set>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "core/test_hooks.h"
#include "core/tensor_bytes.h"
#include "models/activation_checkpointing.h"
#include "distributed/checkpoint.h"
#include "distributed/sharding.h"
#include "checkpoint/checkpoint.h"
#include "anvil/checkpoint/hf_model.h"
#include "models/lora.h"
#include "optim/optimizer.h"
#include "anvil/train/trainer.h"
#include "checkpoint/saved_parameters.h"
#include "train/checkpoint_writer.h"
#include "train/trained_parameters.h"
#include "io/trainer_state.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;

int64_t optimizer_bytes(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> ts;
  for (auto& [key, st] : opt.state())
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(st.get())) {
      ts.push_back(a->exp_avg());
      ts.push_back(a->exp_avg_sq());
      if (a->max_exp_avg_sq().defined()) ts.push_back(a->max_exp_avg_sq());
    }
  std::unordered_set<const void*> seen;
  return storage_bytes(ts, seen);
}

/// The fused AdamW behind `opt`, or null (torch's unfused AdamW).
optim::FusedAdamW* fused_adamw(torch::optim::Optimizer& opt) { return dynamic_cast<optim::FusedAdamW*>(&opt); }

/// Where a model's state comes from on resume: a run's checkpoint (`resumed`
/// receives its trainer state) or a companion's folder in it (`resumed` null).
struct ResumeFrom {
  std::optional<stdfs::path> dir;
  std::optional<io::TrainerState>* resumed = nullptr;
};

/// What both engines do to one model. A run's engine applies each step to
/// the policy and to its companion models, which are engines of the same kind.
class EngineImpl : public StepEngine {
 public:
  StepStats backward(Objective& objective, const std::vector<Batch>& batches, int64_t step_targets,
                     bool read_loss) final {
    AccumulateOptions ao;
    ao.step_targets = step_targets;
    ao.world = world_size();
    ao.read_loss = read_loss;
    ao.before_backward = [&](bool last) { for_each([&](EngineImpl& e) { e.before_backward(last); }); };
    ao.after_backward = [&] { for_each([](EngineImpl& e) { e.after_backward(); }); };
    try {
      for_each([](EngineImpl& e) { e.begin_step(); });  // may gather (and so agree) too
      auto stats = accumulate_gradients(objective, model(), batches, ao);
      agree_none_out_of_memory();  // the last agreement, before the step's other collectives
      return stats;
    } catch (const distributed::PeerOutOfMemory&) {
      throw;  // another rank's, learned at an agreement
    } catch (const c10::OutOfMemoryError&) {
      announce_out_of_memory();  // this rank's: the others learn it at their next agreement
      throw;
    }
  }
  bool steps_on_device() const final { return companions_.empty() && fused_adamw(optimizer_ref()) != nullptr; }
  at::Tensor clip_grad_norm_on_device(double max_norm) final {
    // The policy's norm; not finite when a companion's is not (every model's step is then skipped).
    auto norm = clip_own(max_norm);
    for (auto& c : companions_) {
      c.norm = c.engine->clip_own(max_norm);
      norm = at::where(at::isfinite(c.norm.to(norm.device())), norm, at::full({}, NAN, norm.options()));
    }
    return norm;
  }
  int64_t finish_step_on_device(const at::Tensor& skip, bool read_late) final {
    if (read_late && steps_on_device()) return finish_own_on_device(skip.to(device(), at::kFloat));
    // Read at once (or companions, an unfused optimizer): the decision is read here, and the step applied or
    // skipped at once.
    finish_step(skip.item<float>() == 0);
    return -1;
  }
  void skipped_on_device(int64_t ticket) final {
    if (ticket >= 0) fused_adamw(optimizer_ref())->take_back(ticket);
  }
  int64_t count_graph_step() final { return fused_adamw(optimizer_ref())->count_step(graph_step_); }
  void abandon_graph_step() final {
    fused_adamw(optimizer_ref())->forget_queued();
    graph_step_ = {};
  }
  std::string graph_refusal() const final {
    if (!companions_.empty()) return "companion models train beside the policy";
    if (!fused_adamw(optimizer_ref())) return "optimizer.fused is false";
    if (fused_adamw(optimizer_ref())->state_dtype() != at::kFloat)
      return "optimizer.state_dtype is bfloat16 (its stochastic rounding draws from the host-seeded generator)";
    return graph_refusal_own();
  }
  Metrics step_metrics() const final {
    Metrics m;
    for (const auto& c : companions_)
      if (c.norm.defined()) m[c.name + "/grad_norm"] = c.norm.item<double>();
    return m;
  }
  /// Applies the optimizer step (`apply`) of every model, or discards the gradients of a skipped one.
  void finish_step(bool apply) {
    for_each([&](EngineImpl& e) { e.finish_own(apply); });
  }
  void set_lr(double lr) final {
    optim::set_lr(optimizer(), lr);
    for (auto& c : companions_) optim::set_lr(c.engine->optimizer(), lr * c.lr_scale);
  }
  Metrics memory() final {
    auto m = memory_own();
    for (auto& c : companions_)
      for (const auto& [k, v] : c.engine->memory_own()) m[k] += v;
    return m;
  }
  void add_companion(const std::string& name, std::unique_ptr<EngineImpl> engine, double lr_scale) {
    companions_.push_back({name, std::move(engine), lr_scale, at::Tensor()});
  }
  stdfs::path save(const stdfs::path& output_dir, const io::TrainerState& state, const tokenizer::Tokenizer* tok,
                   const std::string& config_yaml, int64_t keep_last) final {
    const auto t0 = std::chrono::steady_clock::now();
    auto dir = save_own(output_dir, state, tok, config_yaml, keep_last);
    add_stall(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return dir;
  }
  Metrics collect_save(bool wait) final {
    auto m = collect_own(wait);
    if (stall_s_) m["time/checkpoint_stall_s"] = *std::exchange(stall_s_, std::nullopt);
    return m;
  }

 protected:
  /// save(), whose time is the loop's stall.
  virtual stdfs::path save_own(const stdfs::path& output_dir, const io::TrainerState& state,
                               const tokenizer::Tokenizer* tok, const std::string& config_yaml, int64_t keep_last) = 0;
  /// collect_save() but for the stall.
  virtual Metrics collect_own(bool wait) {
    (void)wait;
    return {};
  }
  /// Counts time the loop spent blocked by a save.
  void add_stall(double seconds) { stall_s_ = stall_s_.value_or(0.0) + seconds; }
  virtual void begin_step() = 0;
  virtual void before_backward(bool last) { (void)last; }
  virtual void after_backward() {}
  /// train.micro_batch_size: auto on several ranks (distributed::ShardingOptions::agree_on_out_of_memory).
  virtual void agree_none_out_of_memory() {}
  virtual void announce_out_of_memory() {}
  /// The norm as a 0-dim float64 tensor on the device, unread.
  virtual at::Tensor clip_own(double max_norm) = 0;
  virtual void finish_own(bool apply) = 0;
  /// finish_own with the fused optimizer told to skip where `skip` is 1; returns its step's number.
  virtual int64_t finish_own_on_device(const at::Tensor& skip) = 0;
  /// optimizer() of a const engine.
  virtual torch::optim::Optimizer& optimizer_ref() const = 0;
  /// graph_refusal() once the device, companions and optimizer allow graphs.
  virtual std::string graph_refusal_own() const = 0;
  /// A recorded step's skip flag: 1 where the loss or the norm is not finite (0-dim float32).
  static at::Tensor not_finite(const at::Tensor& loss, const at::Tensor& norm) {
    return at::logical_not(at::isfinite(loss).logical_and(at::isfinite(norm))).to(at::kFloat);
  }
  /// The recorded step's fused AdamW step (queue_graph_step), kept for count_graph_step().
  void queue_optimizer_step(const at::Tensor& lr, const at::Tensor& skip) {
    graph_step_ = fused_adamw(optimizer_ref())->queue_step(lr, skip);
    // A counter made from the host's count would be remade at every replay: such a step is not replayable.
    TORCH_CHECK(!graph_step_.counters_rebuilt, "an optimizer step counter was made inside the step");
  }
  virtual Metrics memory_own() = 0;
  /// Writes the model whole with its optimizer state into `dir` (a companion's
  /// part of a checkpoint); a collective in a sharded run.
  virtual void write_companion(const stdfs::path& dir) = 0;
  virtual void gather_own() = 0;
  virtual void release_own() = 0;

  /// Engine::evaluating()'s, for this engine alone: gathered whole unless overridden.
  virtual void begin_evaluation_own() { gather_own(); }
  virtual void end_evaluation_own() { release_own(); }

  void gather() final {
    for_each([](EngineImpl& e) { e.gather_own(); });
  }
  void release() final {
    for_each([](EngineImpl& e) { e.release_own(); });
  }
  void begin_evaluation() final {
    for_each([](EngineImpl& e) { e.begin_evaluation_own(); });
  }
  void end_evaluation() final {
    for_each([](EngineImpl& e) { e.end_evaluation_own(); });
  }
  void write_companions(const stdfs::path& dir) {
    for (auto& c : companions_) c.engine->write_companion(dir / c.name);
  }
  /// The companions by name; engines of this one's kind (make_engine builds them alike).
  std::vector<std::pair<std::string, EngineImpl*>> companion_engines() const {
    std::vector<std::pair<std::string, EngineImpl*>> out;
    for (const auto& c : companions_) out.emplace_back(c.name, c.engine.get());
    return out;
  }

 private:
  template <class F>
  void for_each(F&& f) {
    f(*this);
    for (auto& c : companions_) f(*c.engine);
  }
  struct Companion {
    std::string name;
    std::unique_ptr<EngineImpl> engine;
    double lr_scale;
    at::Tensor norm;  // its gradient norm at the last clipping, on the device
  };
  std::vector<Companion> companions_;
  optim::FusedAdamW::Queued graph_step_;  // the recorded step's optimizer work
  std::optional<double> stall_s_;         // since the last collect_save, when a save happened
};

class PlainEngine final : public EngineImpl {
 public:
  PlainEngine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model, const Trains& trains,
              const std::string& who, const ResumeFrom& resume)
      : model_(std::move(model)),
        device_(model_->parameters().front().device()),
        activation_checkpointing_(cfg.train.activation_checkpointing),
        saves_(cfg.train.background_saves) {
    if (cfg.train.activation_checkpointing)
      model_->set_block_runner(
          [](size_t, const at::Tensor& x, const models::BlockFn& block) { return models::checkpoint_block(block, x); });
    auto trained = trained_parameters(*model_, trains, who, cfg.optimizer);
    optimizer_ = optim::make_optimizer(cfg.optimizer, trained.decayed, trained.not_decayed);
    params_ = std::move(trained.all);
    if (!resume.dir) return;
    if (resume.resumed)
      *resume.resumed = checkpoint::load_checkpoint(*resume.dir, *model_, *optimizer_);
    else
      checkpoint::load_model_and_optimizer(*resume.dir, *model_, *optimizer_);
  }

  models::CausalLM& model() override { return *model_; }
  at::Device device() const override { return device_; }
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  std::string describe() const override { return ""; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  std::vector<at::Tensor> gradients() override {
    std::vector<at::Tensor> g;
    for (const auto& p : params_) g.push_back(p.grad());
    return g;
  }
  void set_parameters(const std::map<std::string, at::Tensor>& values) override {
    wait_for_save_copy();
    auto params = model_->named_parameters();
    at::NoGradGuard no_grad;
    for (const auto& [name, v] : values) {
      auto* p = params.find(name);
      TORCH_CHECK(p != nullptr, "set_parameters: the model has no parameter \"", name, "\"");
      TORCH_CHECK(v.sizes() == p->sizes(), "set_parameters: \"", name, "\" has shape ", p->sizes(), ", got ",
                  v.sizes());
      p->copy_(v);
    }
  }
  std::vector<std::vector<std::string>> parameter_units() override {
    std::vector<std::string> names;
    for (const auto& p : model_->named_parameters()) names.push_back(p.key());
    return {names};
  }
  std::vector<at::Tensor> unit_parameters(size_t u) override {
    TORCH_CHECK(u == 0, "unit_parameters: a plain engine has one unit, got ", u);
    std::vector<at::Tensor> out;
    for (const auto& p : model_->parameters()) out.push_back(p.detach());
    return out;
  }
  std::map<std::string, at::Tensor> get_parameters(const std::vector<std::string>& names) override {
    auto params = model_->named_parameters();
    std::map<std::string, at::Tensor> out;
    for (const auto& name : names) {
      auto* p = params.find(name);
      TORCH_CHECK(p != nullptr, "get_parameters: the model has no parameter \"", name, "\"");
      out.emplace(name, p->detach().to(at::kFloat).clone());
    }
    return out;
  }

 protected:
  stdfs::path save_own(const stdfs::path& output_dir, const io::TrainerState& state, const tokenizer::Tokenizer* tok,
                       const std::string& config_yaml, int64_t keep_last) override {
    checkpoint::CheckpointParts parts;
    parts.model = checkpoint::model_state(*model_, *optimizer_);
    parts.tokenizer = tok;
    parts.rng = checkpoint::rng_state(device_);
    parts.state = state;
    parts.run_config_yaml = config_yaml;
    for (const auto& [name, e] : companion_engines()) {
      auto& c = static_cast<PlainEngine&>(*e);
      parts.companions.emplace_back(name, checkpoint::model_state(*c.model_, *c.optimizer_));
    }
    return saves_.save(output_dir, std::move(parts), keep_last);
  }
  Metrics collect_own(bool wait) override { return saves_.collect(wait); }
  void begin_step() override {
    if (!zero_in_place_) return optimizer_->zero_grad();
    std::vector<at::Tensor> grads;
    for (const auto& p : params_)
      if (p.grad().defined()) grads.push_back(p.grad());
    if (!grads.empty()) at::_foreach_zero_(grads);
  }
  at::Tensor clip_own(double max_norm) override { return optim::clip_or_measure(params_, max_norm); }
  std::string graph_refusal_own() const override {
    return activation_checkpointing_ ? "train.activation_checkpointing is on" : "";
  }
  void prepare_graph_step() override {
    wait_for_save_copy();
    zero_in_place_ = true;
  }
  GraphStep queue_graph_step(Objective& objective, const std::vector<Batch>& batches, const at::Tensor& scale,
                             const at::Tensor& lr, double max_norm) override {
    TORCH_CHECK(zero_in_place_, "queue_graph_step: prepare_graph_step() first");
    begin_step();
    AccumulateOptions ao;
    ao.scale = scale;
    ao.read_loss = false;
    GraphStep g;
    g.loss = accumulate_gradients(objective, *model_, batches, ao).loss_tensor;
    g.norm = clip_own(max_norm);
    g.skip = not_finite(g.loss, g.norm);
    queue_optimizer_step(lr, g.skip);
    return g;
  }
  void finish_own(bool apply) override {
    wait_for_save_copy();  // before the step changes what a background save copies (companions' too)
    if (apply) optimizer_->step();
  }
  int64_t finish_own_on_device(const at::Tensor& skip) override {
    wait_for_save_copy();
    const int64_t call = fused_adamw(*optimizer_)->skip_next_if(skip);
    optimizer_->step();
    return call;
  }
  torch::optim::Optimizer& optimizer_ref() const override { return *optimizer_; }
  Metrics memory_own() override {
    std::unordered_set<const void*> seen;
    const auto all = model_->parameters();
    return {{"memory/parameter_bytes", static_cast<double>(storage_bytes(all, seen))},
            {"memory/gradient_bytes", static_cast<double>(storage_bytes(gradients(), seen))},
            {"memory/optimizer_bytes", static_cast<double>(optimizer_bytes(*optimizer_))}};
  }
  void write_companion(const stdfs::path& dir) override {
    checkpoint::save_model_and_optimizer(dir, *model_, *optimizer_);
  }
  void gather_own() override {}
  void release_own() override {}

 private:
  std::shared_ptr<models::CausalLM> model_;
  at::Device device_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool activation_checkpointing_ = false;
  bool zero_in_place_ = false;  // since the first graph step: the gradients are the graph's
  void wait_for_save_copy() {
    if (const double s = saves_.wait_copied(); s > 0) add_stall(s);
  }

  BackgroundSaves saves_;  // last: its thread reads the model until joined
};

class ShardedEngine final : public EngineImpl {
 public:
  ShardedEngine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model,
                std::shared_ptr<distributed::Communicator> comm, const Trains& trains, const std::string& who,
                const ResumeFrom& resume, std::shared_ptr<distributed::Mesh> mesh = nullptr)
      : model_(model),
        comm_(comm),
        data_(comm),
        device_(model->parameters().front().device()),
        sharding_(config::kShardings.name(cfg.dist.sharding)),
        param_dtype_(config::kDtypes.name(cfg.dist.param_dtype)),
        consolidated_(cfg.dist.consolidated_checkpoints),
        timeout_s_(cfg.dist.timeout_s),
        saves_(cfg.train.background_saves) {
    // A plain checkpoint (a single-process run going multi-process, or a
    // companion's folder) is read into the whole model and a per-parameter
    // optimizer first; sharding then flattens both.
    std::unique_ptr<torch::optim::Optimizer> plain;
    if (resume.dir && (!resume.resumed || !distributed::is_sharded_checkpoint(*resume.dir))) {
      plain = optim::make_optimizer(cfg.optimizer, model->parameters());
      if (resume.resumed)
        *resume.resumed = checkpoint::load_checkpoint(*resume.dir, *model, *plain);
      else
        checkpoint::load_model_and_optimizer(*resume.dir, *model, *plain);
    }
    // What the run does not train (LoRA's base, ILQL's target heads) goes into frozen units: their param_dtype
    // shards alone, no master, gradient or optimizer state.
    bool any = false;
    for (const auto& p : model->named_parameters()) any = any || trains(p.key());
    if (!any) throw ConfigError(concat(who, " trains none of the model's parameters"));
    auto options = sharding_options(cfg);
    options.trains = trains;
    // Tensor parallelism: the blocks' layers cut across the mesh's tensor-parallel group (after a plain
    // checkpoint was read into the whole model), sharded over its data-parallel group.
    // Context parallelism: the ranks of a group hold the same parameters and each its share of the rows'
    // gradient, so FSDP shards over them too (the mesh's shard group) and data splits over its dp group.
    if (mesh && mesh->tp->world_size() > 1) {
      options.tensor_parallel = mesh->tp;
      options.data_parallel = mesh->shard;
      options.tensor_parallel_cuts = distributed::apply_tensor_parallel(
          *model, mesh->tp, "dist.tensor_parallel", cfg.dist.sequence_parallel, cfg.dist.vocab_parallel);
      tensor_parallel_ = mesh->tp->world_size();
    }
    if (mesh) data_ = mesh->dp, context_parallel_ = mesh->cp->world_size();
    ring_ = cfg.dist.context_parallel_mode == config::ContextParallelMode::kRing;
    sharded_ = std::make_unique<distributed::ShardedModel>(model, comm, options);
    optimizer_ = optim::make_optimizer(cfg.optimizer, sharded_->trained_master_parameters());
    if (plain)
      distributed::import_optimizer_state(*sharded_, *plain, *optimizer_);
    else if (resume.dir)
      *resume.resumed =
          distributed::load_sharded_checkpoint(*resume.dir, *sharded_, *optimizer_, test_hooks::before_resume_unit);
    take_weight_decay(cfg.optimizer);
  }

  models::CausalLM& model() override { return *model_; }
  at::Device device() const override { return device_; }
  /// The data-parallel rank and size (the world's, without tensor parallelism).
  int64_t rank() const override { return data_->rank(); }
  int64_t world_size() const override { return data_->world_size(); }
  std::string describe() const override {
    return concat(
        comm_->world_size(), " rank(s), ", comm_->backend(), ", ", sharding_,
        param_dtype_ != "float32" ? ", " + param_dtype_ : std::string(), sharded_->offloaded() ? ", cpu_offload" : "",
        sharded_->replicas() > 1
            ? concat(", hybrid: ", sharded_->replicas(), " replicas of ", sharded_->shard_comm().world_size(), " ranks")
            : std::string(),
        tensor_parallel_ > 1
            ? concat(", tensor parallel ", tensor_parallel_, model_->sequence_parallel ? " (sequence parallel)" : "",
                     model_->vocab_parallel ? " (vocabulary parallel)" : "")
            : std::string(),
        context_parallel_ > 1 ? concat(", context parallel ", context_parallel_, ring_ ? " (ring)" : "") : "",
        tensor_parallel_ * context_parallel_ > 1 ? concat(" x data parallel ", data_->world_size()) : std::string());
  }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  std::vector<at::Tensor> gradients() override {
    std::vector<at::Tensor> g;
    for (const auto& p : sharded_->trained_master_parameters()) g.push_back(p.grad());
    return g;
  }
  /// The unit and flat place of parameter `name`.
  std::pair<size_t, const distributed::FlatParam*> locate(const std::string& name, const char* who) const {
    for (size_t u = 0; u < sharded_->whole_layouts().size(); ++u)
      for (const auto& p : sharded_->whole_layouts()[u].params)
        if (p.name == name) return {u, &p};
    TORCH_CHECK(false, who, ": the model has no parameter \"", name, "\"");
  }
  std::vector<std::vector<std::string>> parameter_units() override {
    std::vector<std::vector<std::string>> out;
    for (const auto& layout : sharded_->layouts()) {
      out.emplace_back();
      for (const auto& p : layout.params) out.back().push_back(p.name);
    }
    return out;
  }
  std::vector<at::Tensor> unit_parameters(size_t u) override {
    const auto& layouts = sharded_->whole_layouts();
    TORCH_CHECK(u < layouts.size(), "unit_parameters: the model has ", layouts.size(), " units, got ", u);
    at::NoGradGuard no_grad;
    const auto flat = sharded_->to_whole_layout(u, sharded_->gather_master(u));
    std::vector<at::Tensor> out;
    for (const auto& p : layouts[u].params) out.push_back(flat.narrow(0, p.offset, p.numel).view(p.shape));
    return out;
  }
  std::map<std::string, at::Tensor> get_parameters(const std::vector<std::string>& names) override {
    std::map<size_t, std::vector<const distributed::FlatParam*>> by_unit;  // gathered in unit order on every rank
    for (const auto& name : names) {
      const auto [u, p] = locate(name, "get_parameters");
      by_unit[u].push_back(p);
    }
    std::map<std::string, at::Tensor> out;
    at::NoGradGuard no_grad;
    for (const auto& [u, list] : by_unit) {
      const auto flat = sharded_->to_whole_layout(u, sharded_->gather_master(u));
      for (const auto* p : list) out.emplace(p->name, flat.narrow(0, p->offset, p->numel).view(p->shape).clone());
    }
    return out;
  }
  void set_parameters(const std::map<std::string, at::Tensor>& values) override {
    // By unit, in unit order (the same on every rank): gather, overwrite, reload.
    std::map<size_t, std::vector<std::pair<const distributed::FlatParam*, at::Tensor>>> by_unit;
    for (const auto& [name, v] : values) {
      const auto [unit, found] = locate(name, "set_parameters");
      TORCH_CHECK(v.sizes() == at::IntArrayRef(found->shape), "set_parameters: \"", name, "\" has shape ",
                  at::IntArrayRef(found->shape), ", got ", v.sizes());
      by_unit[unit].emplace_back(found, v);
    }
    wait_for_save_copy();
    at::NoGradGuard no_grad;
    for (const auto& [u, list] : by_unit) {
      auto flat = sharded_->to_whole_layout(u, sharded_->gather_master(u)).clone();
      for (const auto& [p, v] : list) flat.narrow(0, p->offset, p->numel).copy_(v.reshape(-1));
      sharded_->load_unit(u, sharded_->from_whole_layout(u, flat));
    }
  }

 protected:
  stdfs::path save_own(const stdfs::path& output_dir, const io::TrainerState& state, const tokenizer::Tokenizer* tok,
                       const std::string& config_yaml, int64_t keep_last) override {
    if (single_process_layout()) {
      checkpoint::CheckpointParts parts;
      parts.model = master_state();
      parts.tokenizer = tok;
      parts.rng = checkpoint::rng_state(device_);
      parts.state = state;
      parts.run_config_yaml = config_yaml;
      for (const auto& [name, e] : companion_engines())
        parts.companions.emplace_back(name, static_cast<ShardedEngine&>(*e).master_state());
      return saves_.save(output_dir, std::move(parts), keep_last);
    }
    if (saves_.background()) {
      // The collectives now; each rank's files, and rank 0's publication
      // once every rank has marked its files written, in the background.
      saves_.finish();
      auto save = std::make_shared<distributed::ShardedSave>(distributed::prepare_sharded_save(
          output_dir, *sharded_, *optimizer_, tok, state, config_yaml, keep_last, consolidated_));
      for (const auto& [name, e] : companion_engines()) {  // in the same order on every rank
        auto& c = static_cast<ShardedEngine&>(*e);
        save->companions.emplace_back(name, distributed::gather_consolidated(*c.sharded_, *c.optimizer_));
      }
      CheckpointWriter::Job job;
      job.step = state.step;
      job.dir = output_dir / concat("checkpoint-", state.step);
      job.tensors = {&save->shard, &save->whole, &save->heads};
      for (auto& [file, tensors] : save->owned) {
        job.tensors.push_back(&tensors);
        // Gathered for this save into buffers of their own (no_shard's are views of the masters).
        if (sharded_->options().strategy != distributed::Sharding::NoShard) job.owned.push_back(&tensors);
      }
      for (auto& [name, c] : save->companions) {
        job.tensors.push_back(&c.weights);
        job.tensors.push_back(&c.moments);
      }
      job.write = [s = save.get(), timeout = timeout_s_](const std::function<void(const stdfs::path&)>& before) {
        distributed::write_sharded_files(*s);
        if (s->rank == 0) distributed::publish_sharded_save(*s, timeout, before);
      };
      job.payload = std::move(save);
      return saves_.start(std::move(job));
    }
    // Written at once: every rank writes its shard between barriers.
    const auto dir =
        distributed::save_sharded_checkpoint(output_dir, *sharded_, *optimizer_, tok, state, config_yaml, keep_last,
                                             consolidated_, [this](const stdfs::path& dir) { write_companions(dir); });
    log::info("saved ", dir.string());
    return dir;
  }
  void begin_step() override {
    if (!zero_in_place_) optimizer_->zero_grad();  // else the masters' gradients stay: ShardedModel zeroes them
    sharded_->begin_step();
  }
  // Graph steps on one process without sharding (dist.param_dtype alone): the collectives are the identity
  // and every unit stays whole, so a step's host bookkeeping is the same each time and records with it.
  std::string graph_refusal_own() const override {
    if (comm_->world_size() != 1) return "several ranks train";
    if (sharded_->options().strategy != distributed::Sharding::NoShard)
      return concat("dist.sharding is ", sharding_,
                    ": its gathers free and refill parameter storage around each block, which a graph cannot follow");
    return "";
  }
  void prepare_graph_step() override {
    wait_for_save_copy();
    zero_in_place_ = true;
    // The decoupled weight decay's factor, as decay() computes it (in double, then float32), for the graph.
    if (!keep_.defined()) keep_ = at::empty({}, sharded_->master_parameters().front().options().dtype(at::kFloat));
    keep_.fill_(1 - optimizer_->param_groups().front().options().get_lr() * weight_decay_);
  }
  GraphStep queue_graph_step(Objective& objective, const std::vector<Batch>& batches, const at::Tensor& scale,
                             const at::Tensor& lr, double max_norm) override {
    TORCH_CHECK(zero_in_place_ && keep_.defined(), "queue_graph_step: prepare_graph_step() first");
    begin_step();
    AccumulateOptions ao;
    ao.scale = scale;
    ao.read_loss = false;
    ao.before_backward = [this](bool last) { before_backward(last); };
    ao.after_backward = [this] { after_backward(); };
    GraphStep g;
    g.loss = accumulate_gradients(objective, *model_, batches, ao).loss_tensor;
    g.norm = clip_own(max_norm);
    g.skip = not_finite(g.loss, g.norm);
    decay_by(at::where(g.skip.gt(0), at::ones({}, g.skip.options()), keep_));
    queue_optimizer_step(lr, g.skip);
    sharded_->after_optimizer_step();
    return g;
  }

  void before_backward(bool last) override { sharded_->set_grad_sync(last); }
  void after_backward() override { sharded_->finish_backward(); }
  void agree_none_out_of_memory() override { sharded_->agree_none_out_of_memory(); }
  void announce_out_of_memory() override { sharded_->announce_out_of_memory(); }
  at::Tensor clip_own(double max_norm) override { return sharded_->clip_grad_norm_on_device(max_norm); }
  Metrics collect_own(bool wait) override { return saves_.collect(wait); }
  void finish_own(bool apply) override {
    wait_for_save_copy();  // before the step changes the masters and moments a background save copies
    if (apply) {
      decay(std::nullopt);
      optimizer_->step();
    }
    sharded_->after_optimizer_step();
  }
  int64_t finish_own_on_device(const at::Tensor& device_skip) override {
    wait_for_save_copy();
    const auto skip = device_skip.to(sharded_->master_device());  // the host's masters under cpu_offload
    decay(skip);
    const int64_t call = fused_adamw(*optimizer_)->skip_next_if(skip);
    optimizer_->step();
    sharded_->after_optimizer_step();
    return call;
  }
  torch::optim::Optimizer& optimizer_ref() const override { return *optimizer_; }
  Metrics memory_own() override {
    const auto mem = sharded_->memory();
    Metrics m{{"memory/parameter_bytes", static_cast<double>(mem.parameters)},
              {"memory/gradient_bytes", static_cast<double>(mem.gradients)},
              {"memory/peak_gathered_parameter_bytes", static_cast<double>(mem.peak_gathered)},
              {"memory/peak_reductions_in_flight", static_cast<double>(mem.peak_reductions_in_flight)},
              {"memory/optimizer_bytes", static_cast<double>(optimizer_bytes(*optimizer_))},

              {"memory/eval_peak_gathered_parameter_bytes", static_cast<double>(eval_peak_gathered_)}};
    // Under cpu_offload: the host's part (masters, their gradients and AdamW's moments).
    if (sharded_->offloaded())
      m["memory/offloaded_bytes"] = static_cast<double>(mem.offloaded + optimizer_bytes(*optimizer_));
    return m;
  }
  void write_companion(const stdfs::path& dir) override { distributed::save_consolidated(dir, *sharded_, *optimizer_); }
  /// AdamW's decoupled decay, p *= 1 - lr * wd before its update, on the
  /// decayed slices only (the optimizer's own is off); with `skip`, a factor
  /// of 1 where the step is skipped, chosen on the device.
  void decay(const std::optional<at::Tensor>& skip) {
    if (weight_decay_ == 0) return;
    const double lr = optimizer_->param_groups().front().options().get_lr();
    const double keep = 1 - lr * weight_decay_;
    if (skip)  // the same float32 factor as the scalar's below, or exactly 1
      return decay_by(at::where(skip->gt(0), at::ones({}, skip->options()), at::full({}, keep, skip->options())));
    at::NoGradGuard no_grad;
    const auto masters = sharded_->master_parameters();
    for (const auto& r : decayed_) masters[r.unit].narrow(0, r.offset, r.numel).mul_(keep);
  }
  /// The decayed slices multiplied by `factor` (0-dim float32 on the device).
  void decay_by(const at::Tensor& factor) {
    if (weight_decay_ == 0) return;
    at::NoGradGuard no_grad;
    const auto masters = sharded_->master_parameters();
    for (const auto& r : decayed_) masters[r.unit].narrow(0, r.offset, r.numel).mul_(factor);
  }
  void gather_own() override { sharded_->gather_full_parameters(); }
  void release_own() override { sharded_->release_full_parameters(); }
  void begin_evaluation_own() override { sharded_->begin_evaluation(); }
  void end_evaluation_own() override { eval_peak_gathered_ = sharded_->end_evaluation(); }

 private:
  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<distributed::Communicator> comm_;
  std::shared_ptr<distributed::Communicator> data_;  // the ranks data is split over: comm_, or the mesh's dp
  int64_t tensor_parallel_ = 1, context_parallel_ = 1;
  bool ring_ = false;  // dist.context_parallel_mode: ring
  at::Device device_;
  /// Elements [offset, offset + numel) of unit `unit`'s master shard.
  struct Slice {
    size_t unit;
    int64_t offset;
    int64_t numel;
  };
  /// AdamW's decoupled weight decay, which spares biases and norms
  /// (optim::decays), is applied by finish_own to the decayed slices of the
  /// trained units only: a flat unit mixes both kinds. (The frozen
  /// parameters are in frozen units, which the optimizer never sees.)
  void take_weight_decay(const config::OptimizerConfig& opt) {
    const auto exempt = optim::no_decay_parameters(opt, *model_);
    const std::unordered_set<std::string> no_decay(exempt.begin(), exempt.end());
    for (size_t u = 0; u < sharded_->layouts().size(); ++u) {
      if (sharded_->layouts()[u].frozen) continue;
      const auto [b, e] = sharded_->shard_range(u);
      for (const auto& p : sharded_->layouts()[u].params) {
        const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
        if (hi <= lo || no_decay.count(p.name)) continue;
        if (!decayed_.empty() && decayed_.back().unit == u && decayed_.back().offset + decayed_.back().numel == lo - b)
          decayed_.back().numel += hi - lo;  // adjacent parameters: one slice
        else
          decayed_.push_back({u, lo - b, hi - lo});
      }
    }
    for (auto& group : optimizer_->param_groups()) {
      auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
      weight_decay_ = o.weight_decay();
      o.weight_decay(0);
    }
  }

  /// One rank whose models (the policy and any companion) train every
  /// parameter: the float32 masters are the whole models, so the checkpoint
  /// takes the single-process layout (no shard files beside a consolidated
  /// copy of the same tensors). Resuming it under any world size imports it
  /// (the constructor).
  bool single_process_layout() {
    if (comm_->world_size() != 1 || sharded_->has_frozen_units()) return false;
    for (const auto& [name, e] : companion_engines())
      if (static_cast<ShardedEngine&>(*e).sharded_->has_frozen_units()) return false;
    return true;
  }
  /// checkpoint::model_state() of the masters: each parameter and its AdamW moments
  /// as views of the flat float32 units (no copies).
  checkpoint::ModelState master_state() {
    checkpoint::ModelState out;
    out.model = model_.get();
    out.dtype = at::kFloat;
    const auto saved = checkpoint::saved_parameters(*model_);
    const auto masters = sharded_->master_parameters();
    for (size_t u = 0; u < masters.size(); ++u) {
      auto* st = optim::adamw_state(*optimizer_, masters[u]);
      for (const auto& p : sharded_->layouts()[u].params) {
        const auto part = [&](const at::Tensor& flat) { return flat.narrow(0, p.offset, p.numel).view(p.shape); };
        if (saved(p.name)) out.weights.emplace(p.name, part(masters[u]));
        if (!st) continue;  // not stepped yet
        out.moments.emplace(p.name + ".exp_avg", part(st->exp_avg()));
        out.moments.emplace(p.name + ".exp_avg_sq", part(st->exp_avg_sq()));
        out.steps[p.name] = st->step();
      }
    }
    return out;
  }
  void wait_for_save_copy() {
    if (const double s = saves_.wait_copied(); s > 0) add_stall(s);
  }

  std::vector<Slice> decayed_;  // this rank's trained parameters weight decay applies to
  double weight_decay_ = 0;     // AdamW's, applied by finish_own to decayed_
  bool zero_in_place_ = false;  // since the first graph step: the masters' gradients are the graph's
  at::Tensor keep_;             // graph steps: the decoupled decay's factor, filled before each
  std::string sharding_, param_dtype_;
  bool consolidated_;
  double timeout_s_;  // how long rank 0's writer waits for the other ranks' shards
  std::unique_ptr<distributed::ShardedModel> sharded_;
  int64_t eval_peak_gathered_ = 0;  // the last evaluation's most whole parameter bytes (Engine::evaluating)
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  BackgroundSaves saves_;  // last: its thread reads the model until joined
};

}  // namespace

EngineStart make_engine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model,
                        std::shared_ptr<distributed::Communicator> comm, const Objective& objective,
                        const std::optional<std::filesystem::path>& resume_from,
                        const std::vector<CompanionModel>& companions, std::shared_ptr<distributed::Mesh> mesh) {
  EngineStart out;
  auto build = [&](std::shared_ptr<models::CausalLM> m, const config::RunConfig& c, const Trains& trains,
                   const std::string& who, const ResumeFrom& resume) -> std::unique_ptr<EngineImpl> {
    if (comm) return std::make_unique<ShardedEngine>(c, std::move(m), comm, trains, who, resume, mesh);
    return std::make_unique<PlainEngine>(c, std::move(m), trains, who, resume);
  };
  // With LoRA adapters, only they (and heads: a reward model's score, PPO's
  // value head, ILQL's Q and V) train, of what the objective trains.
  const bool lora = models::has_lora(*model);
  const Trains trains = [&objective, lora](const std::string& n) {
    return objective.trains(n) && (!lora || models::lora_trains(n));
  };
  if (lora) log_trainable(*model, trains);
  auto engine = build(std::move(model), cfg, trains, concat("algorithm: ", objective.name()),
                      ResumeFrom{resume_from, &out.resumed});
  for (const auto& comp : companions) {
    auto c = cfg;
    c.optimizer.lr = comp.lr;
    std::optional<stdfs::path> dir;
    if (resume_from) dir = *resume_from / comp.name;
    engine->add_companion(comp.name,
                          build(
                              comp.model, c, [](const std::string&) { return true; }, comp.name, ResumeFrom{dir}),
                          comp.lr / cfg.optimizer.lr);
  }
  out.engine = std::move(engine);
  return out;
}

}  // namespace anvil::train
