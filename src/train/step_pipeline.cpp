#include "train/step_pipeline.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <limits>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "distributed/sharding.h"
#include "core/test_hooks.h"

namespace anvil::train {

StepPipeline::StepPipeline(const config::RunConfig& cfg, RunSetup& run, StepEngine& engine, Objective& objective,
                           int64_t resumed_micro_batch)
    : cfg_(cfg),
      run_(run),
      engine_(engine),
      objective_(objective),
      injected_(test_hooks::nonfinite_steps()),
      auto_parts_(run.auto_micro_batch ? 1 : 0) {
  // train.micro_batch_size: auto continues from the micro-batch its checkpoint recorded.
  if (auto_parts_ > 0 && resumed_micro_batch > 0) {
    while (auto_rows() > resumed_micro_batch && auto_rows() > 1) auto_parts_ *= 2;
    log::info("train.micro_batch_size: auto: micro-batches of ", auto_rows(), " rows, as the checkpoint recorded");
  }
  // On CUDA only when asked: overlapped reads have not run on a GPU yet (train.unverified_cuda).
  overlap_ = cfg_.train.overlap_step_reads && (!engine_.device().is_cuda() || unverified_cuda_allowed()) &&
             (run_.ranks.world == 1 || run_.comm) && engine_.steps_on_device() &&
             objective_.step_needs().reads != Objective::StepReads::at_once;
  graphs_ =
      std::make_unique<GraphSteps>(engine_, objective_, cfg_.train.cuda_graphs, graph_refusal(), cfg_.train.grad_clip);
}

int64_t StepPipeline::auto_rows() const {
  return auto_parts_ > 0 ? (run_.micro_batch_size + auto_parts_ - 1) / auto_parts_ : 0;
}

/// Why this run's steps cannot be recorded as CUDA graphs ("" when they can).
std::string StepPipeline::graph_refusal() const {
  if (!engine_.device().is_cuda() && !GraphSteps::emulated()) return concat("the device is ", engine_.device().str());
  if (auto_parts_ > 0) return "train.micro_batch_size is auto (a step that runs out of memory runs again, split)";
  if (auto why = engine_.graph_refusal(); !why.empty()) return why;
  if (!overlap_)
    return "each step is read before the next is queued (train.overlap_step_reads, and on CUDA "
           "train.unverified_cuda)";
  if (run_.ranks.world > 1) return "several ranks train";
  if (engine_.model().num_experts() > 0) return "a mixture of experts routes tokens by their values";
  if (!objective_.step_needs().replayable) return concat("algorithm ", cfg_.algorithm, " reads its steps on the host");
  return "";
}

/// The step's forwards and backwards. Under train.micro_batch_size: auto each batch is cut into auto_parts_
/// micro-batches (the step's targets normalise the loss, so the math is the same); a step that runs out of
/// device memory halves them, doubling the accumulation, and runs again from its start (llm-foundry's
/// device_train_microbatch_size: auto).
StepStats StepPipeline::fit_backward(int64_t step, const std::vector<Batch>& batches, int64_t targets) {
  if (auto_parts_ == 0) return engine_.backward(objective_, batches, targets, /*read_loss=*/false);
  while (true) {
    std::vector<Batch> parts;
    if (auto_parts_ > 1)
      for (const auto& b : batches)
        for (auto& p : objective_.split_rows(b, auto_parts_)) parts.push_back(std::move(p));
    try {
      return engine_.backward(objective_, auto_parts_ > 1 ? parts : batches, targets, /*read_loss=*/false);
    } catch (const c10::OutOfMemoryError& e) {
      const int64_t rows = auto_rows();
      const std::string what = e.what_without_backtrace();
      if (rows <= 1)
        throw ConfigError(
            concat("train.micro_batch_size: auto: step ", step,
                   " runs out of device memory with micro-batches of 1 row: ", what.substr(0, what.find('\n'))));
      auto_parts_ *= 2;
      release_cached_memory(engine_.device());
      const bool here = dynamic_cast<const distributed::PeerOutOfMemory*>(&e) == nullptr;
      log::warn("train.micro_batch_size: auto: step ", step, " ran out of device memory",
                run_.ranks.world > 1 ? (here ? " on this rank" : " on another rank") : "", " with micro-batches of ",
                rows, " rows; running it again with ", auto_rows(), " (", run_.micro_per_step * auto_parts_,
                " micro-batches per step, the same samples)");
    }
  }
}

/// On a device that runs ops as they are queued (the CPU), a queued step
/// has finished once queue() returns; its read, after the next step ran,
/// would end its wall time a step late. Elsewhere the step is known finished
/// once it is read.
void StepPipeline::mark_done_if_run(QueuedStep& q) const {
  if (engine_.device().is_cpu()) q.done = std::chrono::steady_clock::now();
}

QueuedStep StepPipeline::queue(int64_t step, const std::vector<Batch>& batches, int64_t targets, int64_t tokens,
                               double lr, bool stop_now) {
  QueuedStep q;
  q.step = step;
  q.lr = lr;
  q.targets = targets;
  q.tokens = tokens;
  q.t0 = std::chrono::steady_clock::now();
  engine_.set_lr(lr);
  // A step of the recorded shapes replays the CUDA graph (clipping, the skip and the optimizer step
  // included); steps with an injected fault run eagerly.
  if (graphs_->active() && !injected_.count(step)) {
    if (auto g = graphs_->run(step, batches, targets, lr)) {
      q.graphed = true;
      q.stats.num_targets = targets;
      q.stats.num_tokens = tokens;
      q.stats.loss_tensor = g->out.loss;
      q.norm = g->out.norm;
      q.ticket = g->ticket;
      stop_ = stop_ || stop_now;  // one rank: nothing to reduce
      mark_done_if_run(q);
      return q;
    }
    q.side = graphs_->warmup_stream();
  }
  // The loss stays on the device, read with the whole step.
  q.stats = fit_backward(step, batches, targets);
  if (const auto it = injected_.find(step); it != injected_.end()) {
    at::NoGradGuard no_grad;
    if (it->second == "grad")
      engine_.gradients().front().fill_(NAN);
    else if (run_.lead)  // rank 0's loss only: the ranks agree through the reduction
      q.stats.loss_tensor = q.stats.loss_tensor + std::numeric_limits<double>::infinity();
  }
  q.norm = engine_.clip_grad_norm_on_device(cfg_.train.grad_clip);
  auto loss = q.stats.loss_tensor.to(q.norm.device(), at::kDouble).reshape({});
  if (run_.ranks.world > 1 || run_.mesh) {  // a tensor-parallel group shares its stop flag too
    // One reduction on the device for the loss, the stop flag and the objective's sums, read with the
    // step: every rank then takes the same decisions (overlapped, the stop one step later than on one process).
    std::vector<at::Tensor> parts = {loss, at::full({}, stop_now ? 1.0 : 0.0, loss.options())};
    for (const auto& [key, t] : q.stats.sums) parts.push_back(t.to(loss.device(), at::kDouble).reshape({}));
    q.reduced = at::stack(parts);
    run_.comm->all_reduce_sum(q.reduced, "step statistics");
    // Over every rank, so a stop reaches each; the ranks of a tensor-parallel group hold the same statistics,
    // counted once (a power of two divides exactly).
    if (run_.mesh) q.reduced.div_(static_cast<double>(run_.mesh->layout.tp()));
    loss = q.reduced[0];
  } else {
    stop_ = stop_ || stop_now;
  }
  // The norm is global, the loss summed over ranks: every rank skips alike. Read late, the fused AdamW skips on
  // the device; read at once (and for an engine that cannot skip there), the flag is read now and the step
  // applied or skipped at once.
  const auto skip = at::logical_not(at::isfinite(loss).logical_and(at::isfinite(q.norm))).to(at::kFloat);
  q.ticket = engine_.finish_step_on_device(skip, /*read_late=*/overlap_);
  q.side.reset();  // a warm-up step: the loop's stream waits for it
  mark_done_if_run(q);
  return q;
}

bool StepPipeline::read(QueuedStep& q) {
  // [norm, loss, stop flag (several ranks), sums...]
  std::vector<at::Tensor> values = {q.norm.to(at::kDouble).reshape({1})};
  if (q.reduced.defined()) {
    values.push_back(q.reduced);
  } else {
    values.push_back(q.stats.loss_tensor.to(q.norm.device(), at::kDouble).reshape({1}));
    for (const auto& [key, t] : q.stats.sums) values.push_back(t.to(q.norm.device(), at::kDouble).reshape({1}));
  }
  const auto host = at::cat(values).cpu();
  const double* v = host.data_ptr<double>();
  q.norm_value = v[0];
  q.loss_value = v[1];
  size_t i = 2;
  if (q.reduced.defined() && v[i++] > 0) stop_ = true;
  for (auto& [key, t] : q.stats.sums) t = at::scalar_tensor(v[i++], at::kDouble);
  q.companions = engine_.step_metrics();
  q.read = true;
  const bool applied = std::isfinite(q.loss_value) && std::isfinite(q.norm_value);
  if (!applied) engine_.skipped_on_device(q.ticket);
  return applied;
}

}  // namespace anvil::train
