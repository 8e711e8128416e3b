// anvil: the tools around training (generation, tokenization, ...).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>
#include <c10/util/Exception.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "anvil/generation/generate.h"
#include "anvil/core/fs.h"
#include "anvil/io/hf_model.h"
#include "anvil/io/safetensors.h"
#include "anvil/tokenizer/tokenizer.h"

namespace {

int cmd_generate(const std::string& model_dir, const std::vector<std::string>& prompts,
                 anvil::generation::SamplingOptions opt) {
  auto model = anvil::io::load_model_dir(model_dir);
  auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(model_dir);
  opt.eos_id = tok->eos_id();
  std::vector<std::vector<int64_t>> ids;
  for (const auto& p : prompts) ids.push_back(tok->encode(p));
  auto outs = anvil::generation::generate(*model, ids, opt);
  for (size_t i = 0; i < prompts.size(); ++i)
    std::cout << nlohmann::json({{"prompt", prompts[i]}, {"generated", tok->decode(outs[i])}}).dump() << "\n";
  return 0;
}

int cmd_logits(const std::string& model_dir, const std::string& input, const std::string& output) {
  auto j = nlohmann::json::parse(anvil::fs::read_file(input), nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty())
    throw anvil::DataError(anvil::concat(input, ": expected a JSON list of token-id lists"));
  std::vector<int64_t> flat;
  size_t len = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_array() || j[i].empty())
      throw anvil::DataError(anvil::concat(input, ": entry ", i, ": expected a non-empty list of token ids"));
    if (i == 0) len = j[i].size();
    if (j[i].size() != len)
      throw anvil::DataError(anvil::concat(input, ": entry ", i, " has ", j[i].size(), " ids, expected ", len,
                                           " (all rows must have the same length)"));
    for (const auto& id : j[i]) {
      if (!id.is_number_integer()) throw anvil::DataError(anvil::concat(input, ": entry ", i, ": ids must be integers"));
      flat.push_back(id.get<int64_t>());
    }
  }
  auto model = anvil::io::load_model_dir(model_dir);
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = at::tensor(flat, at::kLong).view({static_cast<int64_t>(j.size()), static_cast<int64_t>(len)});
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= model->vocab_size())
    throw anvil::DataError(anvil::concat(input, ": token ids must lie in [0, ", model->vocab_size(), ")"));
  auto logits = model->forward(ids).to(at::kFloat);  // (B, T, V)
  anvil::io::save_safetensors(output, {{"logits", logits}});
  return 0;
}

int cmd_tokenize(const std::string& tok_path, const std::string& type, const std::string& input,
                 const std::string& output, bool decode) {
  auto tok = std::filesystem::is_directory(tok_path) ? anvil::tokenizer::load_tokenizer_from_model_dir(tok_path)
                                                      : anvil::tokenizer::load_tokenizer(type, tok_path);
  std::ifstream in(input);
  if (!in) throw anvil::Error(anvil::concat(input, ": cannot open"));
  std::ofstream out(output);
  if (!out) throw anvil::Error(anvil::concat(output, ": cannot open for writing"));
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!decode) {
      out << nlohmann::json(tok->encode(line)).dump() << "\n";
      continue;
    }
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_array())
      throw anvil::DataError(anvil::concat(input, ":", lineno, ": expected a JSON list of token ids"));
    out << tok->decode(j.get<std::vector<int64_t>>()) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anvil: tools around Anvil training runs"};
  app.require_subcommand(1);

  auto* gen = app.add_subcommand("generate", "Continue text prompts with a model folder (HF layout)");
  std::string model_dir;
  std::vector<std::string> prompts;
  anvil::generation::SamplingOptions opt;
  double temperature = 0;
  gen->add_option("--model", model_dir, "Model folder (a checkpoint or an export)")->required();
  gen->add_option("--prompt", prompts, "Prompt text (repeatable); \\n is a newline")->required();
  gen->add_option("--max-new-tokens", opt.max_new_tokens, "Tokens to generate")->capture_default_str();
  gen->add_option("--temperature", temperature, "Sample at this temperature (default: greedy)");
  gen->add_option("--top-k", opt.top_k, "Top-k sampling (0 = off)");
  gen->add_option("--top-p", opt.top_p, "Nucleus sampling (1 = off)");
  gen->add_option("--seed", opt.seed, "Sampling seed");

  auto* logc = app.add_subcommand("logits", "Write a model's logits for given token ids");
  std::string logits_in, logits_out;
  logc->add_option("--model", model_dir, "Model folder (HF layout)")->required();
  logc->add_option("--input", logits_in, "ids.json: a JSON list of equal-length token-id lists")->required();
  logc->add_option("--output", logits_out, "out.safetensors with float32 `logits` [batch, seq, vocab]")->required();

  auto* tokc = app.add_subcommand("tokenize", "Tokenize (or --decode) one line at a time");
  std::string tok_path, tok_type = "sentencepiece", input, output;
  bool decode = false;
  tokc->add_option("--tokenizer", tok_path, "Tokenizer file or model folder")->required();
  tokc->add_option("--type", tok_type, "Tokenizer type of a file")->capture_default_str();
  tokc->add_option("--input", input, "Text lines (or JSON id lists with --decode)")->required();
  tokc->add_option("--output", output, "ids.jsonl (or text with --decode)")->required();
  tokc->add_flag("--decode", decode, "Decode JSON id lists back to text");

  CLI11_PARSE(app, argc, argv);
  try {
    if (gen->parsed()) {
      for (auto& p : prompts)
        for (size_t pos; (pos = p.find("\\n")) != std::string::npos;) p.replace(pos, 2, "\n");
      if (temperature > 0) {
        opt.greedy = false;
        opt.temperature = temperature;
      }
      return cmd_generate(model_dir, prompts, opt);
    }
    if (logc->parsed()) return cmd_logits(model_dir, logits_in, logits_out);
    if (tokc->parsed()) return cmd_tokenize(tok_path, tok_type, input, output, decode);
  } catch (const anvil::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
  return 0;
}
