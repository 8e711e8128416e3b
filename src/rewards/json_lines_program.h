#pragma once
// Internal (not installed): a long-lived program that answers one JSON line
// per JSON line, in order: what reward programs (reward_program.h) and PPO's
// environments (environment.h) share. Its stderr is passed through to the
// trainer's, and its last lines are kept for the error that stops a run.

#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>

namespace anvil::rewards {

class JsonLinesProgram {
 public:
  /// Starts `/bin/sh -c command` in its own process group. `key` names the
  /// config key in errors ("ppo.reward.command"), `timeout_key` the key of
  /// `timeout_s`, the bound on each answer.
  JsonLinesProgram(std::string command, double timeout_s, std::string key, std::string timeout_key);
  /// Closes its stdin and waits for it to exit (killed after 2 s, with
  /// whatever it started).
  ~JsonLinesProgram();
  JsonLinesProgram(const JsonLinesProgram&) = delete;
  JsonLinesProgram& operator=(const JsonLinesProgram&) = delete;

  /// Writes `record` as one line and returns its answer line, parsed. Throws
  /// Error (fail) when the program has exited, does not answer within the
  /// timeout, or answers a line that is not JSON; `expected` describes the
  /// answer it should have given.
  nlohmann::json ask(const nlohmann::json& record, const std::string& expected);
  /// Throws Error: key, command, `what`, the program's last stderr lines and
  /// the record (clipped).
  [[noreturn]] void fail(const nlohmann::json& record, const std::string& what);

  const std::string& command() const { return command_; }

 private:
  std::string exit_status();
  /// Reads what stderr holds now (non-blocking), passes it on, keeps its tail.
  void drain_stderr();

  std::string command_, key_, timeout_key_;
  double timeout_s_;
  pid_t pid_ = -1;
  pid_t group_ = -1;  // its process group
  int to_child_ = -1, from_child_ = -1, err_child_ = -1;
  std::string buffer_;       // bytes read past the last answer line
  std::string stderr_tail_;  // the last bytes it wrote to stderr
};

}  // namespace anvil::rewards
