#pragma once
// Internal (not installed): PPO's multi-turn environment program
// (ppo.environment). After each assistant turn it gets one JSON line, the
// prompt record as written plus `episode` {messages, turn, final, ended},
// and answers a message to append ({"role": "tool" | "user", "content": ...,
// with any other fields a chat template reads}) or the end of the episode
// ({"done": true, "reward": x}). docs/algorithms.md, "Multi-turn rollouts".

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/chat/chat.h"

namespace anvil::rewards {

class JsonLinesProgram;

/// One answer of the environment.
struct EnvironmentReply {
  bool done = false;
  double reward = 0;      // when done
  chat::Message message;  // when not done
};

class EnvironmentProgram {
 public:
  /// Starts the program; `timeout_s` bounds each answer.
  EnvironmentProgram(const std::string& command, double timeout_s);
  ~EnvironmentProgram();
  EnvironmentProgram(const EnvironmentProgram&) = delete;
  EnvironmentProgram& operator=(const EnvironmentProgram&) = delete;

  /// Sends `line` (whose episode.final says whether a message may come back)
  /// and checks the answer. Throws Error naming ppo.environment.command, the
  /// line, what was expected and the end of the program's stderr when it has
  /// exited, hangs past the timeout, or answers anything else (a message on
  /// a final turn included).
  EnvironmentReply step(const nlohmann::json& line);

 private:
  std::unique_ptr<JsonLinesProgram> program_;
};

/// The line an environment gets: `record` as written plus
/// episode {messages, turn, final, ended}. A record with its own `episode`
/// field is a DataError naming `where`.
nlohmann::json environment_line(const nlohmann::json& record, const std::vector<chat::Message>& messages, int64_t turn,
                                bool final, bool ended, const std::string& where);

}  // namespace anvil::rewards
