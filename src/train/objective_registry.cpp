// The algorithm registry. Every objective registers itself here through
// register_objective, as a linking program does; the built-in ones from the
// list below, in its order (that of --help and the config reference), each
// from its own file under objectives/.
#include <map>
#include <mutex>

#include "anvil/core/error.h"
#include "anvil/train/objective.h"

namespace anvil::train {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ObjectiveFactory> factories;
  std::map<std::string, std::pair<std::string, std::function<int64_t(const config::RunConfig&)>>> side_ranks;
};

Registry& registry() {
  static Registry r;
  return r;
}

void add_objective(const std::string& name, ObjectiveFactory factory, const std::vector<std::string>* reads) {
  if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw ConfigError(concat("register_objective: \"", name, "\": expected a name of a-z, 0-9 and _"));
  if (!factory) throw ConfigError(concat("register_objective: ", name, ": no factory given"));
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.factories.count(name)) throw ConfigError(concat("algorithm \"", name, "\" is already registered"));
  if (reads)
    config::add_algorithm_name(name, *reads);
  else
    config::add_algorithm_name(name);
  r.factories.emplace(name, std::move(factory));
}

}  // namespace

// Each built-in objective's registration, in its own file under objectives/.
void register_lm_objectives();          // sft, pretrain (objectives/sft.cpp)
void register_preference_objectives();  // reward, dpo (objectives/preference/)
void register_ppo_objective();          // objectives/ppo/
void register_ilql_objective();         // objectives/ilql/
void register_kto_objective();          // objectives/kto/
void register_distill_objective();      // objectives/distill/

namespace {
// The built-in objectives, one line each.
const bool kBuiltinsRegistered = [] {
  register_lm_objectives();
  register_preference_objectives();
  register_ppo_objective();
  register_ilql_objective();
  register_kto_objective();
  register_distill_objective();
  return true;
}();
}  // namespace

std::vector<Batch> Objective::split_rows(const Batch&, int64_t) const {
  throw ConfigError(concat("algorithm ", name(), " cannot split its micro-batches (train.micro_batch_size: auto)"));
}

void register_objective(const std::string& name, ObjectiveFactory factory) {
  add_objective(name, std::move(factory), nullptr);
}

void register_objective(const std::string& name, ObjectiveFactory factory, const std::vector<std::string>& reads) {
  add_objective(name, std::move(factory), &reads);
}

void Objective::serve(models::CausalLM&, const SideContext&) {
  throw ConfigError(concat("algorithm ", name(), " keeps no ranks apart from training"));
}

void register_side_ranks(const std::string& name, const std::string& key,
                         std::function<int64_t(const config::RunConfig&)> count) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.count(name))
    throw ConfigError(concat("register_side_ranks: algorithm \"", name, "\" is not registered"));
  r.side_ranks[name] = {key, std::move(count)};
}

SideRanks side_ranks(const config::RunConfig& cfg) {
  std::pair<std::string, std::function<int64_t(const config::RunConfig&)>> found;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.side_ranks.find(cfg.algorithm);
    if (it == r.side_ranks.end()) return {};
    found = it->second;
  }
  return {found.second(cfg), found.first};
}

std::unique_ptr<Objective> make_objective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                          const chat::ChatTemplate& chat) {
  ObjectiveFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(cfg.algorithm);
    if (it == r.factories.end()) throw ConfigError(concat("algorithm: unknown algorithm \"", cfg.algorithm, "\""));
    factory = it->second;
  }
  auto objective = factory(cfg, tok, chat);
  if (!objective) throw ConfigError(concat("algorithm: ", cfg.algorithm, ": its factory built no objective"));
  return objective;
}

}  // namespace anvil::train
