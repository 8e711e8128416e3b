// Special tokens added to any tokenizer (tokenizer.add_special_tokens), as
// transformers' add_special_tokens does: matched in text before the base
// tokenizer sees it, given ids after the base vocabulary, and saved so that
// the folder reloads with them, in Anvil and in transformers.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "anvil/tokenizer/tokenizer.h"
#include "backends.h"

namespace anvil::tokenizer {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr const char* kAddedTokensFile = "added_tokens.json";

json read_object(const stdfs::path& file) {
  if (!stdfs::exists(file)) return json::object();
  auto j = json::parse(fs::read_file(file), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(concat(file.string(), ": expected a JSON object"));
  return j;
}

json added_token_entry(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

class WithSpecialTokens final : public Tokenizer {
 public:
  WithSpecialTokens(std::unique_ptr<Tokenizer> base, const std::vector<std::string>& tokens) : base_(std::move(base)) {
    set_chat_template(base_->chat_template());
    int64_t next = base_->vocab_size();
    for (const auto& t : tokens) {
      if (t.empty()) throw Error("add_special_tokens: an empty token");
      if (ids_.count(t)) continue;
      const auto have = base_->token_to_id(t);
      const int64_t id = have ? *have : next++;
      ids_[t] = id;
      strings_[id] = t;
      if (!have) fresh_.push_back(t);
    }
    size_ = next;
  }

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> out;
    size_t start = 0, pos = 0;
    auto flush = [&](size_t end) {
      if (end > start) {
        const auto ids = base_->encode(text.substr(start, end - start));
        out.insert(out.end(), ids.begin(), ids.end());
      }
    };
    while (pos < text.size()) {
      const std::string* match = nullptr;  // the longest added token at `pos`
      for (const auto& [t, id] : ids_)
        if (text.compare(pos, t.size(), t) == 0 && (!match || t.size() > match->size())) match = &t;
      if (!match) {
        ++pos;
        continue;
      }
      flush(pos);
      out.push_back(ids_.at(*match));
      pos += match->size();
      start = pos;
    }
    flush(text.size());
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    std::string out;
    std::vector<int64_t> run;
    for (const auto id : ids) {
      const auto it = strings_.find(id);
      if (it == strings_.end()) {
        run.push_back(id);
        continue;
      }
      out += base_->decode(run, skip_special_tokens);
      run.clear();
      if (!skip_special_tokens) out += it->second;
    }
    return out + base_->decode(run, skip_special_tokens);
  }

  int64_t vocab_size() const override { return size_; }
  int64_t bos_id() const override { return base_->bos_id(); }
  int64_t eos_id() const override { return base_->eos_id(); }
  int64_t pad_id() const override { return base_->pad_id(); }
  bool add_bos() const override { return base_->add_bos(); }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    const auto it = ids_.find(std::string(token));
    if (it != ids_.end()) return it->second;
    return base_->token_to_id(token);
  }
  std::string kind() const override { return base_->kind(); }

  void save(const stdfs::path& dir) const override {
    base_->set_chat_template(chat_template());
    base_->save(dir);
    // tokenizer.json lists added tokens itself; a SentencePiece folder keeps
    // the new ones in added_tokens.json, as transformers' slow tokenizers do.
    if (stdfs::exists(dir / "tokenizer.json")) {
      auto j = read_object(dir / "tokenizer.json");
      auto& added = j["added_tokens"];
      if (!added.is_array()) added = json::array();
      for (const auto& [t, id] : ids_) {
        const auto wanted = id;  // a copy: clang 14 (the fuzz build) cannot capture a structured binding
        const bool listed =
            std::any_of(added.begin(), added.end(), [wanted](const json& a) { return a.value("id", -1) == wanted; });
        if (!listed) added.push_back(added_token_entry(id, t));
      }
      fs::write_file_atomic(dir / "tokenizer.json", j.dump(2) + "\n");
    } else if (!fresh_.empty()) {
      json a = json::object();
      for (const auto& t : fresh_) a[t] = ids_.at(t);
      fs::write_file_atomic(dir / kAddedTokensFile, a.dump(2) + "\n");
    }
    auto cfg = read_object(dir / "tokenizer_config.json");
    auto& extra = cfg["additional_special_tokens"];
    if (!extra.is_array()) extra = json::array();
    auto& decoder = cfg["added_tokens_decoder"];
    if (!decoder.is_object()) decoder = json::object();
    for (const auto& [t, id] : ids_) {
      if (std::find(extra.begin(), extra.end(), json(t)) == extra.end()) extra.push_back(t);
      auto entry = added_token_entry(id, t);
      entry.erase("id");
      decoder[std::to_string(id)] = entry;
    }
    fs::write_file_atomic(dir / "tokenizer_config.json", detail::tokenizer_config_text(cfg));
  }

 private:
  std::unique_ptr<Tokenizer> base_;
  std::map<std::string, int64_t> ids_;
  std::map<int64_t, std::string> strings_;
  std::vector<std::string> fresh_;  // not in the base vocabulary, in id order
  int64_t size_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> with_special_tokens(std::unique_ptr<Tokenizer> base,
                                               const std::vector<std::string>& tokens) {
  if (tokens.empty()) return base;
  return std::make_unique<WithSpecialTokens>(std::move(base), tokens);
}

namespace detail {

std::unique_ptr<Tokenizer> with_saved_special_tokens(std::unique_ptr<Tokenizer> base, const stdfs::path& dir) {
  const auto file = dir / kAddedTokensFile;
  if (!stdfs::exists(file)) return base;
  const auto j = read_object(file);
  std::vector<std::pair<int64_t, std::string>> by_id;
  for (const auto& [t, id] : j.items()) {
    if (!id.is_number_integer()) throw Error(concat(file.string(), ": ", t, ": expected an integer id"));
    by_id.emplace_back(id.get<int64_t>(), t);
  }
  std::sort(by_id.begin(), by_id.end());
  std::vector<std::string> tokens;
  for (size_t i = 0; i < by_id.size(); ++i) {
    const auto expected = base->vocab_size() + static_cast<int64_t>(i);
    if (by_id[i].first != expected)
      throw Error(concat(file.string(), ": \"", by_id[i].second, "\" has id ", by_id[i].first, ", expected ", expected,
                         " (added tokens follow the base vocabulary of ", base->vocab_size(), " in order)"));
    tokens.push_back(by_id[i].second);
  }
  return with_special_tokens(std::move(base), tokens);
}

}  // namespace detail
}  // namespace anvil::tokenizer
