#pragma once
// The Engine as objectives and external code see it: the model, its device
// and ranks, scopes with sharded weights gathered whole, and the named
// parameters read and written outside the optimizer. Behind it the engine
// also owns the optimizer, accumulation, clipping, the optimizer step, memory
// accounting and checkpoints, which only the loop calls (src/train/
// step_engine.h). make_engine picks the plain (one process, HF-layout
// checkpoints) or the sharded implementation (distributed::ShardedModel); the
// loop never asks which one it has. docs/library.md.

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/train/objective.h"

namespace anvil::train {

class Engine {
 public:
  virtual ~Engine() = default;

  /// The whole model (its parameters may be sharded outside gathered()).
  virtual models::CausalLM& model() = 0;
  virtual at::Device device() const = 0;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// Sets the policy's named parameters (HF names, heads.* included) to
  /// `values`, outside the optimizer: a target network's Polyak update, an
  /// EMA. Every rank passes the same values (a collective in a sharded run:
  /// each unit concerned is gathered once). Optimizer state is untouched; a
  /// frozen parameter stays frozen, at its new value.
  virtual void set_parameters(const std::map<std::string, at::Tensor>& values) = 0;
  /// The policy's named parameters, whole and in float32 (the optimizer's
  /// master values in a sharded or mixed-precision run; a collective there),
  /// on the engine's device.
  virtual std::map<std::string, at::Tensor> get_parameters(const std::vector<std::string>& names) = 0;
  /// The policy's parameter names (HF names, heads.* included) grouped as a
  /// sharded run gathers them: its units in order (a block, the root, a
  /// frozen unit); one group holding every parameter on a plain engine.
  virtual std::vector<std::vector<std::string>> parameter_units() = 0;
  /// Unit `u`'s parameters (parameter_units()[u], in that order), whole: the
  /// float32 masters in a sharded run (a frozen unit's in dist.param_dtype),
  /// gathering that unit alone; the parameters themselves (detached) on a
  /// plain engine. A collective in a sharded run: every rank calls it alike.
  virtual std::vector<at::Tensor> unit_parameters(size_t u) = 0;
  /// Keeps the full weights gathered on every rank while it lives (eval,
  /// generation); nothing to do on a plain engine. Not reentrant.
  class Gathered {
   public:
    explicit Gathered(Engine* e, bool evaluation = false) : engine_(e), evaluation_(evaluation) {}
    Gathered(Gathered&& o) noexcept : engine_(o.engine_), evaluation_(o.evaluation_) { o.engine_ = nullptr; }
    Gathered(const Gathered&) = delete;
    Gathered& operator=(const Gathered&) = delete;
    ~Gathered() {
      if (!engine_) return;
      if (evaluation_)
        engine_->end_evaluation();
      else
        engine_->release();
    }

   private:
    Engine* engine_;
    bool evaluation_;
  };
  [[nodiscard]] Gathered gathered() {
    gather();
    return Gathered(this);
  }
  /// What an evaluation needs while it lives: under full_shard only the
  /// units outside the blocks (embeddings, final norm, heads) stay whole and
  /// each block is gathered as the forward reaches it, as in training, so a
  /// held-out loss never holds the whole model; generation::generate gathers
  /// the whole model for its decoding only. Elsewhere the same as gathered().
  [[nodiscard]] Gathered evaluating() {
    begin_evaluation();
    return Gathered(this, /*evaluation=*/true);
  }

 protected:
  virtual void gather() = 0;
  virtual void release() = 0;
  virtual void begin_evaluation() { gather(); }
  virtual void end_evaluation() { release(); }
};

}  // namespace anvil::train
