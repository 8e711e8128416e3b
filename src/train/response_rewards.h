#pragma once
// Rewards of sampled responses, shared by PPO's rollouts and evals and ILQL's
// evals: a reward section (ppo.reward, ilql.reward) names one source.
//   exact_match / regex  1 or 0 against a field of the prompt record (RLVR)
//   command              a reward program (rewards::RewardProgram)
//   function             a RewardFn a linking program registered
//   model                a reward model, frozen and sharded like the policy

#include <memory>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/data/datasets.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/objective.h"
#include "anvil/train/ppo.h"

namespace anvil::rewards {
class RewardModel;
class RewardProgram;
}  // namespace anvil::rewards

namespace anvil::train {

/// The JSON line a reward program gets for one sample: the prompt record as
/// written (a reference `response` or `completion` included), plus `sample`:
/// {completion (the sampled text, without the end of turn), prompt_text (the
/// prompt's text: a text prompt as written, a conversation's turns joined by
/// newlines), ended (the sample ended with the end of turn)}; `prompt` and
/// `response` too where the record has no such field. A record with its own
/// `sample` field is a DataError naming `where` and `key`.
nlohmann::json program_record(const RewardQuery& q, const std::string& where, const std::string& key);

class ResponseRewards {
 public:
  /// `key` names the section in errors ("ppo.reward"). Throws ConfigError
  /// unless exactly one source is set (at most one when not `required`).
  ResponseRewards(const config::PpoRewardConfig& config, std::string key, bool required);
  /// Several sources summed with their weights (ppo.rewards, named
  /// `list_key` in errors); with an empty `list`, the one of `config`.
  ResponseRewards(const config::PpoRewardConfig& config, std::string key,
                  const std::vector<config::WeightedRewardConfig>& list, const std::string& list_key, bool required);
  ~ResponseRewards();
  ResponseRewards(const ResponseRewards&) = delete;
  ResponseRewards& operator=(const ResponseRewards&) = delete;

  bool enabled() const { return !sources_.empty(); }
  /// The one source compares responses with a field exactly (eval/exact_match).
  bool is_exact_match() const;
  /// The sources' metric names, when there are several (rewards/<name>/...).
  std::vector<std::string> names() const;
  /// Loads the reward models (ctx.freeze) or starts the programs; `who` prefixes the log lines.
  void prepare(const RunContext& ctx, const std::string& who);
  /// The raw reward of each response (token ids without the end of turn) to
  /// its prompt: the weighted sum of the sources' rewards; `ended`: the
  /// response ended with the end of turn. With several sources, `components`
  /// (when given) receives each source's unweighted rewards, in names() order.
  std::vector<double> score(const std::vector<const data::PromptSample*>& prompts,
                            const std::vector<std::vector<int64_t>>& responses, const std::vector<bool>& ended,
                            const tokenizer::Tokenizer& tok, std::vector<std::vector<double>>* components = nullptr);
  /// Keeps sharded reward models whole, for scoring split unevenly among ranks.
  [[nodiscard]] std::vector<FrozenModel::Gathered> gathered();

 private:
  struct Source;
  std::vector<std::unique_ptr<Source>> sources_;
};

}  // namespace anvil::train
