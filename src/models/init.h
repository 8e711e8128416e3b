#pragma once
// Building a model without drawing or holding its weights.
//
// SkipInitGuard: for a model whose weights are about to be loaded, as
// transformers' from_pretrained does (no_init_weights): the families'
// reset_parameters() and the layers' own initialisation (layers::Dense,
// Linear, Embedding, LayerNorm) are left out, so nothing is drawn and the
// random stream after loading does not depend on the model's size. A tensor
// is left as allocated, so whoever skips must fill every parameter:
// checkpoint::load_model_dir does, and load_weights fails on a missing one.
//
// DeferredInitGuard: the same, and every parameter the families and layers
// create has its shape and device but no storage (0 bytes): a model of any
// size is built in no memory. Its values come later, from the model's
// CausalLM::parameter_source, read piece by piece: distributed::ShardedModel
// reads each rank's range of every flat unit (nothing whole at load,
// docs/distributed.md), materialize_deferred() reads them whole. Until then
// nothing may read such a parameter. LibTorch's own modules (the reward
// model's score head, named heads, LoRA adapters) are small and stay real.

#include <ATen/core/Tensor.h>

namespace anvil::models {

class CausalLM;

/// While one is alive on this thread, a family's constructor leaves out its
/// reset_parameters() (the normal(0, initializer_range) draws, the ones and
/// zeros of norms and biases) and the layers their own. Nests; restores the
/// previous state.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

/// True inside a SkipInitGuard or a DeferredInitGuard on this thread.
bool init_skipped();

/// While one is alive on this thread, parameters are built without storage on
/// `device` (and init is skipped). Nests; restores the previous state.
class DeferredInitGuard {
 public:
  explicit DeferredInitGuard(const at::Device& device);
  ~DeferredInitGuard();
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;

 private:
  SkipInitGuard skip_;
  bool previous_;
  at::Device previous_device_;
};

/// A float32 tensor of `shape` for a parameter: without storage on the
/// guard's device inside a DeferredInitGuard, else uninitialised CPU memory.
at::Tensor new_parameter_tensor(at::IntArrayRef shape);

/// True for a parameter built inside a DeferredInitGuard and not yet given
/// its values (its storage holds fewer bytes than its elements need).
bool is_deferred(const at::Tensor& t);
/// True when the model has a parameter_source and any of its parameters is
/// deferred.
bool has_deferred(const CausalLM& model);

/// Gives every deferred parameter of `model` storage and its whole values from
/// model.parameter_source (the plain path: a model that is not sharded). A
/// no-op for a model with none.
void materialize_deferred(CausalLM& model);

}  // namespace anvil::models
