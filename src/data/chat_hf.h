#pragma once
// data.template: hf, a tokenizer's own Jinja chat_template rendered as
// transformers' apply_chat_template does (data/jinja.h), with the trained
// tokens taken from the template itself (docs/data.md, "Chat templates as
// written").

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "anvil/data/chat.h"

namespace anvil::data {

/// The `hf` template: ChatTemplate::get("hf").
const ChatTemplate& hf_chat_template();

/// For each character (code point) of `text`, the first of `ids` (its
/// tok.encode()) whose characters include it, as transformers'
/// char_to_token gives it; -1 where no token does. Throws Error when
/// decoding the ids does not give back `text`.
std::vector<int64_t> char_to_token(const tokenizer::Tokenizer& tok, const std::string& text,
                                   const std::vector<int64_t>& ids);

/// transformers' return_assistant_tokens_mask: 1 for the tokens from the
/// one holding a span's first character to the one holding its last; `spans`
/// in characters, `char_tokens` from char_to_token.
std::vector<int64_t> assistant_mask(const std::vector<int64_t>& char_tokens, size_t n_tokens,
                                    const std::vector<std::pair<int64_t, int64_t>>& spans);

}  // namespace anvil::data
