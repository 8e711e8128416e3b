#pragma once
// A reward program: one long-lived process (`/bin/sh -c <command>`) that
// reads one JSON object per line on stdin and answers one line
// {"reward": <number>} per object on stdout, in order. This is how a Python
// (or any) reward function plugs into PPO without Python inside Anvil. Its
// stderr is passed through to the trainer's, and its end is quoted in the
// error that stops a run. docs/algorithms.md.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::rewards {

class JsonLinesProgram;

class RewardProgram {
 public:
  /// Starts the program. `timeout_s` bounds the wait for each answer; `key`
  /// names the config key that set the command, in errors.
  RewardProgram(std::string command, double timeout_s, const std::string& key = "ppo.reward.command");
  /// Closes its stdin and waits for it to exit (killed after 2 s, with
  /// whatever it started).
  ~RewardProgram();
  RewardProgram(const RewardProgram&) = delete;
  RewardProgram& operator=(const RewardProgram&) = delete;

  /// One reward per record. Throws Error naming the command and the record
  /// when the program has exited, answers something other than
  /// {"reward": <finite number>}, or does not answer within the timeout.
  std::vector<double> score(const std::vector<nlohmann::json>& records);

  const std::string& command() const;

 private:
  std::unique_ptr<JsonLinesProgram> program_;
};

}  // namespace anvil::rewards
