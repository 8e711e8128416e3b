#include "anvil/data/datasets.h"

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

template <class T>
void require_samples(const std::filesystem::path& path, const std::vector<T>& samples, const DatasetStats& s) {
  if (samples.empty())
    throw DataError(concat(path.string(), ": no usable samples (", s.summary(), ")"));
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

// A list of {role, content} objects in field `name` of a record.
std::vector<Message> message_list(const Record& r, const std::string& name) {
  const auto& m = r.at(name);
  if (!m.is_array() || m.empty()) r.fail(name, concat("expected a non-empty list of {role, content}, got ", m.type_name()));
  std::vector<Message> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const auto field = concat(name, "[", i, "]");
    if (!m[i].is_object()) r.fail(field, concat("expected an object {role, content}, got ", m[i].type_name()));
    for (const char* key : {"role", "content"})
      if (!m[i].contains(key) || !m[i][key].is_string())
        r.fail(concat(field, ".", key),
               m[i].contains(key) ? concat("expected a string, got ", m[i][key].type_name()) : "missing");
    Message msg{m[i]["role"].get<std::string>(), m[i]["content"].get<std::string>()};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      r.fail(field + ".role", concat("expected system, user or assistant, got \"", msg.role, "\""));
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

std::vector<Message> record_messages(const Record& r, const std::string& prompt_field,
                                     const std::string& response_field, bool with_response) {
  if (r.has("messages")) return message_list(r, "messages");
  auto out = r.at(prompt_field).is_array() ? message_list(r, prompt_field)
                                           : std::vector<Message>{{"user", r.string(prompt_field)}};
  if (with_response) out.push_back({"assistant", r.string(response_field)});
  return out;
}

std::optional<SftSample> make_sft_sample(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                         const ReadOptions& opt, DatasetStats& stats) {
  const bool pair = messages.size() == 2 && messages[0].role == "user" && messages[1].role == "assistant";
  const auto t = opt.template_name == "plain" && pair
                     ? encode_plain(tok, messages[0].content, messages[1].content, opt.add_eos, opt.train_on_prompt)
                     : ChatTemplate::get(opt.template_name).encode(tok, messages, opt.train_on_prompt);
  SftSample s;
  s.input_ids = t.input_ids;
  s.labels = t.labels;
  s.prompt_tokens = t.prompt_tokens;
  size_t first_reply = messages.size();
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "assistant") {
      first_reply = i;
      break;
    }
  s.prompt = message_text(messages, first_reply);
  s.response = first_reply < messages.size() ? messages[first_reply].content : "";
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

SftDataset SftDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok, const ReadOptions& opt) {
  SftDataset ds;
  ds.name_ = path.string();
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    auto s = make_sft_sample(tok, record_messages(rec, opt.prompt_field, opt.response_field, true), opt, ds.stats_);
    if (s) ds.samples_.push_back(std::move(*s));
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

PreferenceDataset PreferenceDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                          const ReadOptions& opt) {
  PreferenceDataset ds;
  const auto& tmpl = ChatTemplate::get(opt.template_name);
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    PreferenceSample s;
    const auto msgs = record_messages(rec, opt.prompt_field, "", false);
    if (rec.has("ranked")) {
      if (rec.has("chosen") || rec.has("rejected"))
        rec.fail("ranked", "expected either ranked or chosen + rejected, not both");
      const auto& list = rec.at("ranked");
      if (!list.is_array() || list.size() < 2)
        rec.fail("ranked", concat("expected a list of at least 2 replies, best first, got ", list.dump()));
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string()) rec.fail(concat("ranked[", i, "]"), concat("expected a string, got ", list[i].dump()));
        s.reply_texts.push_back(list[i].get<std::string>());
      }
    } else {
      s.reply_texts = {rec.string("chosen"), rec.string("rejected")};
    }
    s.margin = rec.optional_number("margin");
    s.prompt = message_text(msgs, msgs.size());
    s.prompt_ids = tmpl.encode_prompt(tok, msgs);
    for (const auto& text : s.reply_texts) s.replies.push_back(tmpl.encode_reply(tok, text));
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
  const auto& tmpl = ChatTemplate::get(opt.template_name);
  const auto r = read_jsonl(path, opt.on_error, [&](const Record& rec) {
    const auto msgs = record_messages(rec, opt.prompt_field, "", false);
    PromptSample s;
    s.prompt = message_text(msgs, msgs.size());
    s.prompt_ids = tmpl.encode_prompt(tok, msgs);
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
    const auto reward = rec.number("reward");
    auto s = make_sft_sample(tok, record_messages(rec, opt.prompt_field, opt.response_field, true), opt, ds.stats_);
    if (!s) return;
    ds.samples_.push_back({std::move(s->input_ids), std::move(s->labels), s->prompt_tokens, reward,
                           std::move(s->prompt), std::move(s->response)});
  });
  absorb(ds.stats_, r);
  require_samples(path, ds.samples_, ds.stats_);
  return ds;
}

}  // namespace anvil::data
