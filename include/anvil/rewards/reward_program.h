#pragma once
// A reward program: one long-lived process (`/bin/sh -c <command>`) that
// reads one JSON object per line on stdin and answers one line
// {"reward": <number>} per object on stdout, in order. This is how a Python
// (or any) reward function plugs into PPO without Python inside Anvil. Its
// stderr goes to the trainer's. docs/algorithms.md.

#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>
#include <vector>

namespace anvil::rewards {

class RewardProgram {
 public:
  /// Starts the program. `timeout_s` bounds the wait for each answer.
  RewardProgram(std::string command, double timeout_s);
  /// Closes its stdin and waits for it to exit (killed after 2 s, with
  /// whatever it started).
  ~RewardProgram();
  RewardProgram(const RewardProgram&) = delete;
  RewardProgram& operator=(const RewardProgram&) = delete;

  /// One reward per record. Throws Error naming the command and the record
  /// when the program has exited, answers something other than
  /// {"reward": <finite number>}, or does not answer within the timeout.
  std::vector<double> score(const std::vector<nlohmann::json>& records);

  const std::string& command() const { return command_; }

 private:
  double ask(const nlohmann::json& record);
  [[noreturn]] void fail(const nlohmann::json& record, const std::string& what);
  std::string exit_status();

  std::string command_;
  double timeout_s_;
  pid_t pid_ = -1;
  pid_t group_ = -1;  // its process group
  int to_child_ = -1, from_child_ = -1;
  std::string buffer_;  // bytes read past the last answer line
};

}  // namespace anvil::rewards
