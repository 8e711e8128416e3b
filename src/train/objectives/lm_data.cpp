// The dataset-reading helpers of train/lm_data.h shared by the objectives.
#include "train/objectives/lm_data.h"

#include <filesystem>
#include "data/datasets.h"

namespace anvil::train {

data::OnError on_error(const config::RunConfig& cfg) {
  return cfg.data.on_error == config::OnError::kSkip ? data::OnError::skip : data::OnError::fail;
}

void check_format(const config::DatasetConfig& d, const std::string& key, config::DataFormat format,
                  const std::string& reads) {
  if (d.format != config::DataFormat::kAuto && d.format != format)
    throw ConfigError(concat(key, ".format: ", reads, ", got ", config::kDataFormats.name(d.format)));
}

data::ReadOptions read_options(const config::RunConfig& cfg, const config::DatasetConfig& d,
                               const chat::ChatTemplate& chat) {
  data::ReadOptions o;
  o.prompt_field = d.prompt_field;
  o.response_field = d.response_field;
  o.chat = &chat;
  o.max_length = cfg.data.max_length;
  o.drop_overflow = cfg.data.on_overflow == config::OnOverflow::kDrop;
  o.train_on_prompt = sft_config(cfg).train_on_prompt;
  o.add_eos = sft_config(cfg).add_eos;
  o.on_error = on_error(cfg);
  using Split = data::ReadOptions::SplitTurns;
  const auto split = cfg.data.split_turns;
  o.split_turns = split == config::SplitTurns::kNever    ? Split::never
                  : split == config::SplitTurns::kAlways ? Split::always
                                                         : Split::automatic;
  return o;
}

data::ReadOptions record_read_options(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                      const chat::ChatTemplate& chat, const std::string& key, config::DataFormat format,
                                      const std::string& what) {
  check_format(d, key, format, concat("algorithm ", cfg.algorithm, " reads ", what));
  if (std::filesystem::is_directory(d.path))
    throw ConfigError(concat(key, ".path: algorithm ", cfg.algorithm, " reads a JSONL file of ", what,
                             ", got the folder \"", d.path, "\""));
  data::ReadOptions o;
  o.prompt_field = d.prompt_field;
  o.chat = &chat;
  o.max_length = cfg.data.max_length;
  o.drop_overflow = cfg.data.on_overflow == config::OnOverflow::kDrop;
  o.on_error = on_error(cfg);
  return o;
}

std::shared_ptr<data::PromptDataset> load_prompts(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                                  const std::string& key, const tokenizer::Tokenizer& tok,
                                                  const chat::ChatTemplate& chat) {
  auto o = record_read_options(cfg, d, chat, key, config::DataFormat::kPrompts, "prompts ({prompt} records)");
  auto ds = std::make_shared<data::PromptDataset>(data::PromptDataset::load(d.path, tok, o));
  log::info(d.path, ": ", ds->size(), " prompts (", ds->stats().summary(), ")");
  return ds;
}

}  // namespace anvil::train
