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
    throw DataError(concat(where, ": ", key, " compares the response with field \"", field,
                           "\", which this record lacks"));
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

ResponseRewards::ResponseRewards(const config::PpoRewardConfig& config, std::string key, bool required)
    : config_(config), key_(std::move(key)) {
  int sources = 0;
  for (const auto* v : {&config_.model, &config_.command, &config_.exact_match, &config_.regex, &config_.function})
    sources += !v->empty();
  if (sources > 1 || (required && sources != 1))
    throw ConfigError(concat(key_, ": expected ", required ? "exactly" : "at most",
                             " one of model, command, exact_match, regex or function, got ", sources));
  if (!config_.function.empty()) fn_ = find_reward_function(config_.function, key_);
}

ResponseRewards::~ResponseRewards() = default;

bool ResponseRewards::enabled() const {
  return !config_.model.empty() || !config_.command.empty() || !config_.exact_match.empty() ||
         !config_.regex.empty() || !config_.function.empty();
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
  if (!config_.model.empty()) {
    auto rm = rewards::RewardModel::load(config_.model, "", false, key_ + ".model");
    frozen_ = ctx.freeze(rm.model_ptr());
    model_ = std::make_unique<rewards::RewardModel>(std::move(rm));
    log::info(who, ": reward model ", config_.model, " (", model_->chat_template().name(), " format)");
  }
  if (!config_.command.empty()) {
    program_ = std::make_unique<rewards::RewardProgram>(config_.command, config_.timeout_s);
    log::info(who, ": reward program \"", config_.command, "\" started");
  }
}

std::vector<double> ResponseRewards::score(const std::vector<const data::PromptSample*>& prompts,
                                           const std::vector<std::vector<int64_t>>& responses,
                                           const std::vector<bool>& ended, const tokenizer::Tokenizer& tok) {
  std::vector<RewardQuery> queries;
  for (size_t i = 0; i < responses.size(); ++i)
    queries.push_back({prompts[i]->prompt, tok.decode(responses[i]), prompts[i]->record, ended[i]});
  const auto& r = config_;
  std::vector<double> out(queries.size(), 0.0);
  if (!r.exact_match.empty() || !r.regex.empty()) {
    for (size_t i = 0; i < queries.size(); ++i) {
      const auto& where = prompts[i]->where;
      if (!r.exact_match.empty()) {
        out[i] = trim(queries[i].response) ==
                 trim(field_text(queries[i].record, r.exact_match, key_ + ".exact_match", where));
        continue;
      }
      const auto pattern = field_text(queries[i].record, r.regex, key_ + ".regex", where);
      try {
        out[i] = std::regex_search(queries[i].response, std::regex(pattern));
      } catch (const std::regex_error& e) {
        throw DataError(concat(where, ": ", key_, ".regex: field \"", r.regex, "\" holds \"", pattern,
                               "\", which is not a valid regular expression (", e.what(), ")"));
      }
    }
  } else if (program_) {
    std::vector<nlohmann::json> records;
    for (size_t i = 0; i < queries.size(); ++i) {
      const auto& q = queries[i];
      records.push_back(program_record(q, prompts[i]->where, key_ + ".command"));
    }
    out = program_->score(records);
  } else if (fn_) {
    out = fn_(queries);
    if (out.size() != queries.size())
      throw Error(concat(key_, ".function \"", r.function, "\" returned ", out.size(), " rewards for ",
                         queries.size(), " responses"));
  } else if (model_) {
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = 0; i < queries.size(); ++i)
      ids.push_back(
          model_->encode(prompts[i]->messages, prompts[i]->text_prompt, queries[i].response, prompts[i]->tools));
    const auto scores = model_->score(ids, r.batch_size);
    out.assign(scores.begin(), scores.end());
  }
  return out;
}

}  // namespace anvil::train
