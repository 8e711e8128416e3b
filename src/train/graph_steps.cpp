#include "train/graph_steps.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <functional>
#include <sstream>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "generation/step_graph.h"

namespace anvil::train {

namespace gd = generation::detail;

struct GraphSteps::Graph {
  std::unique_ptr<gd::StepGraph> graph;  // made only for a real recording (it initialises CUDA)
  std::function<void()> emulated;        // ANVIL_TEST_CUDA_GRAPHS=emulate: called at each replay instead
};

bool GraphSteps::emulated() {
  static const bool on = [] {
    const char* v = std::getenv("ANVIL_TEST_CUDA_GRAPHS");
    return v && std::string(v) == "emulate";
  }();
  return on;
}

GraphSteps::GraphSteps(Engine& engine, Objective& objective, const std::string& mode, const std::string& refusal,
                       double max_norm, int64_t warmup_steps)
    : engine_(engine), objective_(objective), max_norm_(max_norm), warmup_(warmup_steps) {
  if (mode == "off") return;
  auto why = refusal;
  if (why.empty() && !gd::StepGraph::built() && !emulated()) why = "this build has no CUDA graphs";
  if (!why.empty()) {
    if (mode == "on")
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
  if (!warming() || !engine_.device().is_cuda()) return nullptr;
  return std::make_shared<gd::SideStream>(engine_.device(), &stream_);
}

void GraphSteps::fill(const std::vector<Batch>& batches, int64_t step_targets, double lr) {
  const auto device = engine_.device();
  if (inputs_.empty()) {
    for (const auto& b : batches) {
      Batch in;
      for (const auto& [key, t] : b.tensors) in.tensors[key] = at::empty(t.sizes(), t.options().device(device));
      inputs_.push_back(std::move(in));
    }
    scale_ = at::empty({}, at::TensorOptions().dtype(at::kDouble).device(device));
    lr_ = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  // Queued behind the previous step: the copies go through pinned memory (to_device), the scalars are fills.
  for (size_t i = 0; i < batches.size(); ++i) {
    inputs_[i].num_targets = batches[i].num_targets;
    inputs_[i].num_tokens = batches[i].num_tokens;
    for (const auto& [key, t] : batches[i].tensors) inputs_[i].tensors.at(key).copy_(to_device(t, device), true);
  }
  scale_.fill_(step_targets > 0 ? 1.0 / static_cast<double>(step_targets) : 0.0);
  lr_.fill_(lr);
}

bool GraphSteps::record(int64_t step) {
  engine_.prepare_graph_step();
  graph_ = std::make_unique<Graph>();
  const auto step_fn = [this] { out_ = engine_.queue_graph_step(objective_, inputs_, scale_, lr_, max_norm_); };
  if (emulated()) {
    graph_->emulated = step_fn;
    return true;
  }
  std::string why;
  bool ok = false;
  graph_->graph = std::make_unique<gd::StepGraph>();
  {
    gd::SideStream side(engine_.device(), &stream_);  // a graph is never recorded on the default stream
    ok = graph_->graph->capture(step_fn, &why, /*default_rng=*/true);
  }
  if (ok) return true;
  engine_.abandon_graph_step();
  graph_.reset();
  inputs_.clear();
  out_ = {};
  active_ = false;
  log::warn("train.cuda_graphs: step ", step, " could not be recorded (", why, "); every step runs eagerly");
  return false;
}

std::optional<GraphedStep> GraphSteps::run(int64_t step, const std::vector<Batch>& batches, int64_t step_targets,
                                           double lr) {
  if (!active_ || batches.empty()) return std::nullopt;
  const auto sig = shapes(batches);
  if (!recorded_) {
    if (seen_ < warmup_) {
      ++seen_;
      return std::nullopt;
    }
    fill(batches, step_targets, lr);
    if (!record(step)) return std::nullopt;
    shapes_ = sig;
    recorded_ = true;
    log::info("train.cuda_graphs: step ", step, " recorded as one CUDA graph; later steps of its shapes replay it");
  } else if (sig != shapes_) {
    if (!said_shapes_)
      log::info("train.cuda_graphs: step ", step,
                "'s batches differ in shape from the recorded step's; such steps run eagerly");
    said_shapes_ = true;
    return std::nullopt;
  } else {
    fill(batches, step_targets, lr);
  }
  engine_.prepare_graph_step();
  if (graph_->emulated)
    graph_->emulated();
  else
    graph_->graph->replay();
  GraphedStep g;
  // The graph's outputs are overwritten by the next replay: copies, queued behind this one.
  g.out = {out_.loss.clone(), out_.norm.clone(), out_.skip.clone()};
  g.ticket = engine_.count_graph_step();
  return g;
}

}  // namespace anvil::train
