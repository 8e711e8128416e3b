#include "anvil/data/sft_dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"

namespace anvil::data {

SftSample make_sft_sample(const tokenizer::Tokenizer& tok, std::string prompt, std::string response,
                          const SftOptions& opt) {
  SftSample s;
  auto p = tok.encode(prompt);
  auto r = tok.encode(response);
  if (opt.add_eos) r.push_back(tok.eos_id());
  s.prompt_tokens = static_cast<int64_t>(p.size());
  s.input_ids = p;
  s.input_ids.insert(s.input_ids.end(), r.begin(), r.end());
  s.labels.assign(p.size(), kIgnoreIndex);
  if (opt.train_on_prompt) s.labels = p;
  s.labels.insert(s.labels.end(), r.begin(), r.end());
  s.prompt = std::move(prompt);
  s.response = std::move(response);
  return s;
}

SftDataset SftDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                            const SftOptions& opt) {
  std::ifstream in(path);
  if (!in) throw DataError(concat(path.string(), ": cannot open data file"));
  SftDataset ds;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = concat(path.string(), ":", lineno);
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) throw DataError(concat(where, ": not valid JSON"));
    if (!j.is_object()) throw DataError(concat(where, ": expected a JSON object"));
    auto field = [&](const std::string& name) -> std::string {
      if (!j.contains(name)) throw DataError(concat(where, ": missing field \"", name, "\""));
      if (!j[name].is_string())
        throw DataError(concat(where, ": field \"", name, "\": expected a string, got ", j[name].type_name()));
      return j[name].get<std::string>();
    };
    ++ds.stats_.lines;
    auto s = make_sft_sample(tok, field(opt.prompt_field), field(opt.response_field), opt);
    const bool overflow = opt.max_length > 0 && static_cast<int64_t>(s.input_ids.size()) > opt.max_length;
    if (overflow) {
      if (opt.drop_overflow) {
        ++ds.stats_.dropped_overflow;
        continue;
      }
      s.input_ids.resize(opt.max_length);
      s.labels.resize(opt.max_length);
    }
    // Only labels from position 1 on are predicted (the first token has no context).
    bool has_target = false;
    for (size_t i = 1; i < s.labels.size(); ++i) has_target |= s.labels[i] != kIgnoreIndex;
    if (!has_target) {
      ++ds.stats_.dropped_no_target;
      continue;
    }
    ds.stats_.truncated += overflow;
    ds.samples_.push_back(std::move(s));
  }
  if (ds.samples_.empty())
    throw DataError(concat(path.string(), ": no usable samples (", ds.stats_.lines, " lines read)"));
  return ds;
}

}  // namespace anvil::data
