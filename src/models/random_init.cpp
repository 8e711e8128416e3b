// A randomly initialised model built without storage, whose source replays
// the eager build's draws a parameter at a time (models/init.h).
#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"
#include "models/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace anvil::models {

namespace {

thread_local std::vector<ConstructionDraw>* recorded_draws = nullptr;

void draw(at::Tensor& t, bool normal, double a, double b, std::optional<at::Generator> generator) {
  if (normal)
    t.normal_(a, b, std::move(generator));
  else
    t.uniform_(a, b, std::move(generator));
}

// Each parameter's rule and shape, and for a drawn one the generator's state before its draw.
class RandomInitSource : public ParameterSource {
 public:
  struct Entry {
    ParameterInit init;
    std::vector<int64_t> shape;
    at::Tensor state;  // undefined unless init.draws
  };
  explicit RandomInitSource(std::map<std::string, Entry> entries) : entries_(std::move(entries)) {}

  at::Tensor read(const std::string& name, int64_t begin, int64_t count) const override {
    const auto it = entries_.find(name);
    if (it == entries_.end()) throw Error(concat("random initialisation: no parameter named ", name));
    const auto& e = it->second;
    auto whole = at::empty(e.shape, at::kFloat);
    std::optional<at::Generator> generator;
    if (e.init.draws) {
      generator = at::make_generator<at::CPUGeneratorImpl>();
      generator->set_state(e.state);
    }
    apply_parameter_init(e.init, whole, std::move(generator));
    return whole.view(-1).narrow(0, begin, count);
  }

 private:
  std::map<std::string, Entry> entries_;
};

}  // namespace

void note_skipped_draw(const ConstructionDraw& d) {
  if (recorded_draws) recorded_draws->push_back(d);
}

void apply_parameter_init(const ParameterInit& init, at::Tensor& t, std::optional<at::Generator> generator) {
  at::NoGradGuard no_grad;
  if (init.draws)
    t.normal_(0.0, init.value, std::move(generator));
  else
    t.fill_(init.value);
  if (init.zero_row >= 0) t.select(0, init.zero_row).zero_();
}

void init_parameters(CausalLM& model) {
  for (auto& p : model.named_parameters()) {
    const auto init = model.parameter_init(p.key());
    if (!init) throw Error(concat("init_parameters: the ", model.family(), " family gives ", p.key(), " no rule"));
    apply_parameter_init(*init, p.value());
  }
}

std::shared_ptr<CausalLM> build_deferred_random(const std::function<std::shared_ptr<CausalLM>()>& build,
                                                const at::Device& device) {
  auto generator = at::detail::getDefaultCPUGenerator();
  const auto state = [&] {
    std::scoped_lock lock(generator.mutex());
    return generator.get_state();
  };
  const auto start = state();
  std::vector<ConstructionDraw> draws;
  std::shared_ptr<CausalLM> model;
  {
    DeferredInitGuard deferred(device);
    auto* previous = recorded_draws;
    recorded_draws = &draws;
    try {
      model = build();
    } catch (...) {
      recorded_draws = previous;
      throw;
    }
    recorded_draws = previous;
  }
  // Every parameter needs a rule and no storage; a module that drew while being built (a LibTorch one) moved the
  // generator out of the replay's order.
  std::map<std::string, RandomInitSource::Entry> entries;
  std::vector<std::string> order;
  int64_t largest = 0;
  for (const auto& p : model->named_parameters()) {
    const auto init = model->parameter_init(p.key());
    if (!init || !is_deferred(p.value())) {
      std::scoped_lock lock(generator.mutex());
      generator.set_state(start);
      return nullptr;
    }
    entries[p.key()] = {*init, p.value().sizes().vec(), {}};
    order.push_back(p.key());
    largest = std::max(largest, p.value().numel());
  }
  for (const auto& d : draws) largest = std::max(largest, d.numel);
  // The eager build's draws, in its order: the layers' at construction, then init_parameters' (their values are
  // dropped; the generator's state before each parameter's is what a read starts from).
  at::NoGradGuard no_grad;
  auto scratch = at::empty({largest}, at::kFloat);
  for (const auto& d : draws) {
    auto part = scratch.narrow(0, 0, d.numel);
    draw(part, d.normal, d.a, d.b, std::nullopt);
  }
  for (const auto& name : order) {
    auto& e = entries.at(name);
    if (!e.init.draws) continue;
    e.state = state();
    int64_t numel = 1;
    for (const auto s : e.shape) numel *= s;
    auto part = scratch.narrow(0, 0, numel);
    draw(part, true, 0.0, e.init.value, std::nullopt);
  }
  model->parameter_source = std::make_shared<RandomInitSource>(std::move(entries));
  return model;
}

}  // namespace anvil::models
