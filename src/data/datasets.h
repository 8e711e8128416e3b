#pragma once
// JSONL datasets, tokenized once at load: SFT, preference pairs, prompts
// (for RL) and offline RL. Formats and options: docs/data.md.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "data/jsonl.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::data {

/// Datasets hold conversations as chat/ renders them: data::Message and
/// data::kIgnoreIndex name chat's.
using chat::kIgnoreIndex;
using chat::Message;

/// A language-modelling sample: ids, labels (kIgnoreIndex = not trained) and
/// where documents start inside it ({0} for one document).
struct LmSample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;
  std::vector<int64_t> doc_starts{0};
};

/// What the causal-LM batch source reads: SFT samples or token-shard windows.
class LmDataset {
 public:
  virtual ~LmDataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t length(int64_t i) const = 0;  // tokens in sample i
  virtual void get(int64_t i, LmSample& out) const = 0;
  virtual std::string name() const = 0;
};

/// Options shared by the JSONL readers.
struct ReadOptions {
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  /// The run's chat format (set up once by the run, passed down); null:
  /// plain.
  const chat::ChatTemplate* chat = nullptr;
  int64_t max_length = 0;      // 0 = unlimited
  bool drop_overflow = false;  // else truncate (responses from the right)
  bool train_on_prompt = false;
  bool add_eos = true;  // plain template: EOS after each response
  OnError on_error = OnError::fail;
  /// SFT conversations with several replies (data.split_turns): one sample
  /// (never), one per assistant turn (always), or per turn only where the
  /// template renders earlier replies differently (auto).
  enum class SplitTurns { never, always, automatic };
  SplitTurns split_turns = SplitTurns::automatic;
};

/// The chat format `opt` renders with: opt.chat, else plain.
const chat::ChatTemplate& chat_format(const ReadOptions& opt);

/// What loading did to the data, reported to the user.
struct DatasetStats {
  int64_t lines = 0;
  int64_t skipped_errors = 0;     // malformed lines skipped (on_error: skip)
  int64_t truncated = 0;          // kept, cut to max_length
  int64_t dropped_overflow = 0;   // longer than max_length with on_overflow: drop
  int64_t dropped_no_target = 0;  // nothing left to train on (all masked or truncated away)
  std::vector<std::string> first_errors;
  std::string summary() const;
};

/// A conversation from a record: `messages` ([{role, content}, ...]) when
/// present, else [{user: prompt}] (+ [{assistant: response}] when given).
/// A message may carry tool use (OpenAI/TRL: `tool_calls`, a `tool` role
/// with `tool_call_id` or `name`, a null content beside tool_calls): it is
/// kept whole in Message::json for hf templates.
std::vector<Message> record_messages(const Record& r, const std::string& prompt_field,
                                     const std::string& response_field, bool with_response);

/// The record's `tools` (TRL's column: a list of JSON function schemas) as
/// JSON text in the line's key order, for ChatTemplate::encode; empty when
/// the record has none.
std::string record_tools(const Record& r);

/// Whether the record's prompt is text rather than a conversation (TRL's
/// non-conversational formats): no `messages`, and a string prompt (or, with
/// an implicit prompt, string replies). With the plain template such a prompt
/// is used as written, where a conversation's user turns end in a newline.
bool is_text_prompt(const Record& r, const std::string& prompt_field);

/// A prompt to continue from, as every reader renders it: with `plain` and a
/// text prompt, BOS (when the tokenizer adds one) + the text as written;
/// otherwise the template's generation prompt for `messages`.
std::vector<int64_t> encode_record_prompt(const tokenizer::Tokenizer& tok, const chat::ChatTemplate& tmpl,
                                          const std::vector<Message>& messages, bool text_prompt,
                                          const std::string& tools = {});

struct SftSample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;  // aligned with input_ids; kIgnoreIndex where not trained
  int64_t prompt_tokens = 0;    // tokens before the first trained one
  std::string prompt;           // text of the prompt (or the conversation before the last reply)
  std::string response;         // text of the last reply
};

