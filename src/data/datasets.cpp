#include "data/datasets.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>

#include "anvil/core/error.h"

namespace anvil::data {
namespace {

bool has_target(const std::vector<int64_t>& labels) {
  // Position 0 is never predicted (it has no context).
  for (size_t i = 1; i < labels.size(); ++i)
    if (labels[i] != kIgnoreIndex) return true;
  return false;
}

void absorb(DatasetStats& s, const ReadStats& r) {
  s.lines = r.lines;
  s.skipped_errors = r.skipped;
  s.first_errors = r.first_errors;
}

// Runs `f` on a record; a DataError that does not name the record (a chat
// template's raise_exception, say) is given its file and line.
template <class F>
void at_record(const Record& rec, F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    if (std::string_view(e.what()).substr(0, rec.where().size()) == rec.where()) throw;
    throw DataError(concat(rec.where(), ": ", e.what()));
  }
}

template <class T>
void require_samples(const std::filesystem::path& path, const std::vector<T>& samples, const DatasetStats& s) {
  if (samples.empty()) throw DataError(concat(path.string(), ": no usable samples (", s.summary(), ")"));
}

std::string message_text(const std::vector<Message>& msgs, size_t end) {
  std::string s;
  for (size_t i = 0; i < end && i < msgs.size(); ++i) s += (i ? "\n" : "") + msgs[i].content;
  return s;
}

}  // namespace

std::string DatasetStats::summary() const {
  return concat(lines, " lines; skipped as malformed ", skipped_errors, ", truncated ", truncated,
                ", dropped as too long ", dropped_overflow, ", dropped with no target left ", dropped_no_target);
}

