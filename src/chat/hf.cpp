// data.template: hf. The text is rendered by the Jinja interpreter with the
// variables transformers passes (messages, add_generation_prompt,
// bos/eos/pad_token, tools and documents as None) and tokenized whole
// without special tokens added, as apply_chat_template does. Trained tokens:
// the tokens overlapping the {% generation %} spans (transformers' rule); a
// template without them trains what each reply adds to the conversation
// (its rendering minus the rendering up to it with add_generation_prompt),
// up to and including the end-of-turn token.

#include "chat/hf.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <string_view>

#include "anvil/core/error.h"
#include "jinja/jinja.h"
#include "jinja/limits.h"

namespace anvil::chat {
namespace {

using jinja::Value;

// The reply end_of_turn_id and encode_reply render: a user turn, then this.
constexpr const char* kProbeUser = "Hi";
constexpr const char* kProbeReply = "ANVILREPLY";

std::shared_ptr<const jinja::Template> compiled(const tokenizer::Tokenizer& tok) {
  const std::string& src = tok.chat_template();
  if (src.empty())
    throw ConfigError("data.template hf: the tokenizer records no chat_template (tokenizer_config.json) to render");
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const jinja::Template>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(src); it != cache.end()) return it->second;
  auto t = std::make_shared<const jinja::Template>(src);
  for (const char* name : {"unk_token", "sep_token", "cls_token", "mask_token", "additional_special_tokens"})
    if (t->uses(name))
      throw ConfigError(concat("chat_template: the template reads ", name,
                               ", which Anvil does not give templates (it gives bos_token, eos_token and pad_token)"));
  if (cache.size() >= 16) cache.clear();
  cache[src] = t;
  return t;
}

// transformers (5.24, _alias_reasoning_fields) gives a message's reasoning
// under the names templates read: {"thinking": r, **message,
// "reasoning_content": r}, r the first of reasoning_content, thinking and
// reasoning that the message has. So thinking comes first (its own value
// kept when it has one), and reasoning_content is r (where it was, else
// last): the order a template that prints the message sees.
std::shared_ptr<jinja::DictObj> with_reasoning_aliases(const std::shared_ptr<jinja::DictObj>& d) {
  const Value* found = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"})
    if ((found = d->find(key))) break;
  if (!found) return d;
  const Value* thinking = d->find("thinking");
  auto aliased = std::make_shared<jinja::DictObj>();
  aliased->add_new(Value::string("thinking"), thinking ? *thinking : *found);
  for (const auto& [k, v] : d->items)
    if (!(k.is_string() && k.str() == "thinking")) aliased->add_new(k, v);
  aliased->set(Value::string("reasoning_content"), *found);
  return aliased;
}

// transformers drops the keys of a message whose value is None, then aliases its reasoning.
Value messages_value(const std::vector<Message>& messages) {
  std::vector<Value> list;
  for (const auto& m : messages) {
    auto d = std::make_shared<jinja::DictObj>();
    if (m.json.empty()) {
      d->set(Value::string("role"), Value::string(m.role));
      d->set(Value::string("content"), Value::string(m.content));
    } else {
      const auto j = nlohmann::ordered_json::parse(m.json);
      for (const auto& [k, v] : j.items())
        if (!v.is_null()) d->set(Value::string(k), json_value(v));
      d = with_reasoning_aliases(d);
    }
    list.push_back(Value::dict(d));
  }
  return Value::list(std::move(list));
}

jinja::RenderResult render(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                           bool generation_prompt, const std::string& tools = {}) {
  const auto t = compiled(tok);
  std::vector<std::pair<std::string, Value>> vars;
  try {
    // `tools`: the tools' JSON array, or an object of every extra input (a record's chat_template_kwargs
    // with its "tools"; datasets.cpp record_tools).
    auto extra = tools.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(tools);
    nlohmann::ordered_json tool_list = extra;
    if (extra.is_object()) {
      tool_list = extra["tools"];
      extra.erase("tools");
    }
    vars = {{"messages", messages_value(messages)},
            {"add_generation_prompt", Value::boolean(generation_prompt)},
            {"tools", tool_list.is_null() ? Value::none() : json_value(tool_list)},
            {"documents", Value::none()}};
    if (extra.is_object())
      for (const auto& [k, v] : extra.items()) vars.emplace_back(k, json_value(v));
  } catch (const jinja::EvalError& e) {  // a message beyond the limits of jinja/limits.h
    throw DataError(concat("data.template hf: the conversation is beyond what a chat template takes: ", e.what()));
  }
  const std::pair<const char*, int64_t> special[] = {
      {"bos_token", tok.bos_id()}, {"eos_token", tok.eos_id()}, {"pad_token", tok.pad_id()}};
  for (const auto& [name, id] : special)
    if (id >= 0) vars.emplace_back(name, Value::string(tok.decode({id}, false)));
  return t->render(vars);
}

// apply_chat_template reads the special tokens a template writes as text as
// those tokens; a tokenizer that does not (a bare SentencePiece model) would
// give other ids, so that is an error.
std::string checked(const tokenizer::Tokenizer& tok, std::string text) {
  for (const int64_t id : {tok.bos_id(), tok.eos_id(), tok.pad_id()}) {
    if (id < 0) continue;
    const std::string s = tok.decode({id}, false);
    if (!s.empty() && text.find(s) != std::string::npos && tok.encode(s) != std::vector<int64_t>{id})
      throw Error(concat("data.template hf: the chat template writes \"", s,
                         "\" (a special token) as text, and this "
                         "tokenizer does not read it back as that token, as transformers would (a bare SentencePiece "
                         "model?); use the model's tokenizer.json, or a built-in data.template"));
  }
  return text;
}

bool is_special(const tokenizer::Tokenizer& tok, int64_t id) {
  return tok.decode({id}, true).empty() && !tok.decode({id}, false).empty();
}

size_t byte_offset(const std::string& s, int64_t chars) {
  size_t b = 0;
  for (int64_t c = 0; b < s.size(); ++b)
    if ((static_cast<unsigned char>(s[b]) & 0xC0) != 0x80 && c++ == chars) return b;
  return s.size();
}

int64_t char_count(const std::string& s, size_t bytes) {
  return jinja::code_points(std::string_view(s).substr(0, bytes));
}

// The first special token rendered after a reply's content, else EOS; -1 when neither.
int64_t derived_end_of_turn(const tokenizer::Tokenizer& tok) {
  std::string text;
  try {
    text = render(tok, {{"user", kProbeUser}, {"assistant", kProbeReply}}, false).text;
  } catch (const DataError&) {
    return tok.eos_id();  // a template that refuses the probe conversation
  }
  const auto k = text.find(kProbeReply);
  if (k == std::string::npos) return tok.eos_id();
  for (const auto id : tok.encode(text.substr(k + std::char_traits<char>::length(kProbeReply))))
    if (is_special(tok, id)) return id;
  return tok.eos_id();
}

int64_t end_of_turn(const tokenizer::Tokenizer& tok) {
  const int64_t id = derived_end_of_turn(tok);
  if (id < 0)
    throw Error(
        "data.template hf: the chat template ends an assistant turn with no special token, and the "
        "tokenizer has no EOS token to stop generation on");
  return id;
}

// The end-of-turn token's text.
std::string end_of_turn_text(const tokenizer::Tokenizer& tok) { return tok.decode({end_of_turn(tok)}, false); }

// Reply i's text in the conversation through it: what that rendering adds to
// the conversation before it rendered with add_generation_prompt, up to and
// including the end-of-turn token (what follows is the next turn's lead-in).
// Character offsets into `with` (the rendering through reply i); nothing when
// the rendering through it does not start with the prompt.
std::optional<std::pair<int64_t, int64_t>> reply_span(const tokenizer::Tokenizer& tok,
                                                      const std::vector<Message>& messages, size_t i,
                                                      const std::string& tools, const std::string& eot,
                                                      std::string& with) {
  const std::vector<Message> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
  const std::vector<Message> through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  const std::string prompt = render(tok, before, true, tools).text;
  with = render(tok, through, false, tools).text;
  if (with.compare(0, prompt.size(), prompt) != 0) return std::nullopt;
  size_t end = with.size();
  if (const auto k = with.find(eot, prompt.size()); !eot.empty() && k != std::string::npos) end = k + eot.size();
  return std::make_pair(char_count(with, prompt.size()), char_count(with, end));
}

// data.split_turns' sample of reply i: the conversation before it rendered
// with the generation prompt (what the model reads when it writes the reply),
// then what the rendering through reply i adds after the conversation before
// it, from where that rendering parts from the prompt: all of it after the
// prompt where the prompt is its prefix (Qwen3), after the generation header
// where the prompt's header opens a think block the rendering drops
// (DeepSeek-R1's "<｜Assistant｜><think>\n"). Into `text`; the reply's
// characters up to and including the end-of-turn token. Nothing when the
// renderings part before the conversation before the reply ends.
std::optional<std::pair<int64_t, int64_t>> turn_sample(const tokenizer::Tokenizer& tok,
                                                       const std::vector<Message>& messages, size_t i,
                                                       const std::string& tools, const std::string& eot,
                                                       std::string& text) {
  const std::vector<Message> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
  const std::vector<Message> through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  const std::string prompt = render(tok, before, true, tools).text;
  const std::string with = render(tok, through, false, tools).text;
  size_t common = std::mismatch(prompt.begin(), prompt.end(), with.begin(), with.end()).first - prompt.begin();
  while (common > 0 && common < with.size() && (static_cast<unsigned char>(with[common]) & 0xC0) == 0x80) --common;
  if (common < prompt.size()) {
    const std::string plain = render(tok, before, false, tools).text;
    if (plain.size() > common || with.compare(0, plain.size(), plain) != 0) return std::nullopt;
  }
  text = prompt + with.substr(common);
  size_t end = text.size();
  if (const auto k = text.find(eot, prompt.size()); !eot.empty() && k != std::string::npos) end = k + eot.size();
  return std::make_pair(char_count(text, prompt.size()), char_count(text, end));
}

// Without {% generation %}: each reply's span is what it adds to the text
// (reply_span), where the whole conversation starts as the conversation
// through that reply does.
std::vector<std::pair<int64_t, int64_t>> reply_spans(const tokenizer::Tokenizer& tok,
                                                     const std::vector<Message>& messages, const std::string& full,
                                                     const std::string& tools) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::string eot;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    if (eot.empty()) eot = end_of_turn_text(tok);
    std::string with;
    const auto span = reply_span(tok, messages, i, tools, eot, with);
    if (!span || full.compare(0, with.size(), with) != 0)
      throw DataError(concat(
          "data.template hf: cannot tell which tokens of reply ", i, " (message ", i,
          ") to train: the conversation rendered up to it with add_generation_prompt is not where the conversation "
          "rendered through it starts, or that is not where the whole conversation starts (the template renders "
          "earlier turns differently). data.split_turns: auto or always trains each reply as its own sample; or "
          "mark the trained text with {% generation %} ... {% endgeneration %}"));
    spans.push_back(*span);
  }
  return spans;
}

