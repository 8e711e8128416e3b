// The two engines: one plain process (HF-layout checkpoints), and sharded
// ranks over distributed::ShardedModel. Everything the loop does to the model,
// the optimizer and the checkpoint goes through here.
#include "anvil/train/engine.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <unordered_set>

#include "anvil/core/error.h"
#include "anvil/core/tensor_bytes.h"
#include "anvil/models/activation_checkpointing.h"
#include "anvil/distributed/checkpoint.h"
#include "anvil/distributed/sharding.h"
#include "anvil/io/checkpoint.h"
#include "anvil/optim/optimizer.h"
#include "anvil/train/trainer.h"

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

/// Global L2 norm of the gradients of `params`, clipped to `max_norm` when larger (0 = only measure).
double clip_or_measure(const std::vector<at::Tensor>& params, double max_norm) {
  if (max_norm > 0) return torch::nn::utils::clip_grad_norm_(params, max_norm);
  at::Tensor sq;  // summed on the device: one host sync
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    auto t = p.grad().to(at::kDouble).pow(2).sum();
    sq = sq.defined() ? sq + t : t;
  }
  return sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
}

/// The parameters the objective trains; the others are frozen here.
std::vector<at::Tensor> trained_parameters(models::CausalLM& model, const Objective& objective) {
  std::vector<at::Tensor> trained;
  for (auto& p : model.named_parameters()) {
    if (objective.trains(p.key())) {
      trained.push_back(p.value());
    } else {
      p.value().set_requires_grad(false);
    }
  }
  if (trained.empty())
    throw ConfigError(concat("algorithm: ", objective.name(), " trains none of the model's parameters"));
  return trained;
}

class PlainEngine final : public Engine {
 public:
  PlainEngine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model, const Objective& objective,
              const std::optional<stdfs::path>& resume_from, std::optional<io::TrainerState>& resumed)
      : model_(std::move(model)), device_(model_->parameters().front().device()) {
    if (cfg.train.activation_checkpointing)
      model_->set_block_runner([](size_t, const at::Tensor& x, const models::BlockFn& block) {
        return models::checkpoint_block(block, x);
      });
    params_ = trained_parameters(*model_, objective);
    optimizer_ = optim::make_optimizer(cfg.optimizer, params_);
    if (resume_from) resumed = io::load_checkpoint(*resume_from, *model_, *optimizer_);
  }

  models::CausalLM& model() override { return *model_; }
  at::Device device() const override { return device_; }
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  std::string describe() const override { return ""; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }

  StepStats backward(Objective& objective, const std::vector<Batch>& batches, int64_t step_targets) override {
    optimizer_->zero_grad();
    AccumulateOptions ao;
    ao.step_targets = step_targets;
    return accumulate_gradients(objective, *model_, batches, ao);
  }
  double clip_grad_norm(double max_norm) override { return clip_or_measure(params_, max_norm); }
  void finish_step(bool apply) override {
    if (apply) optimizer_->step();
  }
  std::vector<at::Tensor> gradients() override {
    std::vector<at::Tensor> g;
    for (const auto& p : params_) g.push_back(p.grad());
    return g;
  }
  Metrics memory() override {
    std::unordered_set<const void*> seen;
    const auto all = model_->parameters();
    return {{"memory/parameter_bytes", static_cast<double>(storage_bytes(all, seen))},
            {"memory/gradient_bytes", static_cast<double>(storage_bytes(gradients(), seen))},
            {"memory/optimizer_bytes", static_cast<double>(optimizer_bytes(*optimizer_))}};
  }
  stdfs::path save(const stdfs::path& output_dir, const io::TrainerState& state, const tokenizer::Tokenizer* tok,
                   const std::string& config_yaml, int64_t keep_last) override {
    io::CheckpointParts parts{model_.get(), tok, optimizer_.get(), state, config_yaml};
    return io::save_checkpoint(output_dir, parts, keep_last);
  }

 protected:
  void gather() override {}
  void release() override {}

 private:
  std::shared_ptr<models::CausalLM> model_;
  at::Device device_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