namespace {

// A list of {role, content} objects in field `name` of a record. A message
// with more (tool use) is kept whole, in the line's key order.
std::vector<Message> message_list(const Record& r, const std::string& name) {
  const auto& m = r.at(name);
  if (!m.is_array() || m.empty())
    r.fail(name, concat("expected a non-empty list of {role, content}, got ", m.type_name()));
  std::optional<nlohmann::ordered_json> ordered;  // parsed again only for a message with more
  std::vector<Message> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const auto field = concat(name, "[", i, "]");
    if (!m[i].is_object()) r.fail(field, concat("expected an object {role, content}, got ", m[i].type_name()));
    const auto& mi = m[i];
    if (!mi.contains("role") || !mi["role"].is_string())
      r.fail(field + ".role",
             mi.contains("role") ? concat("expected a string, got ", mi["role"].type_name()) : "missing");
    Message msg{mi["role"].get<std::string>(), ""};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      r.fail(field + ".role", concat("expected system, user, assistant or tool, got \"", msg.role, "\""));
    const bool calls = mi.contains("tool_calls") && !mi["tool_calls"].is_null();
    if (calls && (!mi["tool_calls"].is_array() || mi["tool_calls"].empty()))
      r.fail(field + ".tool_calls", concat("expected a non-empty list of {type, function: {name, arguments}}, got ",
                                           mi["tool_calls"].type_name()));
    const bool content = mi.contains("content") && !mi["content"].is_null();
    if (content && !mi["content"].is_string())
      r.fail(field + ".content", concat("expected a string, got ", mi["content"].type_name()));
    if (!content && !calls) r.fail(field + ".content", "missing (only a message with tool_calls may leave it out)");
    if (content) msg.content = mi["content"].get<std::string>();
    if (mi.size() > (mi.contains("content") ? 2u : 1u) || !content) {
      if (!ordered) ordered = r.ordered(name);
      msg.json = (*ordered)[i].dump();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

namespace {

std::string field_names(const Record& r) {
  std::string out;
  for (const auto& [k, v] : r.json().items()) out += (out.empty() ? "\"" : ", \"") + k + "\"";
  return out.empty() ? "none" : out;
}

// What an SFT line may hold, for the message of a line that holds none of it.
[[noreturn]] void not_an_sft_record(const Record& r, const std::string& prompt_field,
                                    const std::string& response_field) {
  throw DataError(concat(r.where(), ": expected an SFT record: {\"", prompt_field, "\", \"", response_field, "\"}",
                         response_field == "response" ? " (or TRL's \"completion\")" : "",
                         ", or {\"messages\": [{role, content}, ...]}; this line has fields ", field_names(r),
                         ". data.train[].prompt_field and response_field map other names"));
}

}  // namespace

std::vector<Message> record_messages(const Record& r, const std::string& prompt_field,
                                     const std::string& response_field, bool with_response) {
  if (r.has("messages")) return message_list(r, "messages");
  if (!r.has(prompt_field)) {
    if (with_response) not_an_sft_record(r, prompt_field, response_field);
    r.at(prompt_field);  // "missing field" for prompt-only readers
  }
  auto out = r.at(prompt_field).is_array() ? message_list(r, prompt_field)
                                           : std::vector<Message>{{"user", r.string(prompt_field)}};
  if (!with_response) return out;
  // TRL's prompt-completion format: "completion", a string or a list of
  // messages, when the default response field is absent.
  const auto field =
      response_field == "response" && !r.has("response") && r.has("completion") ? "completion" : response_field;
  if (!r.has(field)) not_an_sft_record(r, prompt_field, response_field);
  if (r.at(field).is_array()) {
    for (auto& m : message_list(r, field)) out.push_back(std::move(m));
  } else {
    out.push_back({"assistant", r.string(field)});
  }
  return out;
}

std::string record_tools(const Record& r) {
  std::string tools;
  if (r.has("tools")) {
    const auto& t = r.at("tools");
    if (!t.is_array()) r.fail("tools", concat("expected a list of tool schemas (JSON objects), got ", t.type_name()));
    for (size_t i = 0; i < t.size(); ++i)
      if (!t[i].is_object()) r.fail(concat("tools[", i, "]"), concat("expected a JSON object, got ", t[i].type_name()));
    tools = r.ordered("tools").dump();
  }
  if (!r.has("chat_template_kwargs")) return tools;
  // TRL's chat_template_kwargs: more variables for the template (Qwen3's enable_thinking), as
  // apply_chat_template(..., **kwargs) passes them. The inputs travel as one JSON object then.
  const auto& k = r.at("chat_template_kwargs");
  if (!k.is_object())
    r.fail("chat_template_kwargs", concat("expected a JSON object of template variables, got ", k.type_name()));
  auto inputs = r.ordered("chat_template_kwargs");
  for (const char* reserved :
       {"messages", "add_generation_prompt", "tools", "documents", "bos_token", "eos_token", "pad_token"})
    if (inputs.contains(reserved))
      r.fail(concat("chat_template_kwargs.", reserved), "is set by Anvil itself; expected other template variables");
  inputs["tools"] = tools.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(tools);
  return inputs.dump();
}

bool is_text_prompt(const Record& r, const std::string& prompt_field) {
  if (r.has("messages")) return false;
  if (r.has(prompt_field)) return r.at(prompt_field).is_string();
  return r.has("chosen") && r.at("chosen").is_string();  // TRL's implicit prompt
}

namespace {
// A text prompt and a text reply: TRL's (non-conversational) prompt-completion.
bool is_text_pair(const Record& r, const ReadOptions& opt) {
  if (!is_text_prompt(r, opt.prompt_field)) return false;
  const auto field = opt.response_field == "response" && !r.has("response") && r.has("completion")
                         ? std::string("completion")
                         : opt.response_field;
  return r.has(field) && r.at(field).is_string();
}
}  // namespace

std::vector<int64_t> encode_record_prompt(const tokenizer::Tokenizer& tok, const chat::ChatTemplate& tmpl,
                                          const std::vector<Message>& messages, bool text_prompt,
                                          const std::string& tools) {
  if (!(text_prompt && tmpl.name() == "plain" && messages.size() == 1)) return tmpl.encode_prompt(tok, messages, tools);
  std::vector<int64_t> ids;
  if (tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  const auto t = tok.encode(messages[0].content);
  ids.insert(ids.end(), t.begin(), t.end());
  return ids;
}

const chat::ChatTemplate& chat_format(const ReadOptions& opt) {
  return opt.chat ? *opt.chat : chat::ChatTemplate::get("plain");
}

namespace {

// A rendered sample of reply `reply` (an index into `messages`), cut or dropped at max_length.
std::optional<SftSample> finish_sample(chat::TokenizedChat t, const std::vector<Message>& messages, size_t reply,
                                       const ReadOptions& opt, DatasetStats& stats) {
  SftSample s;
  s.input_ids = std::move(t.input_ids);
  s.labels = std::move(t.labels);
  s.prompt_tokens = t.prompt_tokens;
  s.prompt = message_text(messages, reply);
  s.response = reply < messages.size() ? messages[reply].content : "";
  const bool overflow = opt.max_length > 0 && static_cast<int64_t>(s.input_ids.size()) > opt.max_length;
  if (overflow) {
    if (opt.drop_overflow) {
      ++stats.dropped_overflow;
      return std::nullopt;
    }
    s.input_ids.resize(static_cast<size_t>(opt.max_length));
    s.labels.resize(static_cast<size_t>(opt.max_length));
    s.prompt_tokens = std::min(s.prompt_tokens, opt.max_length);
  }
  if (!has_target(s.labels)) {
    ++stats.dropped_no_target;
    return std::nullopt;
  }
  stats.truncated += overflow;
  return s;
}

std::vector<size_t> assistant_turns(const std::vector<Message>& messages) {
  std::vector<size_t> out;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "assistant") out.push_back(i);
  return out;
}

}  // namespace

std::optional<SftSample> make_sft_sample(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                         const ReadOptions& opt, DatasetStats& stats, bool text_pair,
                                         const std::string& tools) {
  const bool pair = text_pair && messages.size() == 2 && messages[0].role == "user" && messages[1].role == "assistant";
  const auto& tmpl = chat_format(opt);
  auto t = tmpl.name() == "plain" && pair
               ? chat::encode_plain(tok, messages[0].content, messages[1].content, opt.add_eos, opt.train_on_prompt)
               : tmpl.encode(tok, messages, opt.train_on_prompt, tools);
  const auto replies = assistant_turns(messages);
  return finish_sample(std::move(t), messages, replies.empty() ? messages.size() : replies.front(), opt, stats);
}

std::vector<SftSample> make_sft_samples(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                        const ReadOptions& opt, DatasetStats& stats, bool text_pair,
                                        const std::string& tools) {
  const auto replies = assistant_turns(messages);
  const auto& tmpl = chat_format(opt);
  const bool split =
      !text_pair && replies.size() > 1 &&
      (opt.split_turns == ReadOptions::SplitTurns::always ||
       (opt.split_turns == ReadOptions::SplitTurns::automatic && !tmpl.keeps_earlier_turns(tok, messages, tools)));
  std::vector<SftSample> out;
  if (!split) {
    if (auto s = make_sft_sample(tok, messages, opt, stats, text_pair, tools)) out.push_back(std::move(*s));
    return out;
  }
  auto turns = tmpl.encode_turns(tok, messages, opt.train_on_prompt, tools);
  if (turns.size() != replies.size())
    throw Error(concat("data.template ", tmpl.name(), ": encode_turns gave ", turns.size(), " samples for ",
                       replies.size(), " assistant turns"));
  for (size_t k = 0; k < turns.size(); ++k)
    if (auto s = finish_sample(std::move(turns[k]), messages, replies[k], opt, stats)) out.push_back(std::move(*s));
  return out;
}

SftDataset SftDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                            const ReadOptions& opt) {
  SftDataset ds;
  ds.name_ = path.string();
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    at_record(rec, [&] {
      for (auto& s : make_sft_samples(tok, record_messages(rec, opt.prompt_field, opt.response_field, true), opt,
                                      ds.stats_, is_text_pair(rec, opt), record_tools(rec)))
        ds.samples_.push_back(std::move(s));
    });
  });
  absorb(ds.stats_, r);
  require_samples(path, ds.samples_, ds.stats_);
  return ds;
}

