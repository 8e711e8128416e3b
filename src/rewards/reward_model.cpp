#include "rewards/reward_model.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "anvil/core/error.h"
#include "data/datasets.h"
#include "anvil/checkpoint/hf_model.h"

namespace anvil::rewards {

RewardModel RewardModel::load(const std::filesystem::path& dir, const std::string& format, bool force_format,
                              const std::string& key) {
  auto model = checkpoint::load_model_dir(dir);
  if (!model->has_score_head())
    throw ConfigError(concat(key, ": ", dir.string(), " is not a reward model (its config.json names ",
                             model->hf_config()["architectures"][0].get<std::string>(),
                             "; expected a ...ForSequenceClassification folder from algorithm: reward)"));
  std::shared_ptr<const tokenizer::Tokenizer> tok = tokenizer::load_tokenizer_from_model_dir(dir);
  const auto name = chat::resolve_chat_template(*tok, format.empty() ? "auto" : format, "--template", dir.string(),
                                                force_format ? "" : "--force-template");
  return RewardModel(std::move(model), std::move(tok), name);
}

RewardModel::RewardModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
                         const std::string& template_name)
    : model_(std::move(model)), tok_(std::move(tok)), tmpl_(&chat::ChatTemplate::get(template_name)) {
  TORCH_CHECK(model_->has_score_head(), "RewardModel: the model has no score head");
}

std::vector<int64_t> RewardModel::encode_prompt(const std::vector<chat::Message>& prompt, bool text_prompt,
                                                const std::string& tools) const {
  return data::encode_record_prompt(*tok_, *tmpl_, prompt, text_prompt, tools);
}

std::vector<int64_t> RewardModel::encode(const std::vector<chat::Message>& prompt, bool text_prompt,
                                         const std::string& reply, const std::string& tools) const {
  auto row = encode_prompt(prompt, text_prompt, tools);
  const auto r = tmpl_->encode_reply(*tok_, reply);
  row.insert(row.end(), r.begin(), r.end());
  return row;
}

std::vector<float> RewardModel::score(const std::vector<std::vector<int64_t>>& rows, int64_t batch_size) const {
  for (size_t i = 0; i < rows.size(); ++i)
    if (static_cast<int64_t>(rows[i].size()) > model_->max_positions() || rows[i].empty())
      throw Error(concat("reward model: row ", i, " has ", rows[i].size(), " tokens; expected 1 to ",
                         model_->max_positions(), " (the model's context)"));
  const int64_t pad = tok_->padding_id();
  const auto device = model_->parameters().front().device();
  const bool was_training = model_->is_training();
  model_->eval();
  torch::NoGradGuard no_grad;
  std::vector<float> out;
  out.reserve(rows.size());
  const auto step = static_cast<size_t>(std::max<int64_t>(1, batch_size));
  for (size_t i = 0; i < rows.size(); i += step) {
    const auto end = std::min(rows.size(), i + step);
    size_t T = 0;
    for (size_t j = i; j < end; ++j) T = std::max(T, rows[j].size());
    auto ids = at::full({static_cast<int64_t>(end - i), static_cast<int64_t>(T)}, pad, at::kLong);
    for (size_t j = i; j < end; ++j) std::copy(rows[j].begin(), rows[j].end(), ids.data_ptr<int64_t>() + (j - i) * T);
    ids = ids.to(device);
    auto s = model_->score(model_->hidden_states(ids, {}), models::last_non_pad_index(ids, pad)).to(at::kCPU);
    s = s.to(at::kFloat).contiguous();
    out.insert(out.end(), s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  }
  if (was_training) model_->train();
  return out;
}

}  // namespace anvil::rewards
