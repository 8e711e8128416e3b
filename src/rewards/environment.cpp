#include "rewards/environment.h"

#include <cmath>

#include "anvil/core/error.h"
#include "rewards/json_lines_program.h"

namespace anvil::rewards {
namespace {

constexpr const char* kMessage = "{\"role\": \"tool\" or \"user\", \"content\": <string>}";
constexpr const char* kDone = "{\"done\": true, \"reward\": <finite number>}";

nlohmann::json message_json(const chat::Message& m) {
  if (!m.json.empty()) return nlohmann::json::parse(m.json);
  return {{"role", m.role}, {"content", m.content}};
}

}  // namespace

EnvironmentProgram::EnvironmentProgram(const std::string& command, double timeout_s)
    : program_(std::make_unique<JsonLinesProgram>(command, timeout_s, "ppo.environment.command",
                                                  "ppo.environment.timeout_s")) {}

EnvironmentProgram::~EnvironmentProgram() = default;

EnvironmentReply EnvironmentProgram::step(const nlohmann::json& line) {
  const bool final = line.at("episode").at("final").get<bool>();
  const auto expected = final ? concat("a line ", kDone, " (the episode's last turn: final is true)")
                              : concat("a line ", kMessage, " or ", kDone);
  const auto j = program_->ask(line, expected);
  const auto bad = [&](const std::string& why) {
    program_->fail(line,
                   concat("answered ", j.dump(), why.empty() ? "" : concat(" (", why, ")"), "; expected ", expected));
  };
  if (!j.is_object()) bad("");
  EnvironmentReply r;
  if (j.contains("done")) {
    if (!j["done"].is_boolean() || !j["done"].get<bool>()) bad("done must be true when given");
    if (!j.contains("reward") || !j["reward"].is_number() || !std::isfinite(j["reward"].get<double>()))
      bad("done needs a finite reward");
    r.done = true;
    r.reward = j["reward"].get<double>();
    return r;
  }
  if (final) bad("no more turns may be taken");
  if (!j.contains("role") || !j["role"].is_string() || (j["role"] != "tool" && j["role"] != "user"))
    bad("role must be tool or user");
  if (!j.contains("content") || !j["content"].is_string()) bad("content must be a string");
  r.message.role = j["role"].get<std::string>();
  r.message.content = j["content"].get<std::string>();
  if (j.size() > 2) r.message.json = j.dump();  // tool_call_id, name, ...: for the chat template
  return r;
}

nlohmann::json environment_line(const nlohmann::json& record, const std::vector<chat::Message>& messages, int64_t turn,
                                bool final, bool ended, const std::string& where) {
  auto line = record.is_object() ? record : nlohmann::json::object();
  if (line.contains("episode"))
    throw DataError(concat(where,
                           ": the record has a field \"episode\", which ppo.environment.command uses for the "
                           "episode (messages, turn, final, ended); rename the field"));
  auto ms = nlohmann::json::array();
  for (const auto& m : messages) ms.push_back(message_json(m));
  line["episode"] = {{"messages", ms}, {"turn", turn}, {"final", final}, {"ended", ended}};
  return line;
}

}  // namespace anvil::rewards