void SftDataset::get(int64_t i, LmSample& out) const {
  const auto& s = samples_[static_cast<size_t>(i)];
  out.input_ids = s.input_ids;
  out.labels = s.labels;
  out.doc_starts.assign(1, 0);
}

namespace {

// A reply: a string, or (TRL's conversational form) a list of one assistant message.
std::string reply_text(const Record& r, const std::string& field) {
  if (!r.at(field).is_array()) return r.string(field);
  const auto msgs = message_list(r, field);
  if (msgs.size() != 1 || msgs[0].role != "assistant")
    r.fail(field, "expected a string or a list of one assistant message");
  return msgs[0].content;
}

// TRL's extract_prompt: the prompt is where chosen and rejected first differ
// (a space just before that point goes with the replies); on message lists,
// the shared leading messages.
void implicit_prompt(const Record& r, std::vector<Message>& prompt, std::vector<std::string>& replies) {
  const auto& chosen = r.at("chosen");
  const auto& rejected = r.at("rejected");
  if (chosen.is_string() && rejected.is_string()) {
    const auto a = chosen.get<std::string>(), b = rejected.get<std::string>();
    const size_t n = std::min(a.size(), b.size());
    size_t k = 0;
    while (k < n && a[k] == b[k]) ++k;
    if (k == n) r.fail("rejected", "chosen and rejected have no differing part to train on (implicit prompt)");
    while (k > 0 && (static_cast<unsigned char>(a[k]) & 0xC0) == 0x80) --k;  // a whole UTF-8 character
    if (k > 0 && a[k - 1] == ' ') --k;
    if (k == 0) r.fail("chosen", "chosen and rejected share no prompt; expected a \"prompt\" field");
    prompt = {{"user", a.substr(0, k)}};
    replies = {a.substr(k), b.substr(k)};
    return;
  }
  if (!chosen.is_array() || !rejected.is_array())
    r.fail("chosen", "without a prompt field, expected chosen and rejected both strings or both message lists");
  const auto c = message_list(r, "chosen"), j = message_list(r, "rejected");
  size_t k = 0;
  while (k < c.size() && k < j.size() && c[k].role == j[k].role && c[k].content == j[k].content) ++k;
  if (k == 0) r.fail("chosen", "chosen and rejected share no leading messages; expected a \"prompt\" field");
  if (k + 1 != c.size() || k + 1 != j.size() || c[k].role != "assistant" || j[k].role != "assistant")
    r.fail("chosen", "expected the shared messages, then one assistant message each");
  prompt.assign(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k));
  replies = {c[k].content, j[k].content};
}

}  // namespace