// A rendered text's ids and labels: trained where a token overlaps `spans`, or everywhere.
TokenizedChat tokenized(const tokenizer::Tokenizer& tok, const std::string& text,
                        const std::vector<std::pair<int64_t, int64_t>>& spans, bool train_on_prompt) {
  TokenizedChat out;
  out.input_ids = tok.encode(checked(tok, text));
  const auto mask = assistant_mask(token_offsets(tok, text, out.input_ids), spans);
  out.prompt_tokens = static_cast<int64_t>(out.input_ids.size());
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] && out.prompt_tokens == static_cast<int64_t>(out.input_ids.size()))
      out.prompt_tokens = static_cast<int64_t>(i);
    out.labels.push_back(mask[i] || train_on_prompt ? out.input_ids[i] : kIgnoreIndex);
  }
  return out;
}

class HfTemplate final : public ChatTemplate {
 public:
  HfTemplate() : ChatTemplate("hf") {}

  TokenizedChat encode(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages, bool train_on_prompt,
                       const std::string& tools = {}) const override {
    const auto r = render(tok, messages, false, tools);
    const auto spans = compiled(tok)->has_generation() ? r.generation : reply_spans(tok, messages, r.text, tools);
    return tokenized(tok, r.text, spans, train_on_prompt);
  }

