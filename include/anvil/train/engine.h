#pragma once
// The Engine: what a training run needs around its model, whatever the
// parallelism. It owns the device, the optimizer over the trained
// parameters, gradient accumulation, clipping, the optimizer step, scopes
// with sharded weights gathered whole, memory accounting, and checkpoints of
// the model, the optimizer and the trainer state (objective state included).
// make_engine picks the plain (one process, HF-layout checkpoints) or the
// sharded implementation (distributed::ShardedModel); the loop never asks
// which one it has. docs/library.md.

#include <torch/optim/optimizer.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/objective.h"

namespace anvil::io {
struct TrainerState;
}  // namespace anvil::io

namespace anvil::train {

/// The loss of one optimizer step and what it consumed.
struct StepStats {
  double loss = 0;  // summed loss / total target units of the step
  /// The same loss as a 0-dim float64 tensor on the device. With read_loss
  /// false (Engine::backward), `loss` is left unread and this is its source:
  /// reading it after more work is queued (the gradient norm) makes the step
  /// wait for the device once instead of twice.
  at::Tensor loss_tensor;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;
  Sums sums;  // the objective's statistics, summed over the micro-batches
};

/// A step's outputs on the device, as Engine::queue_graph_step records them.
struct GraphStep {
  at::Tensor loss;  // 0-dim float64: summed loss / the step's target units
  at::Tensor norm;  // 0-dim float64: the gradient norm before clipping
  at::Tensor skip;  // 0-dim float32: 1 when the step was not applied (loss or norm not finite)
};

class Engine {
 public:
  virtual ~Engine() = default;

  /// The whole model (its parameters may be sharded outside gathered()).
  virtual models::CausalLM& model() = 0;
  virtual at::Device device() const = 0;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// Words for the log line: "" for one plain process, else the ranks,
  /// backend and sharding.
  virtual std::string describe() const = 0;

  /// The policy's optimizer.
  virtual torch::optim::Optimizer& optimizer() = 0;
  /// Sets the policy's learning rate, and each companion model's in proportion
  /// (its lr / optimizer.lr).
  virtual void set_lr(double lr) = 0;

  /// Forward + backward of this rank's micro-batches of one optimizer step,
  /// each micro-batch's summed loss divided by `step_targets` (the target
  /// units of the whole step, all ranks), so N micro-batches equal one batch.
  /// Gradients are zeroed first. Without `read_loss`, StepStats::loss is not
  /// read from the device (loss_tensor holds it): nothing waits for the device.
  virtual StepStats backward(Objective& objective, const std::vector<Batch>& batches, int64_t step_targets,
                             bool read_loss = true) = 0;
  /// The global L2 norm of the trained parameters' gradients, clipped to
  /// `max_norm` when larger (0: only measured).
  /// A companion model's norm is measured and clipped on its own; a non-finite
  /// one makes the returned norm NaN (the step is skipped).
  virtual double clip_grad_norm(double max_norm) = 0;
  /// Metrics of the last clip_grad_norm beyond the policy's: each companion
  /// model's "<name>/grad_norm".
  virtual Metrics step_metrics() const = 0;
  /// Applies the optimizer step (`apply`), or discards the gradients of a
  /// skipped one; either way the step is over.
  virtual void finish_step(bool apply) = 0;

  // ---- Steps decided on the device (train.overlap_step_reads). The loop
  // queues a step whole and reads its loss and gradient norm after the next
  // step is queued, so the host never waits for the device in between.

  /// Whether this engine can: the optimizer is the fused AdamW
  /// (optimizer.fused) and there are no companion models.
  virtual bool steps_on_device() const = 0;
  /// clip_grad_norm with the norm left on the device: a 0-dim float64 tensor.
  virtual at::Tensor clip_grad_norm_on_device(double max_norm) = 0;
  /// finish_step with the decision on the device: the step is applied unless
  /// `skip` (0-dim float32 on device(), 0 or 1) is 1. Returns the step's
  /// ticket for skipped_on_device().
  virtual int64_t finish_step_on_device(const at::Tensor& skip) = 0;
  /// The host has read that the step of `ticket` (one of the last few) was
  /// skipped: the optimizer's host-side step counts go back by one, as if
  /// finish_step(false) had been called for it.
  virtual void skipped_on_device(int64_t ticket) = 0;

  // ---- Whole-step CUDA graphs (train.cuda_graphs). A step whose work reads
  // the host only through device tensors is recorded once and replayed.

  /// "" when this engine's steps can be recorded in a graph on a CUDA
  /// device, else why not.
  virtual std::string graph_refusal() const = 0;
  /// Before each graph step, recorded or replayed, outside the recording:
  /// waits for a background save's copy. From the first call on, gradients
  /// are zeroed in place and never dropped, so the graph's stay the model's.
  virtual void prepare_graph_step() = 0;
  /// The step's device work, to be recorded: gradients zeroed; forward and
  /// backward of `batches` (tensors on device()), each loss multiplied by
  /// `scale` (0-dim float64: 1 / the step's target units); the norm clipped
  /// to `max_norm`; the optimizer step with learning rate `lr` (0-dim
  /// float32), skipped on the device when the loss or the norm is not finite.
  /// Reads nothing back.
  virtual GraphStep queue_graph_step(Objective& objective, const std::vector<Batch>& batches, const at::Tensor& scale,
                                     const at::Tensor& lr, double max_norm) = 0;
  /// The host's count of one run of the recorded step (the optimizer's step
  /// counts); returns its ticket for skipped_on_device().
  virtual int64_t count_graph_step() = 0;
  /// A recording that failed: its optimizer step is forgotten.
  virtual void abandon_graph_step() = 0;

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
  /// The policy's trained parameters' gradients (as the optimizer sees them).
  virtual std::vector<at::Tensor> gradients() = 0;

  /// Bytes this process holds now (memory/... metrics).
  virtual Metrics memory() = 0;

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

  /// Saves checkpoint-<state.step> in `output_dir` atomically (a folder of
  /// that name is complete or absent): the model in HF layout (or its
  /// shards), the optimizer, the RNG and `state`; keeps the newest
  /// `keep_last` (0 = all). Returns its folder.
  /// It returns at once: a background thread copies the state into host
  /// memory while the next step's forward and backward run, then writes and
  /// publishes the folder (collect_save). finish_step and set_parameters
  /// wait for that copy, so change the parameters only through them. A save
  /// first waits for the previous write: one at most is in flight. In a
  /// sharded run the save is a collective (every rank calls it): the
  /// consolidated model is gathered at the save, each rank's thread writes
  /// its shard, and rank 0's publishes the folder once every rank's is
  /// written. Under ANVIL_CHECKPOINT_SYNC=1 every save is written at once.
  virtual std::filesystem::path save(const std::filesystem::path& output_dir, const io::TrainerState& state,
                                     const tokenizer::Tokenizer* tokenizer, const std::string& config_yaml,
                                     int64_t keep_last) = 0;
  /// Since the last call: time/checkpoint_stall_s, the seconds saves blocked
  /// the loop (save() itself and the waits for a background copy), when a
  /// save happened; time/checkpoint_write_s, the duration of a background
  /// write that was published. With `wait`, after waiting for the write in
  /// flight. Throws the CheckpointError of a write that failed, naming the
  /// checkpoint. A run waits before it ends.
  virtual Metrics collect_save(bool wait) = 0;

 protected:
  virtual void gather() = 0;
  virtual void release() = 0;
  virtual void begin_evaluation() { gather(); }
  virtual void end_evaluation() { release(); }
};

}  // namespace anvil::train
