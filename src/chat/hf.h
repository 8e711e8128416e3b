#pragma once
// data.template: hf, a tokenizer's own Jinja chat_template rendered as
// transformers' apply_chat_template does (data/jinja.h), with the trained
// tokens taken from the template itself (docs/data.md, "Chat templates as
// written").

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "anvil/chat/chat.h"
#include "jinja/jinja.h"

namespace anvil::chat {

/// The `hf` template: ChatTemplate::get("hf").
const ChatTemplate& hf_chat_template();

/// What the tokenizer's chat_template renders for `messages` (`tools`: a
/// JSON array, or empty for none), given the variables transformers passes:
/// the text and the {% generation %} spans. The path of every hf encode.
jinja::RenderResult render_chat(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                bool add_generation_prompt, const std::string& tools = {});

/// JSON as the Python value json.loads gives (key order kept): what a
/// template sees of a message, of `tools`.
jinja::Value json_value(const nlohmann::ordered_json& j);

/// For each of `ids` (the tok.encode() of `text`), the characters (code
/// points) [begin, end) it holds, as tokenizers' Encoding.offsets gives them
/// without trimmed offsets: a character split over several byte-level tokens
/// is in each of them; a token that holds none is empty where the one before
/// it ends. Throws Error when decoding the ids does not give back `text`.
std::vector<std::pair<int64_t, int64_t>> token_offsets(const tokenizer::Tokenizer& tok, const std::string& text,
                                                       const std::vector<int64_t>& ids);

/// transformers' return_assistant_tokens_mask (since 5.24): 1 for every
/// token whose characters overlap a span; `spans` in characters [begin, end).
std::vector<int64_t> assistant_mask(const std::vector<std::pair<int64_t, int64_t>>& offsets,
                                    const std::vector<std::pair<int64_t, int64_t>>& spans);

}  // namespace anvil::chat
