#include "train/graph_steps.h"
#include "core/test_hooks.h"

#include <ATen/ATen.h>

#include <functional>
#include <sstream>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "core/step_graph.h"

namespace anvil::train {

struct GraphSteps::Graph {
  std::vector<Batch> inputs;         // the recorded step's batches, on the device
  GraphStep out;                     // its outputs, overwritten by each replay
  std::unique_ptr<StepGraph> graph;  // made only for a real recording (it initialises CUDA)
  std::function<void()> emulated;    // ANVIL_TEST_CUDA_GRAPHS=emulate: called at each replay instead
};

bool GraphSteps::emulated() { return test_hooks::emulate_cuda_graphs(); }

GraphSteps::GraphSteps(StepEngine& engine, Objective& objective, config::CudaGraphs mode, const std::string& refusal,
                       double max_norm, int64_t warmup_steps)
    : engine_(engine), objective_(objective), max_norm_(max_norm), warmup_(warmup_steps) {
  if (mode == config::CudaGraphs::kOff) return;
  auto why = refusal;
  if (why.empty() && !StepGraph::built() && !emulated()) why = "this build has no CUDA graphs";
  if (!why.empty()) {
    if (mode == config::CudaGraphs::kOn)
      throw ConfigError(concat("train.cuda_graphs: on, but ", why, "; set train.cuda_graphs to auto or off"));
    if (engine.device().is_cuda()) log::info("train.cuda_graphs: steps run eagerly: ", why);
    return;
  }
  active_ = true;
}

GraphSteps::~GraphSteps() = default;

std::string GraphSteps::shapes(const std::vector<Batch>& batches) const {
  std::ostringstream s;
  for (const auto& b : batches) {
    s << "|";
    for (const auto& [key, t] : b.tensors) s << key << ":" << t.sizes() << ":" << t.scalar_type() << ";";
  }
  return s.str();
}

std::shared_ptr<void> GraphSteps::warmup_stream() {
  if (!active_ || seen_ > warmup_ || !engine_.device().is_cuda()) return nullptr;
  return std::make_shared<SideStream>(engine_.device(), &stream_);
}

void GraphSteps::fill(Graph& g, const std::vector<Batch>& batches, int64_t step_targets, double lr) {
  const auto device = engine_.device();
  if (!scale_.defined()) {
    scale_ = at::empty({}, at::TensorOptions().dtype(at::kDouble).device(device));
    lr_ = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  if (g.inputs.empty())
    for (const auto& b : batches) {
      Batch in;
      for (const auto& [key, t] : b.tensors) in.tensors[key] = at::empty(t.sizes(), t.options().device(device));
      g.inputs.push_back(std::move(in));
    }
  // Queued behind the previous step: the copies go through pinned memory straight into the graph's buffers
  // (copy_to_device), the scalars are fills.
  for (size_t i = 0; i < batches.size(); ++i) {
    g.inputs[i].num_targets = batches[i].num_targets;
    g.inputs[i].num_tokens = batches[i].num_tokens;
    for (const auto& [key, t] : batches[i].tensors) copy_to_device(g.inputs[i].tensors.at(key), t);
  }
  scale_.fill_(step_targets > 0 ? 1.0 / static_cast<double>(step_targets) : 0.0);
  lr_.fill_(lr);
}

bool GraphSteps::record(Graph& g, int64_t step) {
  engine_.prepare_graph_step();
  const auto step_fn = [this, &g] { g.out = engine_.queue_graph_step(objective_, g.inputs, scale_, lr_, max_norm_); };
  if (emulated()) {
    g.emulated = step_fn;
    return true;
  }
  std::string why;
  bool ok = false;
  g.graph = std::make_unique<StepGraph>();
  {
    SideStream side(engine_.device(), &stream_);  // a graph is never recorded on the default stream
    ok = g.graph->capture(step_fn, &why, /*default_rng=*/true, first_ ? first_->graph.get() : nullptr);
  }
  if (ok) return true;
  engine_.abandon_graph_step();
  graphs_.clear();  // the graphs recorded before go too: every step runs eagerly from now on
  first_ = nullptr;
  active_ = false;
  log::warn("train.cuda_graphs: step ", step, " could not be recorded (", why, "); every step runs eagerly");
  return false;
}

std::optional<GraphedStep> GraphSteps::run(int64_t step, const std::vector<Batch>& batches, int64_t step_targets,
                                           double lr) {
  if (!active_ || batches.empty()) return std::nullopt;
  if (seen_ < warmup_) {
    ++seen_;
    return std::nullopt;
  }
  seen_ = warmup_ + 1;  // the warm-up is over: eager steps from now on run on the loop's stream
  const auto sig = shapes(batches);
  auto it = graphs_.find(sig);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      if (!said_full_)
        log::info("train.cuda_graphs: step ", step, " brings a ", kMaxGraphs + 1,
                  "th set of batch shapes; steps of shapes without a graph run eagerly (data.pad_to_multiple_of "
                  "makes fewer)");
      said_full_ = true;
      return std::nullopt;
    }
    auto g = std::make_unique<Graph>();
    fill(*g, batches, step_targets, lr);
    if (!record(*g, step)) return std::nullopt;
    log::info("train.cuda_graphs: step ", step, " recorded as CUDA graph ", graphs_.size() + 1,
              "; later steps of its shapes replay it");
    if (!first_) first_ = g.get();
    it = graphs_.emplace(sig, std::move(g)).first;
  } else {
    fill(*it->second, batches, step_targets, lr);
  }
  auto& g = *it->second;
  engine_.prepare_graph_step();
  if (g.emulated)
    g.emulated();
  else
    g.graph->replay();
  GraphedStep out;
  // The graph's outputs are overwritten by its next replay: copies, queued behind this one.
  out.out = {g.out.loss.clone(), g.out.norm.clone(), g.out.skip.clone()};
  out.ticket = engine_.count_graph_step();
  return out;
}

}  // namespace anvil::train
