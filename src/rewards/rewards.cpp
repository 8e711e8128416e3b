// Reward sources behind one interface (rewards.h): exact match, regex, a
// program, a registered function and a reward model; their weighted sum; and
// the registry of reward functions.
#include "anvil/rewards/rewards.h"

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <regex>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "rewards/reward_model.h"
#include "rewards/reward_program.h"

namespace anvil::rewards {
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

/// 1 when the response, trimmed, equals the record's field, trimmed (RLVR).
class ExactMatchSource final : public RewardSource {
 public:
  ExactMatchSource(std::string field, std::string key) : field_(std::move(field)), key_(std::move(key)) {}
  std::string kind() const override { return "exact_match"; }
  std::string check(const chat::PromptSample& prompt, const RewardQuery& query) override {
    score({&prompt}, {query});
    return "";
  }
  std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                            const std::vector<RewardQuery>& queries) override {
    std::vector<double> out(queries.size(), 0.0);
    for (size_t i = 0; i < queries.size(); ++i)
      out[i] = trim(queries[i].response) ==
               trim(field_text(queries[i].record, field_, key_ + ".exact_match", prompts[i]->where));
    return out;
  }

 private:
  std::string field_, key_;
};

/// 1 when the response contains a match of the record's pattern (ECMAScript).
class RegexSource final : public RewardSource {
 public:
  RegexSource(std::string field, std::string key) : field_(std::move(field)), key_(std::move(key)) {}
  std::string kind() const override { return "regex"; }
  std::string check(const chat::PromptSample& prompt, const RewardQuery& query) override {
    score({&prompt}, {query});
    return "";
  }
  std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                            const std::vector<RewardQuery>& queries) override {
    std::vector<double> out(queries.size(), 0.0);
    for (size_t i = 0; i < queries.size(); ++i) {
      const auto& where = prompts[i]->where;
      const auto pattern = field_text(queries[i].record, field_, key_ + ".regex", where);
      try {
        out[i] = std::regex_search(queries[i].response, std::regex(pattern));
      } catch (const std::regex_error& e) {
        throw DataError(concat(where, ": ", key_, ".regex: field \"", field_, "\" holds \"", pattern,
                               "\", which is not a valid regular expression (", e.what(), ")"));
      }
    }
    return out;
  }

 private:
  std::string field_, key_;
};

/// A reward program, started at prepare().
class ProgramSource final : public RewardSource {
 public:
  ProgramSource(std::string command, double timeout_s, std::string key)
      : command_(std::move(command)), timeout_s_(timeout_s), key_(std::move(key)) {}
  std::string kind() const override { return "command"; }
  void prepare(const FreezeFn& /*freeze*/, const std::string& who) override {
    program_ = std::make_unique<RewardProgram>(command_, timeout_s_, key_ + ".command");
    log::info(who, ": reward program \"", command_, "\" started");
  }
  std::string check(const chat::PromptSample& prompt, const RewardQuery& query) override {
    const auto t0 = std::chrono::steady_clock::now();
    double reward = 0;
    {
      RewardProgram program(command_, timeout_s_, key_ + ".command");
      reward = program.score({program_record(query, prompt.where, key_ + ".command")}).front();
    }  // stopped: its stdin closed, waited for
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    return concat(key_, ".command \"", command_, "\" started, answered {\"reward\": ", reward, "} to ", prompt.where,
                  " with an empty reply and stopped, in ", std::lround(took.count() * 1000), " ms");
  }
  std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                            const std::vector<RewardQuery>& queries) override {
    if (!program_) throw Error(concat(key_, ".command: the reward program was not started (prepare)"));
    std::vector<nlohmann::json> records;
    for (size_t i = 0; i < queries.size(); ++i)
      records.push_back(program_record(queries[i], prompts[i]->where, key_ + ".command"));
    return program_->score(records);
  }

 private:
  std::string command_;
  double timeout_s_;
  std::string key_;
  std::unique_ptr<RewardProgram> program_;
};

/// A function a linking program registered.
class FunctionSource final : public RewardSource {
 public:
  FunctionSource(std::string name, std::string key)
      : name_(std::move(name)), key_(std::move(key)), fn_(find_reward_function(name_, key_)) {}
  std::string kind() const override { return "function"; }
  std::vector<double> score(const std::vector<const chat::PromptSample*>& /*prompts*/,
                            const std::vector<RewardQuery>& queries) override {
    auto out = fn_(queries);
    if (out.size() != queries.size())
      throw Error(concat(key_, ".function \"", name_, "\" returned ", out.size(), " rewards for ", queries.size(),
                         " responses"));
    return out;
  }

 private:
  std::string name_, key_;
  RewardFn fn_;
};

