#pragma once
// Reading the Python references of the chat-template tests
// (tests/parity/apply_chat_template.py, chat_template_corpus.py): their
// JSON lines and the conversations in them.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"

namespace anvil::chat::references {

/// Every non-empty line of a JSONL file, keys in their order.
inline std::vector<nlohmann::ordered_json> read_lines(const std::filesystem::path& p) {
  std::vector<nlohmann::ordered_json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

/// A conversation's messages; one with more than a string role and content
/// (tool use, reasoning) is kept whole as JSON, as the trainer's reader keeps it.
inline std::vector<Message> messages_of(const nlohmann::ordered_json& j) {
  std::vector<Message> out;
  for (const auto& m : j) {
    const bool text = m.contains("content") && m["content"].is_string();
    out.push_back({m["role"].get<std::string>(), text ? m["content"].get<std::string>() : "",
                   m.size() == 2 && text ? "" : m.dump()});
  }
  return out;
}

}  // namespace anvil::chat::references
