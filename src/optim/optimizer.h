#pragma once
// Building the optimizer from config and setting its learning rate.

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "anvil/config/config.h"

namespace anvil::optim {

/// AdamW with torch's fused multi-tensor kernel (`_fused_adamw_`, CPU and
/// CUDA): one pass over parameters, gradients and moments per step instead of
/// a dozen element-wise ops per tensor. Same state as torch::optim::AdamW, so
/// checkpoints move freely between the two; results agree to float round-off.
class FusedAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;

  /// The dtype of the moments of float32 parameters (optimizer.state_dtype):
  /// float32 (torch's), or bfloat16, whose parameters step through
  /// step_with_low_precision_state. Moments of another dtype (a checkpoint
  /// written with the other setting) are converted at the next step.
  void set_state_dtype(at::ScalarType dtype);
  at::ScalarType state_dtype() const { return state_dtype_; }
  /// The dtype this optimizer keeps `p`'s moments in.
  at::ScalarType moment_dtype(const at::Tensor& p) const {
    return p.scalar_type() == at::kFloat ? state_dtype_ : p.scalar_type();
  }

  /// The next step() leaves everything as it was where `skip` (a 0-dim
  /// float32 tensor on the parameters' device) is 1: the kernel's found_inf,
  /// as torch.amp's GradScaler uses it, so the decision never leaves the
  /// device. Returns that step's number among this optimizer's steps, for
  /// take_back().
  int64_t skip_next_if(const at::Tensor& skip);
  /// The host learned that step `call` (skip_next_if's number) was skipped:
  /// the state's step counts of the parameters it stepped go back by one (the
  /// device's counters already did). Only the last few steps can be taken back.
  void take_back(int64_t call);

  /// One step split in two for whole-step CUDA graphs (train.cuda_graphs):
  /// the device's work, which a graph records once and replays, and the
  /// host's count of it, made after every replay. queue_step + count_step =
  /// step() after skip_next_if(skip), with the learning rate read from `lr`.
  struct Queued {
    std::vector<const void*> keys;  // the parameters it steps
    bool counters_rebuilt = false;  // a step counter was (re)made from the host's count: not replayable
    bool skippable = false;         // the step reads a skip flag (take_back() may follow)
  };
  /// Queues the step's device work: the learning rate from `lr` (0-dim
  /// float32 on the parameters' device), skipped where `skip` (0-dim float32)
  /// is 1. The host's step counts are left as they were.
  Queued queue_step(const at::Tensor& lr, const at::Tensor& skip);
  /// The host's count of one run of `q`'s work; returns its step number, for take_back().
  int64_t count_step(const Queued& q);
  /// A queued step that never ran (its recording failed): the next step reads no skip flag.
  void forget_queued() { skip_ = at::Tensor(); }

 private:
  /// The device work of one step: lr (a tensor) when defined, else each group's.
  Queued launch(const at::Tensor& lr);
  /// The kernel's step counters, kept on the parameters' device and advanced
  /// in one launch per group; rebuilt from the state's count when it moved
  /// otherwise (a loaded checkpoint).
  struct DeviceStep {
    int64_t count = -1;
    at::Tensor value;
  };
  std::unordered_map<const void*, DeviceStep> device_steps_;
  at::Tensor skip_;  // for the next step only
  int64_t calls_ = 0;
  at::ScalarType state_dtype_ = at::kFloat;
  /// The parameters each of the last few steps advanced, by step number.
  std::map<int64_t, std::vector<const void*>> stepped_;
};

/// One AdamW step of a float32 parameter `p` whose moments `exp_avg` and
/// `exp_avg_sq` are kept in bfloat16: the update of torch's fused AdamW,
/// computed in float32, and the moments stored back with stochastic rounding
/// (round up with probability equal to the dropped fraction), so small
/// updates to a moment, which round-to-nearest would drop, survive on
/// average. `step` is this step's number (1 for the first). On the CPU one
/// pass per element whose random bits come from one draw of the default
/// generator; elsewhere by_tensor_ops.
void adamw_step_low_precision_state(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg,
                                    const at::Tensor& exp_avg_sq, int64_t step, double lr, double beta1, double beta2,
                                    double weight_decay, double eps);
/// The same from tensor operations (CUDA's path): torch's fused AdamW kernel
/// on float32 copies of the moments, a chunk of 2^20 elements at a time (the
/// working copies alive are a chunk's, about 20 MB, not the parameter's),
/// then one 32-bit draw per element from the device's default generator
/// rounds both moments.
void adamw_step_low_precision_state_by_tensor_ops(const at::Tensor& p, const at::Tensor& grad,
                                                  const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t step,
                                                  double lr, double beta1, double beta2, double weight_decay,
                                                  double eps);
/// `value` (float32) stored into `dst` (bfloat16, same size) with stochastic rounding.
void store_stochastically_rounded(const at::Tensor& dst, const at::Tensor& value);

/// The dtype `optimizer` keeps `p`'s AdamW moments in (a checkpoint's
/// moments are converted to it as they are read).
at::ScalarType moment_dtype(const torch::optim::Optimizer& optimizer, const at::Tensor& p);

/// AdamW over `params`, with optimizer.weight_decay on all of them.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params);
/// AdamW with two parameter groups: `decayed` with optimizer.weight_decay,
/// `not_decayed` with none (an empty group is left out).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& decayed,
                                                        const std::vector<at::Tensor>& not_decayed);

/// Whether weight decay applies to `module`'s parameter `name` (its full
/// dotted name), as transformers' Trainer and TRL decide
/// (`Trainer.get_decay_parameter_names`): not to a torch LayerNorm's
/// parameters, nor to any whose lower-cased name matches `bias`, `layernorm`,
/// `rmsnorm`, `(^|\.)norm($|\.)` or `_norm($|\.)`. With
/// optimizer.decay_biases_and_norms, to every parameter.
bool decays(const config::OptimizerConfig& c, const std::string& name, const torch::nn::Module& owner);

/// The full names of the parameters of `model` that decays() exempts.
std::vector<std::string> no_decay_parameters(const config::OptimizerConfig& c, const torch::nn::Module& model);

void set_lr(torch::optim::Optimizer& opt, double lr);

/// Global L2 norm of the gradients of `params`, clipped to `max_norm` when
/// larger (0 = only measure): torch's clip_grad_norm_ (coefficient
/// max_norm / (norm + 1e-6), applied when below 1) in a few fused launches,
/// the coefficient staying on the device; the norm is returned unread (a
/// 0-dim float64 tensor on the device).
at::Tensor clip_or_measure(const std::vector<at::Tensor>& params, double max_norm);

/// The AdamW state the optimizer holds for parameter `p`, or nullptr before its first step.
torch::optim::AdamWParamState* adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& p);

}  // namespace anvil::optim
