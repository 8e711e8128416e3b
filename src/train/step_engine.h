#pragma once
// Internal (not installed): what the loop asks of an engine beyond the public
// Engine (anvil/train/engine.h): the optimizer and its learning rate,
// accumulation, clipping and the optimizer step decided on the device
// (StepPipeline), whole-step CUDA graphs (GraphSteps), memory figures and
// checkpoints. make_engine (engine_setup.h) builds one.

#include <torch/optim/optimizer.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/engine.h"

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

/// What a sharded run adds around each micro-batch.
struct AccumulateOptions {
  /// Target units of the whole step over all ranks; 0 = those of `batches`.
  int64_t step_targets = 0;
  /// Ranks whose gradients are summed into the step (the load-balancing
  /// loss of a mixture of experts is averaged over them).
  int64_t world = 1;
  /// Called before each backward; `last` on the final micro-batch.
  std::function<void(bool last)> before_backward;
  std::function<void()> after_backward;
  /// Read StepStats::loss from the device at the end (a wait for it); false
  /// leaves only StepStats::loss_tensor.
  bool read_loss = true;
  /// When defined, 0-dim float64 on the device: 1 / the step's target units,
  /// used instead of step_targets, so that a recorded step (a CUDA graph)
  /// replays with each step's value.
  at::Tensor scale;
};

/// Forward + backward over one optimizer step's micro-batches. Each
/// micro-batch's summed loss is divided by the target count of the whole step,
/// so accumulating N micro-batches equals one batch of all their samples.
StepStats accumulate_gradients(Objective& objective, models::CausalLM& model, const std::vector<Batch>& batches,
                               const AccumulateOptions& options = {});

class StepEngine : public Engine {
 public:
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
  /// `max_norm` when larger (0: only measured), left on the device: a 0-dim
  /// tensor. A companion model's norm is measured and clipped on its own; a
  /// non-finite one makes the returned norm NaN (the step is skipped).
  virtual at::Tensor clip_grad_norm_on_device(double max_norm) = 0;
  /// Metrics of the last clipping beyond the policy's: each companion
  /// model's "<name>/grad_norm" (a read from the device).
  virtual Metrics step_metrics() const = 0;

  // ---- The step's decision. StepPipeline queues a step whole and reads its
  // loss and gradient norm later (after the next step is queued when steps
  // are read late), so the host need not wait for the device in between.

  /// Whether the decision can stay on the device: the optimizer is the fused
  /// AdamW (optimizer.fused) and there are no companion models.
  virtual bool steps_on_device() const = 0;
  /// Applies the optimizer step unless `skip` (0-dim float32, 0 or 1) is 1;
  /// either way the step is over. With `read_late` (the step is read after
  /// the next one is queued) and steps_on_device(), the decision stays on the
  /// device (inside the fused AdamW); otherwise `skip` is read here. Returns
  /// the step's ticket for skipped_on_device() (-1 when read here).
  virtual int64_t finish_step_on_device(const at::Tensor& skip, bool read_late) = 0;
  /// The host has read that the step of `ticket` (one of the last few) was
  /// skipped: the optimizer's host-side step counts go back by one, as if
  /// the step had been skipped on the host.
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

  /// The policy's trained parameters' gradients (as the optimizer sees them).
  virtual std::vector<at::Tensor> gradients() = 0;

  /// Bytes this process holds now (memory/... metrics).
  virtual Metrics memory() = 0;

  /// Saves checkpoint-<state.step> in `output_dir` atomically (a folder of
  /// that name is complete or absent): the model in HF layout (or its
  /// shards), the optimizer, the RNG and `state`; keeps the newest
  /// `keep_last` (0 = all). Returns its folder.
  /// It returns at once: a background thread copies the state into host
  /// memory while the next step's forward and backward run, then writes and
  /// publishes the folder (collect_save). The optimizer step and set_parameters
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
};

}  // namespace anvil::train