  // Sample i: the conversation before reply i as the model sees it when it writes it, then that reply, trained
  // alone (turn_sample); with {% generation %}, the rendering through reply i and its last block.
  std::vector<TokenizedChat> encode_turns(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                          bool train_on_prompt, const std::string& tools = {}) const override {
    std::vector<TokenizedChat> out;
    const bool marked = compiled(tok)->has_generation();
    const std::string eot = marked ? std::string() : end_of_turn_text(tok);
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role != "assistant") continue;
      std::string text;
      std::optional<std::pair<int64_t, int64_t>> span;
      if (marked) {
        const std::vector<Message> through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        auto r = render(tok, through, false, tools);
        if (!r.generation.empty()) span = r.generation.back();
        text = std::move(r.text);
      } else {
        span = turn_sample(tok, messages, i, tools, eot, text);
      }
      if (!span)
        throw DataError(concat("data.template hf: cannot tell which tokens of reply ", i, " (message ", i,
                               ") to train: the conversation rendered through it does not continue the "
                               "conversation before it (the template changes earlier turns when a reply follows)"));
      out.push_back(tokenized(tok, text, {*span}, train_on_prompt));
    }
    return out;
  }

  bool keeps_earlier_turns(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                           const std::string& tools = {}) const override {
    if (compiled(tok)->has_generation()) return true;  // the markers say which tokens, as transformers reads them
    const std::string full = render(tok, messages, false, tools).text;
    const std::string eot = end_of_turn_text(tok);
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role != "assistant") continue;
      std::string with;
      if (!reply_span(tok, messages, i, tools, eot, with) || full.compare(0, with.size(), with) != 0) return false;
    }
    return true;
  }

  std::vector<int64_t> encode_prompt(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                     const std::string& tools = {}) const override {
    return tok.encode(checked(tok, render(tok, messages, true, tools).text));
  }

  // The reply's trained text in a one-turn conversation, tokenized alone.
  std::vector<int64_t> encode_reply(const tokenizer::Tokenizer& tok, const std::string& content) const override {
    const std::vector<Message> conv = {{"user", kProbeUser}, {"assistant", content}};
    const auto r = render(tok, conv, false);
    const auto spans = compiled(tok)->has_generation() ? r.generation : reply_spans(tok, conv, r.text, {});
    if (spans.empty())
      throw ConfigError(
          "data.template hf: the chat template marks no part of a reply as trained ({% generation %} "
          "renders nothing for an assistant message)");
    const size_t b = byte_offset(r.text, spans[0].first), e = byte_offset(r.text, spans[0].second);
    return tok.encode(checked(tok, r.text.substr(b, e - b)));
  }

  int64_t end_of_turn_id(const tokenizer::Tokenizer& tok) const override { return end_of_turn(tok); }

  std::string jinja(const tokenizer::Tokenizer& tok) const override { return tok.chat_template(); }
};

