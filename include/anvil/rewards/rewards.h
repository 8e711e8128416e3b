#pragma once
// Rewards of sampled responses: every source behind one interface, shared by
// PPO's rollouts and evaluations and ILQL's evaluations (neither depends on
// the other). A reward section (ppo.reward, ppo.rewards[i], ilql.reward)
// names one source:
//   exact_match  1 when the response, trimmed, equals a field of the prompt record, else 0
//   regex        1 when the response contains a match of the pattern a field of the record holds
//   command      a reward program: a process speaking JSON lines (RewardProgram)
//   function     a RewardFn a linking program registered (register_reward_function)
//   model        a reward model (RewardModel), frozen and sharded like the policy
// ResponseRewards sums the sources of a section, or of a weighted list, and
// keeps each source's rewards for per-source metrics.
//
//   anvil::rewards::register_reward_function("length_penalty",
//       [](const std::vector<anvil::rewards::RewardQuery>& qs) {
//         std::vector<double> out;
//         for (const auto& q : qs) out.push_back(-0.01 * q.response.size());
//         return out;
//       });
//
// docs/algorithms.md ("Rewards"), docs/library.md.

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/chat/chat.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::rewards {

/// Where PPO's rewards come from (exactly one source).
struct SourceConfig {
  std::string model;
  std::string command;
  double timeout_s = 60;
  std::string exact_match;
  std::string regex;
  std::string function;
  std::string scale = "none";
  double clip = 0;
  int64_t batch_size = 64;

  template <class V>
  void visit(V& v) {
    v.field("model", model,
            "Reward-model folder: an algorithm: reward checkpoint or export, or an HF ...ForSequenceClassification "
            "folder. Frozen, and sharded like the policy.");
    v.field("command", command,
            "Reward program: a shell command started once; it reads one JSON object per line on stdin (the prompt "
            "record as written, plus the sample: {completion, prompt_text, ended}; docs/algorithms.md) and answers one "
            "line "
            "{\"reward\": x} each.");
    v.field("timeout_s", timeout_s, "Seconds the reward program may take to answer one record.",
            config::changeable_on_resume(config::positive()));
    v.field("exact_match", exact_match,
            "Verifiable reward: 1 when the response, trimmed, equals this field of the prompt record, else 0.");
    v.field("regex", regex,
            "Verifiable reward: 1 when the response contains a match of the regular expression (ECMAScript) held "
            "in this field of the prompt record, else 0.");
    v.field("function", function,
            "A reward function a linking program registered (anvil::train::register_reward_function).");
    v.field("scale", scale, "none, or running: divide scores by the running std of every score so far (trlx).",
            config::one_of({"none", "running"}));
    v.field("clip", clip, "Clip (scaled) scores to [-clip, clip] (trlx's cliprange_reward); 0 = off.",
            config::non_negative());
    v.field("batch_size", batch_size, "Rows the reward model scores at once.",
            config::changeable_on_resume(config::positive()));
  }
};

/// One of several reward sources (ppo.rewards): a source as in ppo.reward,
/// its weight in the summed score and the name its metrics take.
struct WeightedSourceConfig : SourceConfig {
  double weight = 1.0;
  std::string name;

  template <class V>
  void visit(V& v) {
    SourceConfig::visit(v);
    v.field("weight", weight, "The source's weight in the score (TRL's reward_weights).");
    v.field("name", name,
            "The name its metrics take (rewards/<name>/mean, /std); empty = the source's key and position "
            "(exact_match_0, ...).");
  }
};

/// What a reward source sees of one sample: the prompt and response texts
/// and the whole prompt record (its extra fields: an answer, tests, ...).
struct RewardQuery {
  std::string prompt;
  std::string response;
  nlohmann::json record;
  bool ended = true;  // the response ended with the end of turn (not cut by max_new_tokens)
};
/// One reward per query, in order.
using RewardFn = std::function<std::vector<double>(const std::vector<RewardQuery>& queries)>;

/// Makes `function: <name>` in a reward section call `fn`. Register before
/// the run starts. Throws ConfigError when the name is taken.
void register_reward_function(const std::string& name, RewardFn fn);

/// How a run holds a model that never trains (train::RunContext::freeze_fn).
using models::FreezeFn;

/// One source of rewards.
class RewardSource {
 public:
  virtual ~RewardSource() = default;
  /// "exact_match", "regex", "command", "function" or "model".
  virtual std::string kind() const = 0;
  /// Loads what the source needs before its first score (a reward model,
  /// held with `freeze`; a program, started). `who` prefixes the log lines.
  virtual void prepare(const FreezeFn& freeze, const std::string& who) {
    (void)freeze;
    (void)who;
  }
  /// One reward per query; `prompts[i]` is the sample queries[i] answers
  /// (its messages, where and record). Throws DataError naming the record's
  /// file:line for a record the source cannot read.
  virtual std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                                    const std::vector<RewardQuery>& queries) = 0;
  /// --dry-run: scores `query`, an answer to `prompt`, outside a run: a
  /// program is started for it, asked and stopped; a source that reads the
  /// record checks it has the field. Returns a line saying what was checked
  /// ("" when the source has nothing to check before a run: a reward model's
  /// folder is checked with the config, a function is the linking program's).
  /// Throws what score() would.
  virtual std::string check(const chat::PromptSample& prompt, const RewardQuery& query) {
    (void)prompt;
    (void)query;
    return "";
  }
  /// Keeps a sharded reward model whole while the result lives (ranks that
  /// score different numbers of rows); nothing for the other sources.
  [[nodiscard]] virtual models::FrozenModel::Gathered gathered() { return models::FrozenModel::Gathered(nullptr); }
};