class SftDataset final : public LmDataset {
 public:
  /// {prompt, response} or {messages} lines. Throws DataError naming file,
  /// line and field of a malformed record (unless on_error: skip).
  static SftDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok, const ReadOptions& opt);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  int64_t length(int64_t i) const override {
    return static_cast<int64_t>(samples_[static_cast<size_t>(i)].input_ids.size());
  }
  void get(int64_t i, LmSample& out) const override;
  std::string name() const override { return name_; }
  const SftSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::vector<SftSample> samples_;
  DatasetStats stats_;
  std::string name_;
};

/// Tokenizes one sample as the dataset does (shared with tests): the
/// template's rendering, then max_length handling. Returns nothing when the
/// sample is dropped (and counts why in `stats`).
/// `text_pair`: a text prompt and a text reply (not a conversation), which
/// the plain template joins as written (prompt + response + EOS). `tools`:
/// record_tools().
std::optional<SftSample> make_sft_sample(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                         const ReadOptions& opt, DatasetStats& stats, bool text_pair = false,
                                         const std::string& tools = {});
/// The samples of one record: make_sft_sample's, or with opt.split_turns one
/// per assistant turn (ChatTemplate::encode_turns), each with max_length
/// handling and counted in `stats` as a sample of its own.
std::vector<SftSample> make_sft_samples(const tokenizer::Tokenizer& tok, const std::vector<Message>& messages,
                                        const ReadOptions& opt, DatasetStats& stats, bool text_pair = false,
                                        const std::string& tools = {});

/// {prompt, chosen, rejected[, margin]} or {prompt, ranked: [best, ..., worst]}:
/// prompt is a string or a messages list; the replies are competing assistant
/// turns, best first.
struct PreferenceSample {
  std::vector<int64_t> prompt_ids;            // rendered prompt with the assistant header
  std::vector<std::vector<int64_t>> replies;  // each reply + end of turn, best first (K >= 2)
  std::optional<double> margin;
  std::string prompt;
  std::vector<std::string> reply_texts;
  const std::vector<int64_t>& chosen_ids() const { return replies.front(); }
  const std::vector<int64_t>& rejected_ids() const { return replies.back(); }
  bool is_pair() const { return replies.size() == 2; }
};

class PreferenceDataset {
 public:
  /// prompt + reply longer than max_length: the reply is truncated from the
  /// right (or the pair dropped); a prompt that leaves no room drops the pair.
  static PreferenceDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                const ReadOptions& opt);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const PreferenceSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::vector<PreferenceSample> samples_;
  DatasetStats stats_;
};

/// {prompt}: prompts for on-policy RL (chat::PromptSample, which the rewards
/// read).
using chat::PromptSample;

class PromptDataset {
 public:
  /// Prompts longer than max_length are dropped (truncating a prompt changes the question).
  static PromptDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok, const ReadOptions& opt);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const PromptSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::vector<PromptSample> samples_;
  DatasetStats stats_;
};

/// {prompt, response, reward}: logged interactions for offline RL (ILQL).
struct OfflineRlSample {
  std::vector<int64_t> input_ids;  // prompt + response + end of turn
  std::vector<int64_t> labels;     // response tokens (+ end of turn), kIgnoreIndex elsewhere
  int64_t prompt_tokens = 0;
  double reward = 0;  // the response's reward (with token_rewards: their sum)
  /// Optional per-token rewards ("rewards": one number per labelled token, the
  /// end of turn included); empty when the record gives one scalar "reward".
  std::vector<double> token_rewards;
  std::string prompt, response;
};

class OfflineRlDataset {
 public:
  static OfflineRlDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                               const ReadOptions& opt);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const OfflineRlSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const DatasetStats& stats() const { return stats_; }

 private:
  std::vector<OfflineRlSample> samples_;
  DatasetStats stats_;
};

}  // namespace anvil::data