// Decoding a group of ids in the context of the group before it, so decoders
// that treat the first token specially (a SentencePiece prefix space) decode
// them as in the whole text.
class Aligner {
 public:
  Aligner(const tokenizer::Tokenizer& tok, const std::string& text, const std::vector<int64_t>& ids)
      : tok_(tok), text_(text), ids_(ids), char_of_(text.size() + 1, 0), out_(ids.size(), {-1, -1}) {
    int64_t c = -1;
    for (size_t b = 0; b < text.size(); ++b) {
      if ((static_cast<unsigned char>(text[b]) & 0xC0) != 0x80) ++c;
      char_of_[b] = c;
    }
    n_chars_ = c + 1;
  }

  std::vector<std::pair<int64_t, int64_t>> run() {
    constexpr size_t kMaxGroup = 16;  // tokens that together make whole characters
    for (size_t i = 0; i < ids_.size(); ++i) {
      const std::string whole = decode(ctx_, i + 1);
      size_t skipped = 0;
      if (whole.compare(0, prev_.size(), prev_) == 0 &&
          aligned(std::string_view(whole).substr(prev_.size()), &skipped)) {
        const size_t len = whole.size() - prev_.size();
        attribute_whitespace(skipped, i);
        pos_ += skipped;
        assign_group(i, len);
        pos_ += len;
        prev_ = decode(group_, i + 1);
        ctx_ = group_;
        group_ = i + 1;
      } else if (i + 1 - group_ > kMaxGroup) {
        break;
      }
    }
    if (group_ != ids_.size() || pos_ != text_.size())
      throw Error(concat("data.template hf: the tokenizer's decode of the rendered chat differs from the text at ",
                         "character ", pos_ < text_.size() ? char_of_[pos_] : n_chars_,
                         ", so the trained tokens cannot be found (the tokenizer normalizes its input?)"));
    // A token that holds no character sits, empty, where the one before it ends.
    int64_t end = 0;
    for (auto& [b, e] : out_) {
      if (b < 0) b = e = end;
      end = e;
    }
    return std::move(out_);
  }

