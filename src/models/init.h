#pragma once
// Building a model without drawing or holding its weights.
//
// SkipInitGuard: for a model whose weights are about to be loaded, as
// transformers' from_pretrained does (no_init_weights): the families'
// init_parameters() and the layers' own initialisation (layers::Dense,
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
//
// A randomly initialised model can be built that way too
// (build_deferred_random): its source replays, one parameter at a time, the
// draws the eager build makes from the default CPU generator, so a rank of a
// sharded run holds its shards of the very weights one process draws, for
// any world size, and never more than one whole parameter beyond them.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace anvil::models {

class CausalLM;
struct ParameterInit;

/// While one is alive on this thread, a family's constructor leaves out its
/// init_parameters() (the normal(0, initializer_range) draws, the ones and
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

/// Applies `init` to `t` (a float32 CPU tensor of the parameter's shape):
/// draws from `generator`, or the default CPU generator when it is nullopt.
void apply_parameter_init(const ParameterInit& init, at::Tensor& t, std::optional<at::Generator> generator = {});

/// Gives every parameter of `model` its CausalLM::parameter_init, in
/// named_parameters() order, drawing from the default CPU generator: what a
/// family's constructor calls unless init is skipped. Throws for a parameter
/// the family gives no rule.
void init_parameters(CausalLM& model);

/// A draw a layer's constructor makes from the default CPU generator
/// (layers::Dense's kaiming_uniform_, layers::Embedding's normal_): `numel`
/// elements of uniform(a, b) or, with `normal`, N(a, b). The families'
/// init_parameters overwrites the values, but the draws move the generator.
struct ConstructionDraw {
  int64_t numel = 0;
  bool normal = false;
  double a = 0, b = 1;
};
/// A layer whose init is skipped reports the draw it leaves out; it is kept
/// while a build_deferred_random on this thread records them.
void note_skipped_draw(const ConstructionDraw& draw);

/// `build()` (a family's from_config) run inside a DeferredInitGuard on
/// `device`, with a parameter_source that gives every parameter the values
/// the same call outside the guard would have drawn, and the default CPU
/// generator left where that call would have left it (what a later draw, a
/// LoRA adapter's or a head's, reads). Building it replays every draw of the
/// eager build once, a parameter at a time, keeping the generator's state
/// before each; a read then draws its parameter whole again from that state
/// and returns the range. Null, with the generator untouched, when the
/// family gives a parameter no CausalLM::parameter_init or builds one with
/// storage: build it eagerly then.
std::shared_ptr<CausalLM> build_deferred_random(const std::function<std::shared_ptr<CausalLM>()>& build,
                                                const at::Device& device);

}  // namespace anvil::models
