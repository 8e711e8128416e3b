// Rewards of sampled responses (response_rewards.h) and the registry of
// reward functions (register_reward_function).
#include "train/response_rewards.h"

#include <map>
#include <mutex>
#include <regex>

#include "anvil/core/error.h"
#include "anvil/core/logging.h"
#include "anvil/rewards/reward_model.h"
#include "anvil/rewards/reward_program.h"

namespace anvil::train {
namespace {

std::mutex& reward_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, RewardFn>& reward_functions() {
  static std::map<std::string, RewardFn> fns;
  return fns;
}

RewardFn find_reward_function(const std::string& name, const std::string& key) {
  std::lock_guard<std::mutex> lock(reward_mutex());
  const auto it = reward_functions().find(name);
  if (it == reward_functions().end()) {
    std::string known;
    for (const auto& [k, v] : reward_functions()) known += concat(known.empty() ? "" : ", ", k);
    throw ConfigError(concat(key, ".function: no reward function \"", name, "\" is registered",
                             known.empty() ? std::string(" (none is)") : concat(" (registered: ", known, ")")));
  }
  return it->second;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string field_text(const nlohmann::json& record, const std::string& field, const std::string& key,
                       const std::string& where) {
  if (!record.contains(field) || record[field].is_null())
    throw DataError(
        concat(where, ": ", key, " compares the response with field \"", field, "\", which this record lacks"));
  return record[field].is_string() ? record[field].get<std::string>() : record[field].dump();
}

}  // namespace

void register_reward_function(const std::string& name, RewardFn fn) {
  if (name.empty()) throw ConfigError("register_reward_function: expected a name");
  if (!fn) throw ConfigError(concat("register_reward_function: ", name, ": no function given"));
  std::lock_guard<std::mutex> lock(reward_mutex());
  if (!reward_functions().emplace(name, std::move(fn)).second)
    throw ConfigError(concat("reward function \"", name, "\" is already registered"));
}

/// One reward source of a section (or of one ppo.rewards item).
struct ResponseRewards::Source {
  config::PpoRewardConfig config;
  std::string key;
  double weight = 1;
  std::string name;
  RewardFn fn;
  FrozenModel frozen;
  std::unique_ptr<rewards::RewardModel> model;
  std::unique_ptr<rewards::RewardProgram> program;