 private:
  std::string decode(size_t a, size_t b) const {
    return tok_.decode(std::vector<int64_t>(ids_.begin() + static_cast<std::ptrdiff_t>(a),
                                            ids_.begin() + static_cast<std::ptrdiff_t>(b)),
                       false);
  }

  // Whether `piece` is the text at pos_, possibly after whitespace that an
  // added token's lstrip/rstrip took in (decode does not give it back).
  bool aligned(std::string_view piece, size_t* skipped) const {
    if (text_.compare(pos_, piece.size(), piece) == 0) return true;
    size_t k = pos_;
    while (k < text_.size() && (text_[k] == ' ' || text_[k] == '\n' || text_[k] == '\t' || text_[k] == '\r')) ++k;
    if (k == pos_ || piece.empty() || text_.compare(k, piece.size(), piece) != 0) return false;
    *skipped = k - pos_;
    return true;
  }

  // Skipped whitespace belongs to the special token before it (rstrip), else to the group after it (lstrip).
  void attribute_whitespace(size_t skipped, size_t group_end) {
    if (!skipped) return;
    const bool before = group_ > 0 && tok_.decode({ids_[group_ - 1]}, true).empty();
    mark(static_cast<int64_t>(before ? group_ - 1 : group_), pos_, pos_ + skipped - 1);
    (void)group_end;
  }

  // Token `token` holds (some bytes of) the characters of these bytes.
  void mark(int64_t token, size_t first_byte, size_t last_byte) {
    if (last_byte < first_byte) return;
    auto& [b, e] = out_[static_cast<size_t>(token)];
    const int64_t first = char_of_[first_byte], last = char_of_[last_byte] + 1;
    b = b < 0 ? first : std::min(b, first);
    e = std::max(e, last);
  }

  // Tokens group_..last decode to text_[pos_, pos_ + len). One token covers
  // its characters; several split characters between them (byte-level BPE):
  // each takes the characters whose bytes it holds.
  void assign_group(size_t last, size_t len) {
    if (len == 0) return;
    if (last == group_) {
      mark(static_cast<int64_t>(last), pos_, pos_ + len - 1);
      return;
    }
    size_t done = 0;  // bytes of whole characters decoded before token k
    for (size_t k = group_; k <= last; ++k) {
      const size_t first = pos_ + done;
      if (k == last) {
        mark(static_cast<int64_t>(k), first, pos_ + len - 1);
        return;
      }
      const std::string d = decode(ctx_, k + 1);
      const std::string_view part =
          d.compare(0, prev_.size(), prev_) == 0 ? std::string_view(d).substr(prev_.size()) : std::string_view();
      size_t m = 0;
      while (m < part.size() && m < len && part[m] == text_[pos_ + m]) ++m;
      while (m > 0 && m < len && (static_cast<unsigned char>(text_[pos_ + m]) & 0xC0) == 0x80) --m;
      if (part.size() > m)
        mark(static_cast<int64_t>(k), first, pos_ + m);  // ends inside the character at m
      else if (m > 0)
        mark(static_cast<int64_t>(k), first, pos_ + m - 1);
      done = std::max(done, m);
    }
  }