PreferenceDataset PreferenceDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                          const ReadOptions& opt) {
  PreferenceDataset ds;
  const auto& tmpl = chat_format(opt);
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    PreferenceSample s;
    const bool replies = rec.has("chosen") || rec.has("rejected") || rec.has("ranked");
    if (!replies || (!rec.has(opt.prompt_field) && !(rec.has("chosen") && rec.has("rejected"))))
      throw DataError(concat(rec.where(), ": expected a preference record: {\"", opt.prompt_field,
                             "\", \"chosen\", \"rejected\"} or {\"", opt.prompt_field,
                             "\", \"ranked\": [best, ..., worst]} (TRL's implicit-prompt {\"chosen\", \"rejected\"} "
                             "too); this line has fields ",
                             field_names(rec), ". data.train[].prompt_field maps another prompt name"));
    std::vector<Message> msgs;
    if (!rec.has(opt.prompt_field)) {
      // TRL's implicit prompt: chosen and rejected hold it as a shared start.
      implicit_prompt(rec, msgs, s.reply_texts);
    } else {
      msgs = record_messages(rec, opt.prompt_field, "", false);
    }
    if (!s.reply_texts.empty()) {
      // filled by implicit_prompt
    } else if (rec.has("ranked")) {
      if (rec.has("chosen") || rec.has("rejected"))
        rec.fail("ranked", "expected either ranked or chosen + rejected, not both");
      const auto& list = rec.at("ranked");
      if (!list.is_array() || list.size() < 2)
        rec.fail("ranked", concat("expected a list of at least 2 replies, best first, got ", list.dump()));
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string())
          rec.fail(concat("ranked[", i, "]"), concat("expected a string, got ", list[i].dump()));
        s.reply_texts.push_back(list[i].get<std::string>());
      }
    } else {
      s.reply_texts = {reply_text(rec, "chosen"), reply_text(rec, "rejected")};
    }
    s.margin = rec.optional_number("margin");
    s.prompt = message_text(msgs, msgs.size());
    at_record(rec, [&] {
      s.prompt_ids = encode_record_prompt(tok, tmpl, msgs, is_text_prompt(rec, opt.prompt_field), record_tools(rec));
      for (const auto& text : s.reply_texts) s.replies.push_back(tmpl.encode_reply(tok, text));
    });
    if (opt.max_length > 0) {
      const auto room = opt.max_length - static_cast<int64_t>(s.prompt_ids.size());
      size_t longest = 0;
      for (const auto& ids : s.replies) longest = std::max(longest, ids.size());
      const bool over = static_cast<int64_t>(longest) > room;
      if (over && opt.drop_overflow) {
        ++ds.stats_.dropped_overflow;
        return;
      }
      if (over && room < 1) {  // the prompt alone fills max_length
        ++ds.stats_.dropped_no_target;
        return;
      }
      if (over) {
        for (auto& ids : s.replies)
          if (static_cast<int64_t>(ids.size()) > room) ids.resize(static_cast<size_t>(room));
        ++ds.stats_.truncated;
      }
    }
    ds.samples_.push_back(std::move(s));
  });
  absorb(ds.stats_, r);
  require_samples(path, ds.samples_, ds.stats_);
  return ds;
}