/// The source a reward section sets, or nullptr when it sets none. `key`
/// names the section in errors ("ppo.rewards[1]"). Throws ConfigError when it
/// sets more than one, or names a function nobody registered.
std::unique_ptr<RewardSource> make_reward_source(const SourceConfig& config, const std::string& key);

/// The JSON line a reward program gets for one sample: the prompt record as
/// written (a reference `response` or `completion` included), plus `sample`:
/// {completion (the sampled text, without the end of turn), prompt_text (the
/// prompt's text: a text prompt as written, a conversation's turns joined by
/// newlines), ended (the sample ended with the end of turn)}; `prompt` and
/// `response` too where the record has no such field. A record with its own
/// `sample` field is a DataError naming `where` and `key`.
nlohmann::json program_record(const RewardQuery& q, const std::string& where, const std::string& key);

/// The sources of a reward section, or of a weighted list of them, summed.
class ResponseRewards {
 public:
  /// `key` names the section in errors ("ppo.reward"). Throws ConfigError
  /// unless exactly one source is set (at most one when not `required`).
  ResponseRewards(const SourceConfig& config, std::string key, bool required);
  /// Several sources summed with their weights (ppo.rewards, named
  /// `list_key` in errors); with an empty `list`, the one of `config`.
  ResponseRewards(const SourceConfig& config, std::string key, const std::vector<WeightedSourceConfig>& list,
                  const std::string& list_key, bool required);
  ~ResponseRewards();
  ResponseRewards(const ResponseRewards&) = delete;
  ResponseRewards& operator=(const ResponseRewards&) = delete;

  bool enabled() const { return !sources_.empty(); }
  /// The one source compares responses with a field exactly (eval/exact_match).
  bool is_exact_match() const;
  /// The sources' metric names, when there are several (rewards/<name>/...).
  std::vector<std::string> names() const;
  /// Loads the reward models (held with `freeze`) or starts the programs;
  /// `who` prefixes the log lines.
  void prepare(const FreezeFn& freeze, const std::string& who);
  /// --dry-run: each source's check() of `query` (an answer to `prompt`);
  /// the lines of those that checked something.
  std::vector<std::string> check(const chat::PromptSample& prompt, const RewardQuery& query);
  /// The raw reward of each response (token ids without the end of turn) to
  /// its prompt: the weighted sum of the sources' rewards; `ended`: the
  /// response ended with the end of turn. With several sources, `components`
  /// (when given) receives each source's unweighted rewards, in names() order.
  std::vector<double> score(const std::vector<const chat::PromptSample*>& prompts,
                            const std::vector<std::vector<int64_t>>& responses, const std::vector<bool>& ended,
                            const tokenizer::Tokenizer& tok, std::vector<std::vector<double>>* components = nullptr);
  /// Keeps sharded reward models whole, for scoring split unevenly among ranks.
  [[nodiscard]] std::vector<models::FrozenModel::Gathered> gathered();

 private:
  struct Weighted {
    std::unique_ptr<RewardSource> source;
    double weight = 1;
    std::string name;
  };
  std::vector<Weighted> sources_;
};

}  // namespace anvil::rewards