class ShardedEngine final : public Engine {
 public:
  ShardedEngine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model,
                std::shared_ptr<distributed::Communicator> comm, const Objective& objective,
                const std::optional<stdfs::path>& resume_from, std::optional<io::TrainerState>& resumed)
      : model_(model),
        comm_(comm),
        device_(model->parameters().front().device()),
        sharding_(cfg.dist.sharding),
        param_dtype_(cfg.dist.param_dtype),
        consolidated_(cfg.dist.consolidated_checkpoints) {
    // A plain checkpoint (a single-process run going multi-process) is read
    // into the whole model and a per-parameter optimizer first; sharding then
    // flattens both.
    std::unique_ptr<torch::optim::Optimizer> plain;
    if (resume_from && !distributed::is_sharded_checkpoint(*resume_from)) {
      plain = optim::make_optimizer(cfg.optimizer, model->parameters());
      resumed = io::load_checkpoint(*resume_from, *model, *plain);
    }
    sharded_ = std::make_unique<distributed::ShardedModel>(model, comm, sharding_options(cfg));
    optimizer_ = optim::make_optimizer(cfg.optimizer, sharded_->master_parameters());
    if (plain) distributed::import_optimizer_state(*sharded_, *plain, *optimizer_);
    else if (resume_from) resumed = distributed::load_sharded_checkpoint(*resume_from, *sharded_, *optimizer_);
    freeze(objective);
  }

  models::CausalLM& model() override { return *model_; }
  at::Device device() const override { return device_; }
  int64_t rank() const override { return comm_->rank(); }
  int64_t world_size() const override { return comm_->world_size(); }
  std::string describe() const override {
    return concat(comm_->world_size(), " rank(s), ", comm_->backend(), ", ", sharding_,
                  param_dtype_ != "float32" ? ", " + param_dtype_ : std::string());
  }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }

  StepStats backward(Objective& objective, const std::vector<Batch>& batches, int64_t step_targets) override {
    optimizer_->zero_grad();
    sharded_->begin_step();
    AccumulateOptions ao;
    ao.step_targets = step_targets;
    ao.before_backward = [&](bool last) { sharded_->set_grad_sync(last); };
    ao.after_backward = [&] { sharded_->finish_backward(); };
    return accumulate_gradients(objective, *model_, batches, ao);
  }
  double clip_grad_norm(double max_norm) override {
    // Frozen slices carry no gradient, as frozen parameters have none on one process.
    at::NoGradGuard no_grad;
    const auto masters = sharded_->master_parameters();
    for (const auto& f : frozen_)
      if (masters[f.unit].grad().defined()) masters[f.unit].mutable_grad().narrow(0, f.offset, f.values.numel()).zero_();
    return sharded_->clip_grad_norm(max_norm);
  }
  void finish_step(bool apply) override {
    if (apply) optimizer_->step();
    {
      // AdamW's weight decay moves every element of a flat master shard; the
      // frozen ones are put back exactly.
      at::NoGradGuard no_grad;
      const auto masters = sharded_->master_parameters();
      for (const auto& f : frozen_) masters[f.unit].narrow(0, f.offset, f.values.numel()).copy_(f.values);
    }
    sharded_->after_optimizer_step();
  }
  std::vector<at::Tensor> gradients() override {
    std::vector<at::Tensor> g;
    for (const auto& p : sharded_->master_parameters()) g.push_back(p.grad());
    return g;
  }
  Metrics memory() override {
    const auto mem = sharded_->memory();
    return {{"memory/parameter_bytes", static_cast<double>(mem.parameters)},
            {"memory/gradient_bytes", static_cast<double>(mem.gradients)},
            {"memory/peak_gathered_parameter_bytes", static_cast<double>(mem.peak_gathered)},
            {"memory/optimizer_bytes", static_cast<double>(optimizer_bytes(*optimizer_))}};
  }
  stdfs::path save(const stdfs::path& output_dir, const io::TrainerState& state, const tokenizer::Tokenizer* tok,
                   const std::string& config_yaml, int64_t keep_last) override {
    return distributed::save_sharded_checkpoint(output_dir, *sharded_, *optimizer_, tok, state, config_yaml, keep_last,
                                         consolidated_);
  }

 protected:
  void gather() override { sharded_->gather_full_parameters(); }
  void release() override { sharded_->release_full_parameters(); }

 private:
  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<distributed::Communicator> comm_;
  at::Device device_;
  /// This rank's elements of the parameters the objective freezes: their
  /// place in a unit's master shard and their values.
  struct Frozen {
    size_t unit;
    int64_t offset;
    at::Tensor values;
  };
  void freeze(const Objective& objective) {
    const auto masters = sharded_->master_parameters();
    for (size_t u = 0; u < sharded_->layouts().size(); ++u) {
      const auto [b, e] = sharded_->shard_range(u);
      for (const auto& p : sharded_->layouts()[u].params) {
        if (objective.trains(p.name)) continue;
        const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
        if (hi > lo) frozen_.push_back({u, lo - b, masters[u].narrow(0, lo - b, hi - lo).detach().clone()});
      }
    }
  }

  std::vector<Frozen> frozen_;
  std::string sharding_, param_dtype_;
  bool consolidated_;
  std::unique_ptr<distributed::ShardedModel> sharded_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace

void Engine::set_lr(double lr) { optim::set_lr(optimizer(), lr); }

distributed::ShardingOptions sharding_options(const config::RunConfig& cfg) {
  distributed::ShardingOptions so;
  so.strategy = distributed::parse_sharding(cfg.dist.sharding);
  so.param_dtype = distributed::parse_dtype(cfg.dist.param_dtype);
  so.reduce_dtype = distributed::parse_dtype(cfg.dist.reduce_dtype);
  so.activation_checkpointing = cfg.train.activation_checkpointing;
  return so;
}

// ---- frozen models ---------------------------------------------------------------

FrozenModel::FrozenModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<distributed::ShardedModel> sharded)
    : model_(std::move(model)), sharded_(std::move(sharded)) {}

int64_t FrozenModel::parameter_bytes() const {
  if (!model_) return 0;
  if (sharded_) return sharded_->memory().parameters;
  std::unordered_set<const void*> seen;
  return storage_bytes(model_->parameters(), seen);
}

void FrozenModel::reset() {
  sharded_.reset();  // first: it unhooks the model's block runner
  model_.reset();
}

FrozenModel::Gathered FrozenModel::gathered() {
  if (!sharded_) return Gathered(nullptr);
  sharded_->gather_full_parameters();
  return Gathered(sharded_.get());
}

FrozenModel::Gathered::~Gathered() {
  if (sharded_) sharded_->release_full_parameters();
}

FrozenModel RunContext::freeze(std::shared_ptr<models::CausalLM> model) const {
  TORCH_CHECK(model != nullptr, "RunContext::freeze: no model");
  model->to(device);
  model->eval();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  if (!comm) return FrozenModel(std::move(model), nullptr);
  auto so = sharding;
  so.frozen = true;
  so.activation_checkpointing = false;  // nothing is saved for a backward
  auto sharded = std::make_shared<distributed::ShardedModel>(model, comm, so);
  return FrozenModel(std::move(model), std::move(sharded));
}

EngineStart make_engine(const config::RunConfig& cfg, std::shared_ptr<models::CausalLM> model,
                        std::shared_ptr<distributed::Communicator> comm, const Objective& objective,
                        const std::optional<std::filesystem::path>& resume_from) {
  EngineStart out;
  if (comm) out.engine = std::make_unique<ShardedEngine>(cfg, std::move(model), std::move(comm), objective,
                                                         resume_from, out.resumed);
  else out.engine = std::make_unique<PlainEngine>(cfg, std::move(model), objective, resume_from, out.resumed);
  return out;
}

}  // namespace anvil::train