  const tokenizer::Tokenizer& tok_;
  const std::string& text_;
  const std::vector<int64_t>& ids_;
  std::vector<int64_t> char_of_;  // the character index of each byte
  int64_t n_chars_ = 0;
  std::vector<std::pair<int64_t, int64_t>> out_;  // each token's characters [begin, end)
  size_t pos_ = 0;                                // bytes of text_ accounted for
  size_t ctx_ = 0;                                // the group before the current one (decode context)
  size_t group_ = 0;                              // the current group's first token
  std::string prev_;                              // decode of ids_[ctx_, group_)
};

}  // namespace

const ChatTemplate& hf_chat_template() {
  static const HfTemplate hf;
  return hf;
}

jinja::RenderResult render_chat(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                bool add_generation_prompt, const std::string& tools) {
  return render(tok, messages, add_generation_prompt, tools);
}

namespace {

// Bounded before it recurses: a JSON document may nest deeper than the stack holds.
jinja::Value json_value_at(const nlohmann::ordered_json& j, int depth) {
  if ((j.is_array() || j.is_object()) && depth >= jinja::kMaxValueDepth)
    throw DataError(concat("data.template hf: a message or the tools nest lists and objects deeper than ",
                           jinja::limit_note(jinja::kMaxValueDepth)));
  if (j.is_null()) return jinja::Value::none();
  if (j.is_boolean()) return jinja::Value::boolean(j.get<bool>());
  if (j.is_number_integer()) return jinja::Value::integer(j.get<int64_t>());
  if (j.is_number()) return jinja::Value::floating(j.get<double>());
  if (j.is_string()) return jinja::Value::string(j.get<std::string>());
  if (j.is_array()) {
    std::vector<jinja::Value> items;
    for (const auto& x : j) items.push_back(json_value_at(x, depth + 1));
    return jinja::Value::list(std::move(items));
  }
  auto d = std::make_shared<jinja::DictObj>();
  for (const auto& [k, v] : j.items()) d->set(jinja::Value::string(k), json_value_at(v, depth + 1));
  return jinja::Value::dict(d);
}

}  // namespace

jinja::Value json_value(const nlohmann::ordered_json& j) { return json_value_at(j, 0); }

std::vector<std::pair<int64_t, int64_t>> token_offsets(const tokenizer::Tokenizer& tok, const std::string& text,
                                                       const std::vector<int64_t>& ids) {
  return Aligner(tok, text, ids).run();
}

std::vector<int64_t> assistant_mask(const std::vector<std::pair<int64_t, int64_t>>& offsets,
                                    const std::vector<std::pair<int64_t, int64_t>>& spans) {
  // The spans merged where they meet, so that each token is checked against
  // one (a template may write a block per character).
  auto sorted = spans;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [start, end] : sorted) {
    if (!merged.empty() && start <= merged.back().second)
      merged.back().second = std::max(merged.back().second, end);
    else
      merged.emplace_back(start, end);
  }
  std::vector<int64_t> mask(offsets.size(), 0);
  for (size_t t = 0; t < offsets.size(); ++t) {
    const auto [first, last] = offsets[t];
    // The first span that ends after the token starts; if it starts too late, so do the rest.
    const auto it = std::upper_bound(merged.begin(), merged.end(), first,
                                     [](int64_t x, const std::pair<int64_t, int64_t>& s) { return x < s.second; });
    mask[t] = it != merged.end() && it->first < last;
  }
  return mask;
}

}  // namespace anvil::chat