PromptDataset PromptDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                  const ReadOptions& opt) {
  PromptDataset ds;
  const auto& tmpl = chat_format(opt);
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    const auto msgs = record_messages(rec, opt.prompt_field, "", false);
    PromptSample s;
    s.prompt = message_text(msgs, msgs.size());
    s.text_prompt = is_text_prompt(rec, opt.prompt_field);
    s.tools = record_tools(rec);
    at_record(rec, [&] { s.prompt_ids = encode_record_prompt(tok, tmpl, msgs, s.text_prompt, s.tools); });
    s.messages = msgs;
    s.record = rec.json();
    s.where = rec.where();
    if (opt.max_length > 0 && static_cast<int64_t>(s.prompt_ids.size()) >= opt.max_length) {
      ++ds.stats_.dropped_overflow;
      return;
    }
    ds.samples_.push_back(std::move(s));
  });
  absorb(ds.stats_, r);
  require_samples(path, ds.samples_, ds.stats_);
  return ds;
}

OfflineRlDataset OfflineRlDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                        const ReadOptions& opt) {
  OfflineRlDataset ds;
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    // "reward": a number, or "rewards": one number per labelled token.
    std::vector<double> per_token;
    if (rec.has("rewards")) {
      const auto& list = rec.at("rewards");
      if (!list.is_array() || list.empty())
        rec.fail("rewards", "expected a non-empty list of numbers, one per response token");
      for (const auto& x : list) {
        if (!x.is_number() || !std::isfinite(x.get<double>())) rec.fail("rewards", "expected finite numbers");
        per_token.push_back(x.get<double>());
      }
      if (rec.has("reward")) rec.fail("reward", "give either \"reward\" or \"rewards\", not both");
    }
    const double reward = per_token.empty() ? rec.number("reward") : 0.0;
    auto s = make_sft_sample(tok, record_messages(rec, opt.prompt_field, opt.response_field, true), opt, ds.stats_,
                             is_text_pair(rec, opt), record_tools(rec));
    if (!s) return;
    if (!per_token.empty()) {
      const auto labelled =
          std::count_if(s->labels.begin(), s->labels.end(), [](int64_t l) { return l != kIgnoreIndex; });
      if (static_cast<int64_t>(per_token.size()) != labelled)
        rec.fail("rewards",
                 concat("expected one number per response token: the response has ", labelled,
                        " tokens with its end of turn (anvil tokenize shows them), the list ", per_token.size()));
    }
    double total = reward;
    for (const auto r : per_token) total += r;
    ds.samples_.push_back({std::move(s->input_ids), std::move(s->labels), s->prompt_tokens, total, std::move(per_token),
                           std::move(s->prompt), std::move(s->response)});
  });
  absorb(ds.stats_, r);
  require_samples(path, ds.samples_, ds.stats_);
  return ds;
}

}  // namespace anvil::data
