#include "anvil/chat/chat.h"

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "chat/hf.h"

namespace anvil::chat {
namespace {

/// The built-in templates: a conversation renders to pieces (text, or a
/// marker that must be a single token), each trained or not.
class PieceTemplate : public ChatTemplate {
 public:
  /// A piece of rendered text: literal text, or a marker that must be a
  /// single token (id resolved from `text`, or `id` when >= 0).
  struct Piece {
    std::string text;
    bool marker = false;
    bool trained = false;
    int64_t id = -1;
  };

  TokenizedChat encode(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages, bool train_on_prompt,
                       const std::string& tools = {}) const override;
  std::vector<int64_t> encode_prompt(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                     const std::string& tools = {}) const override;
  std::vector<int64_t> encode_reply(const tokenizer::Tokenizer& tok, const std::string& content) const override;
  int64_t end_of_turn_id(const tokenizer::Tokenizer& tok) const override;

 protected:
  using ChatTemplate::ChatTemplate;
  /// The pieces of `messages`, then the assistant header when `generation_prompt`.
  virtual std::vector<Piece> render(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                    bool generation_prompt) const = 0;
  virtual Piece end_of_turn(const tokenizer::Tokenizer& tok) const = 0;
  /// What the template does to a message's content (llama3 trims it).
  virtual std::string content(const std::string& c) const { return c; }
  TokenizedChat tokenize(const tokenizer::Tokenizer& tok, const std::vector<Piece>& pieces, bool train_on_prompt) const;
};

using Piece = PieceTemplate::Piece;

Piece text(std::string s, bool trained = false) { return {std::move(s), false, trained, -1}; }
Piece marker(std::string s, bool trained = false) { return {std::move(s), true, trained, -1}; }
Piece token(int64_t id, std::string name, bool trained) { return {std::move(name), true, trained, id}; }

// Jinja's trim (Python's str.strip) on ASCII whitespace.
std::string trim(const std::string& s) {
  constexpr const char* kSpace = " \t\n\r\f\v";
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

/// `tool`: the template renders a tool message as its Jinja does (plain and
/// chatml write every role alike), e.g. a ppo.environment's answers.
void check_role(const std::string& role, bool tool = false) {
  if (tool && role == "tool") return;
  if (role != "system" && role != "user" && role != "assistant")
    throw DataError(
        concat("message role \"", role, "\": expected system, user or assistant", tool ? " or tool" : "",
               role == "tool" ? " (tool messages render only with data.template plain, chatml or hf)" : ""));
}

Piece eos_piece(const tokenizer::Tokenizer& tok, bool trained) {
  if (tok.eos_id() < 0) throw Error("the tokenizer has no EOS token, which this chat template needs");
  return token(tok.eos_id(), "<eos>", trained);
}

bool adds_bos(const tokenizer::Tokenizer& tok) { return tok.add_bos() && tok.bos_id() >= 0; }

// "{{ bos_token }}" where the tokenizer puts BOS first (apply_chat_template
// tokenizes without adding special tokens).
std::string jinja_bos(const tokenizer::Tokenizer& tok) { return adds_bos(tok) ? "{{ bos_token }}" : ""; }

// Turns as written, each user or system turn ending in a newline (one is
// added when the content does not end with one), each reply in EOS: the
// format of the bundled quickstart data ({"prompt": "upper: abc\n", ...}).
class Plain final : public PieceTemplate {
 public:
  Plain() : PieceTemplate("plain") {}

  std::string jinja(const tokenizer::Tokenizer& tok) const override {
    return jinja_bos(tok) +
           R"({% for message in messages %}{% if message['role'] == 'assistant' %}{% generation %})"
           R"({{ message['content'] + eos_token }}{% endgeneration %}{% else %}{{ message['content'] }})"
           R"({% if not message['content'].endswith('\n') %}{{ '\n' }}{% endif %}{% endif %}{% endfor %})";
  }

 protected:
  std::vector<Piece> render(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                            bool) const override {
    std::vector<Piece> out;
    if (adds_bos(tok)) out.push_back(token(tok.bos_id(), "<bos>", false));
    for (const auto& m : messages) {
      check_role(m.role, true);
      if (m.role != "assistant") {
        const bool ends_line = !m.content.empty() && m.content.back() == '\n';
        out.push_back(text(ends_line ? m.content : m.content + "\n"));
        continue;
      }
      out.push_back(text(m.content, true));
      out.push_back(eos_piece(tok, true));
    }
    return out;
  }
  Piece end_of_turn(const tokenizer::Tokenizer& tok) const override { return eos_piece(tok, true); }
};

// <|im_start|>role\ncontent<|im_end|>\n
class ChatML final : public PieceTemplate {
 public:
  ChatML() : PieceTemplate("chatml") {}

  std::string jinja(const tokenizer::Tokenizer& tok) const override {
    return jinja_bos(tok) +
           R"({% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }})"
           R"({% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }})"
           R"({% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %})"
           R"({% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";
  }

 protected:
  std::vector<Piece> render(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                            bool generation_prompt) const override {
    std::vector<Piece> out;
    if (adds_bos(tok)) out.push_back(token(tok.bos_id(), "<bos>", false));
    for (const auto& m : messages) {
      check_role(m.role, true);
      const bool a = m.role == "assistant";
      out.push_back(marker("<|im_start|>"));
      out.push_back(text(m.role + "\n"));
      out.push_back(text(m.content, a));
      out.push_back(marker("<|im_end|>", a));
      out.push_back(text("\n"));
    }
    if (generation_prompt) {
      out.push_back(marker("<|im_start|>"));
      out.push_back(text("assistant\n"));
    }
    return out;
  }
  Piece end_of_turn(const tokenizer::Tokenizer&) const override { return marker("<|im_end|>", true); }
};

// <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
// (Meta's template, which trims each message's content).
class Llama3 final : public PieceTemplate {
 public:
  Llama3() : PieceTemplate("llama3") {}

  std::string jinja(const tokenizer::Tokenizer&) const override {
    return R"({{ '<|begin_of_text|>' }}{% for message in messages %})"
           R"({{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }})"
           R"({% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }})"
           R"({% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %})"
           R"({% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";
  }

 protected:
  std::vector<Piece> render(const tokenizer::Tokenizer&, const std::vector<Message>& messages,
                            bool generation_prompt) const override {
    std::vector<Piece> out{marker("<|begin_of_text|>")};
    auto header = [&](const std::string& role) {
      out.push_back(marker("<|start_header_id|>"));
      out.push_back(text(role));
      out.push_back(marker("<|end_header_id|>"));
      out.push_back(text("\n\n"));
    };
    for (const auto& m : messages) {
      check_role(m.role);
      const bool a = m.role == "assistant";
      header(m.role);
      out.push_back(text(content(m.content), a));
      out.push_back(marker("<|eot_id|>", a));
    }
    if (generation_prompt) header("assistant");
    return out;
  }
  Piece end_of_turn(const tokenizer::Tokenizer&) const override { return marker("<|eot_id|>", true); }
  std::string content(const std::string& c) const override { return trim(c); }
};

// Open-Assistant: <|prompter|>text</s><|assistant|>text</s> (</s> = the EOS token).
class OpenAssistant final : public PieceTemplate {
 public:
  OpenAssistant() : PieceTemplate("oasst") {}

  std::string jinja(const tokenizer::Tokenizer& tok) const override {
    return jinja_bos(tok) +
           R"({% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|assistant|>' }})"
           R"({% generation %}{{ message['content'] + eos_token }}{% endgeneration %})"
           R"({% elif message['role'] == 'user' %}{{ '<|prompter|>' + message['content'] + eos_token }})"
           R"({% else %}{{ '<|system|>' + message['content'] + eos_token }}{% endif %}{% endfor %})"
           R"({% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %})";
  }

 protected:
  std::vector<Piece> render(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                            bool generation_prompt) const override {
    static const std::map<std::string, std::string> kMarker = {
        {"system", "<|system|>"}, {"user", "<|prompter|>"}, {"assistant", "<|assistant|>"}};
    std::vector<Piece> out;
    if (adds_bos(tok)) out.push_back(token(tok.bos_id(), "<bos>", false));
    for (const auto& m : messages) {
      check_role(m.role);
      const bool a = m.role == "assistant";
      out.push_back(marker(kMarker.at(m.role)));
      out.push_back(text(m.content, a));
      out.push_back(eos_piece(tok, a));
    }
    if (generation_prompt) out.push_back(marker("<|assistant|>"));
    return out;
  }
  Piece end_of_turn(const tokenizer::Tokenizer& tok) const override { return eos_piece(tok, true); }
};

int64_t marker_id(const tokenizer::Tokenizer& tok, const Piece& p, const std::string& tmpl) {
  if (p.id >= 0) return p.id;
  if (auto id = tok.token_to_id(p.text)) return *id;
  throw Error(concat("data.template ", tmpl, ": the tokenizer has no single token \"", p.text,
                     "\", which this template needs (use a tokenizer that has the template's special tokens, "
                     "or data.template: plain)"));
}

std::string known_names() { return "plain, chatml, llama3, oasst or hf"; }

}  // namespace

std::vector<std::string> ChatTemplate::names() { return {"plain", "chatml", "llama3", "oasst"}; }

bool ChatTemplate::keeps_earlier_turns(const tokenizer::Tokenizer&, const std::vector<Message>&,
                                       const std::string&) const {
  return true;
}

// The built-in formats render earlier turns as written: sample i is the
// conversation through reply i, trained from where its generation prompt ends.
std::vector<TokenizedChat> ChatTemplate::encode_turns(const tokenizer::Tokenizer& tok,
                                                      const std::vector<Message>& messages, bool train_on_prompt,
                                                      const std::string& tools) const {
  std::vector<TokenizedChat> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::vector<Message> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
    const std::vector<Message> through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    auto t = encode(tok, through, train_on_prompt, tools);
    const auto prompt = encode_prompt(tok, before, tools);
    if (prompt.size() > t.input_ids.size() || !std::equal(prompt.begin(), prompt.end(), t.input_ids.begin()))
      throw Error(concat("data.template ", name(), ": the conversation before reply ", i,
                         " with the generation prompt is not where the conversation through it starts"));
    if (!train_on_prompt)
      std::fill(t.labels.begin(), t.labels.begin() + static_cast<std::ptrdiff_t>(prompt.size()), kIgnoreIndex);
    t.prompt_tokens = static_cast<int64_t>(t.labels.size());
    for (size_t k = 0; k < t.labels.size(); ++k)
      if (t.labels[k] != kIgnoreIndex) {
        t.prompt_tokens = static_cast<int64_t>(k);
        break;
      }
    out.push_back(std::move(t));
  }
  return out;
}

const ChatTemplate& ChatTemplate::get(const std::string& name) {
  static const Plain plain;
  static const ChatML chatml;
  static const Llama3 llama3;
  static const OpenAssistant oasst;
  if (name == "plain") return plain;
  if (name == "chatml") return chatml;
  if (name == "llama3") return llama3;
  if (name == "oasst") return oasst;
  if (name == "hf") return hf_chat_template();
  throw ConfigError(concat("data.template: unknown chat template \"", name, "\"; expected ", known_names()));
}

TokenizedChat PieceTemplate::tokenize(const tokenizer::Tokenizer& tok, const std::vector<Piece>& pieces,
                                      bool train_on_prompt) const {
  TokenizedChat out;
  // Consecutive text pieces with the same `trained` flag are encoded as one
  // string, so the ids equal encoding the rendered text whole wherever the
  // pre-tokenizer splits at markers and at the prompt/answer boundary.
  std::string run;
  bool run_trained = false;
  int64_t first_trained = -1;
  auto emit = [&](const std::vector<int64_t>& ids, bool trained) {
    if (trained && first_trained < 0) first_trained = static_cast<int64_t>(out.input_ids.size());
    for (auto id : ids) {
      out.input_ids.push_back(id);
      out.labels.push_back(trained || train_on_prompt ? id : kIgnoreIndex);
    }
  };
  auto flush = [&] {
    if (!run.empty()) emit(tok.encode(run), run_trained);
    run.clear();
  };
  for (const auto& p : pieces) {
    if (p.marker) {
      flush();
      emit({marker_id(tok, p, name())}, p.trained);
      continue;
    }
    if (p.trained != run_trained) flush();
    run_trained = p.trained;
    run += p.text;
  }
  flush();
  out.prompt_tokens = first_trained < 0 ? static_cast<int64_t>(out.input_ids.size()) : first_trained;
  return out;
}

// Tool use (tools, tool_calls, tool messages) has no built-in form; other
// fields of a message are not rendered.
void check_plain_messages(const std::string& name, const std::vector<Message>& messages, const std::string& tools) {
  const auto hint = " (tool use renders only with a model's own chat_template: data.template hf)";
  if (!tools.empty() && tools.front() == '{')
    throw DataError(concat("data.template ", name,
                           ": chat_template_kwargs (template variables) are read only by "
                           "a tokenizer's own Jinja template (data.template: hf, --template hf)"));
  if (!tools.empty() && tools != "[]")
    throw DataError(concat("data.template ", name, ": the conversation has tools", hint));
  for (const auto& m : messages)
    if (!m.json.empty() && nlohmann::json::parse(m.json).contains("tool_calls"))
      throw DataError(concat("data.template ", name, ": an ", m.role, " message has tool_calls", hint));
}

TokenizedChat PieceTemplate::encode(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                    bool train_on_prompt, const std::string& tools) const {
  check_plain_messages(name(), messages, tools);
  return tokenize(tok, render(tok, messages, false), train_on_prompt);
}

std::vector<int64_t> PieceTemplate::encode_prompt(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                                  const std::string& tools) const {
  check_plain_messages(name(), messages, tools);
  return tokenize(tok, render(tok, messages, true), false).input_ids;
}

std::vector<int64_t> PieceTemplate::encode_reply(const tokenizer::Tokenizer& tok, const std::string& c) const {
  return tokenize(tok, {text(content(c), true), end_of_turn(tok)}, false).input_ids;
}

int64_t PieceTemplate::end_of_turn_id(const tokenizer::Tokenizer& tok) const {
  return marker_id(tok, end_of_turn(tok), name());
}

RecordedChatFormat recorded_chat_format(const tokenizer::Tokenizer& tok) {
  RecordedChatFormat out;
  if (tok.chat_template().empty()) return out;
  out.kind = RecordedChatFormat::Kind::custom;
  for (const auto& name : ChatTemplate::names())
    if (ChatTemplate::get(name).jinja(tok) == tok.chat_template()) {
      out.kind = RecordedChatFormat::Kind::builtin;
      out.name = name;
    }
  return out;
}

std::string resolve_chat_template(const tokenizer::Tokenizer& tok, const std::string& requested,
                                  const std::string& what, const std::string& where, const std::string& override_hint) {
  const auto rec = recorded_chat_format(tok);
  using Kind = RecordedChatFormat::Kind;
  if (requested.empty() || requested == "auto") {
    if (rec.kind == Kind::builtin) return rec.name;
    return rec.kind == Kind::none ? "plain" : "hf";
  }
  if (requested == "hf") {
    if (rec.kind == Kind::none)
      throw ConfigError(concat(what, " hf: ", where,
                               " records no chat_template (tokenizer_config.json's "
                               "chat_template, or chat_template.jinja) to render; name a built-in format (plain, "
                               "chatml, llama3, oasst) instead"));
    return requested;
  }
  (void)ChatTemplate::get(requested);  // a known name
  if (rec.kind != Kind::builtin || rec.name == requested) return requested;
  if (override_hint.empty()) {
    log::warn(what, ": ", requested, " replaces ", rec.name, ", the chat format recorded in ", where);
    return requested;
  }
  throw ConfigError(concat(what, " ", requested, " contradicts ", where, ", which records the ", rec.name,
                           " chat format (tokenizer_config.json's chat_template); leave ", what, " out to use ",
                           rec.name, ", or add ", override_hint, " to use ", requested, " anyway"));
}

TokenizedChat encode_plain(const tokenizer::Tokenizer& tok, const std::string& prompt, const std::string& response,
                           bool add_eos, bool train_on_prompt) {
  TokenizedChat out;
  std::vector<int64_t> p;
  if (tok.add_bos() && tok.bos_id() >= 0) p.push_back(tok.bos_id());
  const auto pe = tok.encode(prompt);
  p.insert(p.end(), pe.begin(), pe.end());
  auto r = tok.encode(response);
  if (add_eos) r.push_back(tok.eos_id());
  out.prompt_tokens = static_cast<int64_t>(p.size());
  out.input_ids = p;
  out.input_ids.insert(out.input_ids.end(), r.begin(), r.end());
  out.labels = train_on_prompt ? p : std::vector<int64_t>(p.size(), kIgnoreIndex);
  out.labels.insert(out.labels.end(), r.begin(), r.end());
  return out;
}

}  // namespace anvil::chat