  std::vector<double> score(const std::vector<const data::PromptSample*>& prompts,
                            const std::vector<RewardQuery>& queries) const;
};

namespace {

/// The name of the one source a section sets ("" when none), or a ConfigError
/// unless at most one is set.
std::string source_kind(const config::PpoRewardConfig& c, const std::string& key, bool required) {
  std::string kind;
  int sources = 0;
  for (const auto& [name, v] : {std::pair<const char*, const std::string*>{"model", &c.model},
                                {"command", &c.command},
                                {"exact_match", &c.exact_match},
                                {"regex", &c.regex},
                                {"function", &c.function}})
    if (!v->empty()) ++sources, kind = name;
  if (sources > 1 || (required && sources != 1))
    throw ConfigError(concat(key, ": expected ", required ? "exactly" : "at most",
                             " one of model, command, exact_match, regex or function, got ", sources));
  return kind;
}

}  // namespace

ResponseRewards::ResponseRewards(const config::PpoRewardConfig& config, std::string key, bool required)
    : ResponseRewards(config, std::move(key), {}, "", required) {}

ResponseRewards::ResponseRewards(const config::PpoRewardConfig& config, std::string key,
                                 const std::vector<config::WeightedRewardConfig>& list, const std::string& list_key,
                                 bool required) {
  auto add = [&](const config::PpoRewardConfig& c, const std::string& k, double weight, std::string name) {
    auto s = std::make_unique<Source>();
    s->config = c;
    s->key = k;
    s->weight = weight;
    s->name = std::move(name);
    if (!c.function.empty()) s->fn = find_reward_function(c.function, k);
    sources_.push_back(std::move(s));
  };
  if (list.empty()) {
    if (!source_kind(config, key, required).empty()) add(config, key, 1.0, "");
    return;
  }
  std::map<std::string, std::string> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto k = concat(list_key, "[", i, "]");
    const auto kind = source_kind(list[i], k, true);
    auto name = list[i].name.empty() ? concat(kind, "_", i) : list[i].name;
    if (const auto [it, fresh] = seen.emplace(name, k); !fresh)
      throw ConfigError(concat(k, ".name: \"", name, "\" is also ", it->second, "'s; each source needs its own"));
    add(list[i], k, list[i].weight, std::move(name));
  }
}

ResponseRewards::~ResponseRewards() = default;

bool ResponseRewards::is_exact_match() const {
  return sources_.size() == 1 && !sources_.front()->config.exact_match.empty();
}

std::vector<std::string> ResponseRewards::names() const {
  std::vector<std::string> out;
  if (sources_.size() > 1 || (sources_.size() == 1 && !sources_.front()->name.empty()))
    for (const auto& s : sources_) out.push_back(s->name);
  return out;
}

std::vector<FrozenModel::Gathered> ResponseRewards::gathered() {
  std::vector<FrozenModel::Gathered> out;
  for (auto& s : sources_) out.push_back(s->frozen.gathered());
  return out;
}

nlohmann::json program_record(const RewardQuery& q, const std::string& where, const std::string& key) {
  // The record as written, and the sample in an object of its own.
  auto rec = q.record.is_object() ? q.record : nlohmann::json::object();
  if (rec.contains("sample"))
    throw DataError(concat(where, ": the record has a field \"sample\", which ", key,
                           " uses for the sample (completion, prompt_text, ended); rename the field"));
  rec["sample"] = {{"completion", q.response}, {"prompt_text", q.prompt}, {"ended", q.ended}};
  // Programs written for the first schema read `prompt` and `response`: given where the record has none.
  if (!rec.contains("prompt")) rec["prompt"] = q.prompt;
  if (!rec.contains("response")) rec["response"] = q.response;
  return rec;
}

void ResponseRewards::prepare(const RunContext& ctx, const std::string& who) {
  for (auto& s : sources_) {
    const auto& c = s->config;
    if (!c.model.empty()) {
      auto rm = rewards::RewardModel::load(c.model, "", false, s->key + ".model");
      s->frozen = ctx.freeze(rm.model_ptr());
      s->model = std::make_unique<rewards::RewardModel>(std::move(rm));
      log::info(who, ": reward model ", c.model, " (", s->model->chat_template().name(), " format)");
    }
    if (!c.command.empty()) {
      s->program = std::make_unique<rewards::RewardProgram>(c.command, c.timeout_s, s->key + ".command");
      log::info(who, ": reward program \"", c.command, "\" started");
    }
  }
}

std::vector<double> ResponseRewards::score(const std::vector<const data::PromptSample*>& prompts,
                                           const std::vector<std::vector<int64_t>>& responses,
                                           const std::vector<bool>& ended, const tokenizer::Tokenizer& tok,
                                           std::vector<std::vector<double>>* components) {
  std::vector<RewardQuery> queries;
  for (size_t i = 0; i < responses.size(); ++i)
    queries.push_back({prompts[i]->prompt, tok.decode(responses[i]), prompts[i]->record, ended[i]});
  std::vector<double> out(queries.size(), 0.0);
  if (components) components->clear();
  const bool named = !names().empty();  // components are kept for named sources only
  for (const auto& s : sources_) {
    const auto part = s->score(prompts, queries);
    for (size_t i = 0; i < out.size(); ++i) out[i] += s->weight * part[i];
    if (components && named) components->push_back(part);
  }
  return out;
}

std::vector<double> ResponseRewards::Source::score(const std::vector<const data::PromptSample*>& prompts,
                                                   const std::vector<RewardQuery>& queries) const {
  const auto& r = config;
  std::vector<double> out(queries.size(), 0.0);
  if (!r.exact_match.empty() || !r.regex.empty()) {
    for (size_t i = 0; i < queries.size(); ++i) {
      const auto& where = prompts[i]->where;
      if (!r.exact_match.empty()) {
        out[i] = trim(queries[i].response) ==
                 trim(field_text(queries[i].record, r.exact_match, key + ".exact_match", where));
        continue;
      }
      const auto pattern = field_text(queries[i].record, r.regex, key + ".regex", where);
      try {
        out[i] = std::regex_search(queries[i].response, std::regex(pattern));
      } catch (const std::regex_error& e) {
        throw DataError(concat(where, ": ", key, ".regex: field \"", r.regex, "\" holds \"", pattern,
                               "\", which is not a valid regular expression (", e.what(), ")"));
      }
    }
  } else if (program) {
    std::vector<nlohmann::json> records;
    for (size_t i = 0; i < queries.size(); ++i)
      records.push_back(program_record(queries[i], prompts[i]->where, key + ".command"));
    out = program->score(records);
  } else if (fn) {
    out = fn(queries);
    if (out.size() != queries.size())
      throw Error(concat(key, ".function \"", r.function, "\" returned ", out.size(), " rewards for ", queries.size(),
                         " responses"));
  } else if (model) {
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = 0; i < queries.size(); ++i)
      ids.push_back(
          model->encode(prompts[i]->messages, prompts[i]->text_prompt, queries[i].response, prompts[i]->tools));
    const auto scores = model->score(ids, r.batch_size);
    out.assign(scores.begin(), scores.end());
  }
  return out;
}

}  // namespace anvil::train