/// A reward model, loaded and frozen at prepare().
class ModelSource final : public RewardSource {
 public:
  ModelSource(std::string dir, int64_t batch_size, std::string key)
      : dir_(std::move(dir)), batch_size_(batch_size), key_(std::move(key)) {}
  std::string kind() const override { return "model"; }
  void prepare(const FreezeFn& freeze, const std::string& who) override {
    auto rm = RewardModel::load(dir_, "", false, key_ + ".model");
    if (freeze) frozen_ = freeze(rm.model_ptr());
    model_ = std::make_unique<RewardModel>(std::move(rm));
    log::info(who, ": reward model ", dir_, " (", model_->chat_template().name(), " format)");
  }
  std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                            const std::vector<RewardQuery>& queries) override {
    if (!model_) throw Error(concat(key_, ".model: the reward model was not loaded (prepare)"));
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = 0; i < queries.size(); ++i)
      ids.push_back(
          model_->encode(prompts[i]->messages, prompts[i]->text_prompt, queries[i].response, prompts[i]->tools));
    const auto scores = model_->score(ids, batch_size_);
    return {scores.begin(), scores.end()};
  }
  models::FrozenModel::Gathered gathered() override { return frozen_.gathered(); }

 private:
  std::string dir_;
  int64_t batch_size_;
  std::string key_;
  models::FrozenModel frozen_;
  std::unique_ptr<RewardModel> model_;
};

/// The kind of the one source a section sets ("" when none), or a
/// ConfigError unless at most one is set (exactly one when `required`).
std::string source_kind(const SourceConfig& c, const std::string& key, bool required) {
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

void register_reward_function(const std::string& name, RewardFn fn) {
  if (name.empty()) throw ConfigError("register_reward_function: expected a name");
  if (!fn) throw ConfigError(concat("register_reward_function: ", name, ": no function given"));
  std::lock_guard<std::mutex> lock(reward_mutex());
  if (!reward_functions().emplace(name, std::move(fn)).second)
    throw ConfigError(concat("reward function \"", name, "\" is already registered"));
}

std::unique_ptr<RewardSource> make_reward_source(const SourceConfig& c, const std::string& key) {
  const auto kind = source_kind(c, key, false);
  if (kind == "exact_match") return std::make_unique<ExactMatchSource>(c.exact_match, key);
  if (kind == "regex") return std::make_unique<RegexSource>(c.regex, key);
  if (kind == "command") return std::make_unique<ProgramSource>(c.command, c.timeout_s, key);
  if (kind == "function") return std::make_unique<FunctionSource>(c.function, key);
  if (kind == "model") return std::make_unique<ModelSource>(c.model, c.batch_size, key);
  return nullptr;
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

ResponseRewards::ResponseRewards(const SourceConfig& config, std::string key, bool required)
    : ResponseRewards(config, std::move(key), {}, "", required) {}

ResponseRewards::ResponseRewards(const SourceConfig& config, std::string key,
                                 const std::vector<WeightedSourceConfig>& list, const std::string& list_key,
                                 bool required) {
  if (list.empty()) {
    source_kind(config, key, required);
    if (auto s = make_reward_source(config, key)) sources_.push_back({std::move(s), 1.0, ""});
    return;
  }
  std::map<std::string, std::string> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto k = concat(list_key, "[", i, "]");
    const auto kind = source_kind(list[i], k, true);
    auto name = list[i].name.empty() ? concat(kind, "_", i) : list[i].name;
    if (const auto [it, fresh] = seen.emplace(name, k); !fresh)
      throw ConfigError(concat(k, ".name: \"", name, "\" is also ", it->second, "'s; each source needs its own"));
    sources_.push_back({make_reward_source(list[i], k), list[i].weight, std::move(name)});
  }
}

ResponseRewards::~ResponseRewards() = default;

bool ResponseRewards::is_exact_match() const {
  return sources_.size() == 1 && sources_.front().source->kind() == "exact_match";
}

std::vector<std::string> ResponseRewards::names() const {
  std::vector<std::string> out;
  if (sources_.size() > 1 || (sources_.size() == 1 && !sources_.front().name.empty()))
    for (const auto& s : sources_) out.push_back(s.name);
  return out;
}

void ResponseRewards::prepare(const FreezeFn& freeze, const std::string& who) {
  for (auto& s : sources_) s.source->prepare(freeze, who);
}

std::vector<std::string> ResponseRewards::check(const chat::PromptSample& prompt, const RewardQuery& query) {
  std::vector<std::string> out;
  for (auto& s : sources_)
    if (auto line = s.source->check(prompt, query); !line.empty()) out.push_back(std::move(line));
  return out;
}

std::vector<models::FrozenModel::Gathered> ResponseRewards::gathered() {
  std::vector<models::FrozenModel::Gathered> out;
  for (auto& s : sources_) out.push_back(s.source->gathered());
  return out;
}

std::vector<double> ResponseRewards::score(const std::vector<const chat::PromptSample*>& prompts,
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
    const auto part = s.source->score(prompts, queries);
    for (size_t i = 0; i < out.size(); ++i) out[i] += s.weight * part[i];
    if (components && named) components->push_back(part);
  }
  return out;
}

}  // namespace anvil::rewards
