// What an objective's prepare() is given to hold its extra models the way
// the run holds the policy (RunContext, anvil/train/objective.h): frozen
// (a reference, a reward model, a teacher) or trained beside the policy (a
// companion), sharded like it in a multi-process run.
#include "anvil/core/error.h"
#include "anvil/train/objective.h"
#include "distributed/sharding.h"
#include "models/init.h"
#include "train/engine_setup.h"

namespace anvil::train {

distributed::ShardingOptions sharding_options(const config::RunConfig& cfg) {
  distributed::ShardingOptions so;
  so.strategy = distributed::parse_sharding(config::kShardings.name(cfg.dist.sharding));
  so.param_dtype = distributed::parse_dtype(config::kDtypes.name(cfg.dist.param_dtype));
  so.reduce_dtype = distributed::parse_dtype(config::kDtypes.name(cfg.dist.reduce_dtype));
  so.activation_checkpointing = cfg.train.activation_checkpointing;
  so.cpu_offload = cfg.dist.cpu_offload;
  so.replicate = cfg.dist.replicate;
  // The config as written (the trainer hands its engine auto, not auto's resolved start).
  so.agree_on_out_of_memory = cfg.train.micro_batch_size == config::TrainConfig::kAutoMicroBatch;
  return so;
}

FrozenModel RunContext::freeze(std::shared_ptr<models::CausalLM> model) const {
  TORCH_CHECK(model != nullptr, "RunContext::freeze: no model");
  // A model built without storage (a clone of a deferred policy) is read into its shards under full_shard
  // (under tensor parallelism the cut layers' shares when cut), else whole.
  const bool tensor_parallel = sharding && sharding->tensor_parallel && sharding->tensor_parallel->world_size() > 1;
  if (!comm || !full_shard()) models::materialize_deferred(*model);
  model->to(device);
  model->eval();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  if (!comm) return FrozenModel(std::move(model), nullptr);
  auto so = sharding ? *sharding : distributed::ShardingOptions{};
  // Under tensor parallelism its blocks are cut across the group as the policy's are, then sharded over the
  // data-parallel ranks.
  if (tensor_parallel) so.tensor_parallel_cuts = distributed::apply_tensor_parallel(*model, so.tensor_parallel);
  so.frozen = true;
  so.activation_checkpointing = false;  // nothing is saved for a backward
  so.agree_on_out_of_memory = false;    // its forwards are no step's to split
  auto sharded = std::make_shared<distributed::ShardedModel>(model, comm, so);
  return FrozenModel(std::move(model), std::move(sharded));
}

bool RunContext::full_shard() const { return sharding && sharding->strategy == distributed::Sharding::FullShard; }

std::shared_ptr<distributed::Communicator> RunContext::data_comm() const {
  return sharding && sharding->data_parallel ? sharding->data_parallel : comm;
}

std::shared_ptr<models::CausalLM> RunContext::train(const std::string& name, std::shared_ptr<models::CausalLM> model,
                                                    double lr) const {
  TORCH_CHECK(model != nullptr, "RunContext::train: no model");
  if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw ConfigError(concat("RunContext::train: the name \"", name, "\" is not of a-z, 0-9 and _"));
  for (const auto& c : *companions)
    if (c.name == name) throw ConfigError(concat("RunContext::train: a model named \"", name, "\" is trained already"));
  if (!(lr > 0)) throw ConfigError(concat("RunContext::train: ", name, "'s learning rate must be > 0, got ", lr));
  if (sharding && sharding->tensor_parallel && sharding->tensor_parallel->world_size() > 1)
    throw ConfigError(concat("dist.tensor_parallel: ", sharding->tensor_parallel->world_size(),
                             ": a model trained beside the policy (", name,
                             ") is not supported under tensor parallelism yet; set dist.tensor_parallel: 1"));
  if (!comm || !full_shard()) models::materialize_deferred(*model);
  model->to(device);
  model->train();
  companions->push_back({name, model, lr});
  return model;
}

}  // namespace anvil::train
