#pragma once
// Chat templates: conversations -> token ids with labels on assistant turns
// only. Built-in named formats written in C++: plain, chatml, llama3, oasst.
// Each also has a Jinja form, recorded as tokenizer_config.json's
// chat_template, with which transformers' apply_chat_template renders the
// same ids; a model folder's recorded format is found by matching it. `hf`
// renders a tokenizer's own Jinja chat_template as transformers does
// (docs/data.md, "Chat templates as written").

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "anvil/tokenizer/tokenizer.h"

namespace anvil::chat {

/// Label value that the loss ignores (HF / PyTorch convention).
constexpr int64_t kIgnoreIndex = -100;

struct Message {
  std::string role;  // system, user or assistant (and tool, for hf templates)
  std::string content;
  /// The whole message as a JSON object when it holds more than a string
  /// role and content (OpenAI/TRL tool use: `tool_calls`, `tool_call_id`,
  /// `name`, a null content, ...); empty otherwise. The hf template renders
  /// it (as transformers does, with the null fields dropped); the built-in
  /// ones refuse tool_calls and the tool role, and ignore other fields.
  std::string json;

  Message() = default;
  Message(std::string role_, std::string content_, std::string json_ = {})
      : role(std::move(role_)), content(std::move(content_)), json(std::move(json_)) {}
};

/// A rendered conversation. labels[i] = input_ids[i] where trained,
/// kIgnoreIndex elsewhere.
struct TokenizedChat {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;
  int64_t prompt_tokens = 0;  // tokens before the first trained one
};

class ChatTemplate {
 public:
  /// plain, chatml, llama3, oasst, or hf (the tokenizer's own chat_template,
  /// rendered as written); throws ConfigError otherwise.
  static const ChatTemplate& get(const std::string& name);
  /// The built-in templates' names, in get()'s order (hf is not one).
  static std::vector<std::string> names();

  /// Every turn; assistant turns (content + end of turn) are trained, and
  /// with `train_on_prompt` everything is. Throws Error when the template's
  /// markers are not single tokens of `tok`. `tools`: the conversation's
  /// tools as a JSON array (function schemas, TRL's "tools" column), given
  /// to an hf template as `tools`; empty for none (built-in templates
  /// refuse any).
  virtual TokenizedChat encode(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                               bool train_on_prompt, const std::string& tools = {}) const = 0;
  /// One sample per assistant turn i: the conversation before it as the model
  /// sees it when it writes that reply (rendered with the generation prompt),
  /// then the reply (content + end of turn) as the conversation through it
  /// renders it; only that reply is trained (everything with
  /// `train_on_prompt`). Where encode() can tell every reply's tokens, sample
  /// i's trained tokens are those of reply i in encode()'s rendering.
  virtual std::vector<TokenizedChat> encode_turns(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                                  bool train_on_prompt, const std::string& tools = {}) const;
  /// Whether encode() can tell which tokens every reply of `messages` is: the
  /// whole conversation renders each earlier reply as it renders the last one
  /// (the built-in formats always do; a template that drops earlier
  /// reasoning, as Qwen3's does, does not).
  virtual bool keeps_earlier_turns(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                   const std::string& tools = {}) const;
  /// The conversation so far plus the header of the assistant's reply: what
  /// generation continues from.
  virtual std::vector<int64_t> encode_prompt(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                             const std::string& tools = {}) const = 0;
  /// An assistant reply as it follows encode_prompt: content + end of turn.
  virtual std::vector<int64_t> encode_reply(const tokenizer::Tokenizer& tok, const std::string& content) const = 0;
  /// The token that ends an assistant turn (generation stops on it).
  virtual int64_t end_of_turn_id(const tokenizer::Tokenizer& tok) const = 0;
  /// This template as Jinja for `tok` (BOS written when the tokenizer adds
  /// one), for tokenizer_config.json's chat_template: apply_chat_template
  /// renders encode()'s ids, {% generation %} marks the trained tokens, and
  /// add_generation_prompt gives encode_prompt()'s. For hf, the tokenizer's
  /// own chat_template.
  virtual std::string jinja(const tokenizer::Tokenizer& tok) const = 0;

  const std::string& name() const { return name_; }
  virtual ~ChatTemplate() = default;

 protected:
  explicit ChatTemplate(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

/// A prompt of on-policy RL as a run holds it: rendered with the generation
/// header (a built-in or hf template's encode_prompt, or the plain text),
/// with its turns and the whole dataset line, which reward programs and
/// verifiers read (data::PromptDataset loads them; rewards/ scores them).
struct PromptSample {
  std::vector<int64_t> prompt_ids;
  std::string prompt;
  std::vector<Message> messages;  // the prompt's turns
  std::string tools;              // the record's tools (data::record_tools), for a reward model's template
  bool text_prompt = false;       // a text prompt (data::is_text_prompt)
  nlohmann::json record;          // the whole line: answers, tests, ... for rewards
  std::string where;              // file:line, for messages
};

/// What a tokenizer records about its chat format (its chat_template).
struct RecordedChatFormat {
  enum class Kind { none, builtin, custom };
  Kind kind = Kind::none;
  std::string name;  // the built-in template's name when kind == builtin
};
RecordedChatFormat recorded_chat_format(const tokenizer::Tokenizer& tok);

/// The template to use: `requested` ("auto", "hf" or a built-in name) against
/// what `tok` records. "auto" takes the recorded format: its built-in name,
/// plain when none is recorded, hf for a Jinja template that is not built in.
/// "hf" needs a recorded template. A built-in name that contradicts the
/// recorded built-in format is an error naming `what` and `where`, unless
/// `override_hint` is empty (then it is logged and used); the error names
/// `override_hint` as the way to insist.
std::string resolve_chat_template(const tokenizer::Tokenizer& tok, const std::string& requested,
                                  const std::string& what, const std::string& where, const std::string& override_hint);

/// The plain format for one prompt/response pair: prompt + response (+ EOS).
TokenizedChat encode_plain(const tokenizer::Tokenizer& tok, const std::string& prompt, const std::string& response,
                           bool add_eos, bool train_on_prompt);

}  // namespace anvil::chat
