#pragma once
// Scoring with a reward model: a folder trained with `algorithm: reward` (a
// ...ForSequenceClassification model: a score head on the last non-pad
// token), its tokenizer and the chat format it was trained in. Shared by
// `anvil score`, evaluation and RL rollouts.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/models/causal_lm.h"
#include "anvil/tokenizer/tokenizer.h"

namespace anvil::rewards {

class RewardModel {
 public:
  /// Loads a reward-model folder (a checkpoint or an export). `format` names
  /// the chat format: "" takes the one the folder records; a name that
  /// contradicts it is an error unless `force_format`. Throws ConfigError
  /// naming `key` (the flag or config key that named the folder) when the
  /// folder has no score head.
  static RewardModel load(const std::filesystem::path& dir, const std::string& format = "", bool force_format = false,
                          const std::string& key = "--model");

  RewardModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
              const std::string& template_name);

  /// The prompt as training rendered it (anvil::data::PreferenceDataset):
  /// the template's generation prompt, or with `plain` a text prompt as
  /// written. `tools`: the record's (data::record_tools), for hf templates.
  std::vector<int64_t> encode_prompt(const std::vector<chat::Message>& prompt, bool text_prompt,
                                     const std::string& tools = {}) const;
  /// Prompt + reply (+ the end of turn), the row a reward is read from.
  std::vector<int64_t> encode(const std::vector<chat::Message>& prompt, bool text_prompt, const std::string& reply,
                              const std::string& tools = {}) const;

  /// One reward per row of token ids. Rows are right-padded with the
  /// tokenizer's padding id, `batch_size` at a time, without gradients.
  /// Throws Error for a row longer than the model's context.
  std::vector<float> score(const std::vector<std::vector<int64_t>>& rows, int64_t batch_size = 64) const;

  models::CausalLM& model() const { return *model_; }
  const std::shared_ptr<models::CausalLM>& model_ptr() const { return model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tok_; }
  const chat::ChatTemplate& chat_template() const { return *tmpl_; }

 private:
  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  const chat::ChatTemplate* tmpl_;
};

}  // namespace anvil::rewards
