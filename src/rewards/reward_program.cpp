#include "rewards/reward_program.h"

#include <cmath>

#include "anvil/core/error.h"
#include "rewards/json_lines_program.h"

namespace anvil::rewards {

RewardProgram::RewardProgram(std::string command, double timeout_s, const std::string& key)
    : program_(std::make_unique<JsonLinesProgram>(std::move(command), timeout_s, key,
                                                  key.substr(0, key.rfind('.')) + ".timeout_s")) {}

RewardProgram::~RewardProgram() = default;

const std::string& RewardProgram::command() const { return program_->command(); }

std::vector<double> RewardProgram::score(const std::vector<nlohmann::json>& records) {
  constexpr const char* kExpected = "a line {\"reward\": <finite number>}";
  std::vector<double> out;
  out.reserve(records.size());
  for (const auto& r : records) {
    const auto j = program_->ask(r, kExpected);
    if (!j.is_object() || !j.contains("reward") || !j["reward"].is_number() ||
        !std::isfinite(j["reward"].get<double>()))
      program_->fail(r, concat("answered ", j.dump(), "; expected ", kExpected));
    out.push_back(j["reward"].get<double>());
  }
  return out;
}

}  // namespace anvil::rewards
