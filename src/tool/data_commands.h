#pragma once
// anvil tokenize and anvil prepare: the data tools of the anvil command (data_commands.cpp). Private to src/tool.

#include <cstdint>
#include <string>
#include <vector>

/// Lines of text -> JSON lists of token ids, or (decode) back; "-" is standard input / output.
int cmd_tokenize(const std::string& tok_path, const std::string& type, const std::string& input,
                 const std::string& output, bool decode, bool keep_special);
/// Text (JSONL records or plain lines) -> memory-mapped token shards (or Megatron's .bin/.idx).
int cmd_prepare(const std::string& tok_path, const std::string& type, const std::vector<std::string>& inputs,
                const std::string& output, const std::vector<std::string>& text_fields, int64_t shard_tokens,
                bool no_eos, const std::string& on_error, const std::string& format);
