// FrozenModel (anvil/models/causal_lm.h): a model held for forward passes,
// whole or in parts (ShardedParameters, which distributed::ShardedModel is).
#include <unordered_set>

#include "anvil/models/causal_lm.h"
#include "core/tensor_bytes.h"

namespace anvil::models {

FrozenModel::FrozenModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<ShardedParameters> sharded)
    : model_(std::move(model)), sharded_(std::move(sharded)) {}

int64_t FrozenModel::parameter_bytes() const {
  if (!model_) return 0;
  if (sharded_) return sharded_->held_parameter_bytes();
  std::unordered_set<const void*> seen;
  return storage_bytes(model_->parameters(), seen);
}

void FrozenModel::reset() {
  sharded_.reset();  // first: a sharded model unhooks the model's block runner
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

}  // namespace anvil::models
