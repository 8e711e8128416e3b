// anvil: the tools around training (generation, tokenization, ...).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>
#include <c10/util/Exception.h>

#include <unistd.h>

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

/// ids.json: a JSON list of token-id lists (same length when `equal_lengths`).
std::vector<std::vector<int64_t>> read_id_lists(const std::string& input, bool equal_lengths, int64_t vocab) {
  auto j = nlohmann::json::parse(anvil::fs::read_file(input), nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty())
    throw anvil::DataError(anvil::concat(input, ": expected a JSON list of token-id lists"));
  std::vector<std::vector<int64_t>> rows;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_array() || j[i].empty())
      throw anvil::DataError(anvil::concat(input, ": entry ", i, ": expected a non-empty list of token ids"));
    if (equal_lengths && j[i].size() != j[0].size())
      throw anvil::DataError(anvil::concat(input, ": entry ", i, " has ", j[i].size(), " ids, expected ", j[0].size(),
                                           " (all rows must have the same length)"));
    std::vector<int64_t> row;
    for (const auto& id : j[i]) {
      if (!id.is_number_integer()) throw anvil::DataError(anvil::concat(input, ": entry ", i, ": ids must be integers"));
      const auto v = id.get<int64_t>();
      if (v < 0 || v >= vocab)
        throw anvil::DataError(anvil::concat(input, ": entry ", i, ": token id ", v, " is outside [0, ", vocab, ")"));
      row.push_back(v);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

int cmd_generate(const std::string& model_dir, const std::vector<std::string>& prompts, const std::string& input,
                 const std::string& output, anvil::generation::SamplingOptions opt, bool eos_given) {
  auto model = anvil::io::load_model_dir(model_dir);
  if (!eos_given) opt.eos_id = model->special_tokens.eos;
  if (!input.empty()) {  // ids in, ids out
    auto ids = read_id_lists(input, /*equal_lengths=*/false, model->vocab_size());
    auto outs = anvil::generation::generate(*model, ids, opt);
    anvil::fs::write_file_atomic(output, nlohmann::json(outs).dump() + "\n");
    return 0;
  }
  auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(model_dir);
  if (!eos_given) opt.eos_id = tok->eos_id();
  std::vector<std::vector<int64_t>> ids;
  for (const auto& p : prompts) ids.push_back(tok->encode(p));
  auto outs = anvil::generation::generate(*model, ids, opt);
  for (size_t i = 0; i < prompts.size(); ++i)
    std::cout << nlohmann::json({{"prompt", prompts[i]}, {"generated", tok->decode(outs[i])}}).dump() << "\n";
  return 0;
}

/// Reads user turns from stdin; each reply continues the conversation so far.
int cmd_chat(const std::string& model_dir, anvil::generation::SamplingOptions opt, bool keep_history) {
  auto model = anvil::io::load_model_dir(model_dir);
  auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(model_dir);
  opt.eos_id = tok->eos_id();
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty) std::cerr << "anvil chat: " << model->family() << " from " << model_dir
                     << ". Empty line or /quit ends, /reset forgets the conversation.\n";
  std::vector<int64_t> history;
  std::string line;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line) || line.empty() || line == "/quit") break;
    if (line == "/reset") {
      history.clear();
      continue;
    }
    // Plain format (as the SFT data): the user's text and a newline, then the reply and EOS.
    auto turn = tok->encode(line + "\n");
    std::vector<int64_t> prompt = keep_history ? history : std::vector<int64_t>{};
    prompt.insert(prompt.end(), turn.begin(), turn.end());
    // Keep at least half the context for the prompt; generate() caps the reply to what is left.
    const auto room = std::max(model->max_positions() / 2, model->max_positions() - opt.max_new_tokens);
    if (static_cast<int64_t>(prompt.size()) > room)  // forget the oldest tokens
      prompt.erase(prompt.begin(), prompt.end() - room);
    auto reply = anvil::generation::generate(*model, {prompt}, opt)[0];
    std::vector<int64_t> text = reply;
    if (!text.empty() && text.back() == opt.eos_id) text.pop_back();
    std::cout << tok->decode(text) << std::endl;
    history = prompt;
    history.insert(history.end(), reply.begin(), reply.end());
  }
  return 0;
}

int cmd_logits(const std::string& model_dir, const std::string& input, const std::string& output) {
  auto model = anvil::io::load_model_dir(model_dir);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto rows = read_id_lists(input, /*equal_lengths=*/true, model->vocab_size());
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  auto ids = at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
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

  std::string model_dir;
  anvil::generation::SamplingOptions opt;
  double temperature = 0;
  bool greedy = false;
  int64_t eos_id = -1;
  auto add_sampling = [&](CLI::App* cmd) {
    auto* g = cmd->add_flag("--greedy", greedy, "Greedy decoding (the default)");
    cmd->add_option("--max-new-tokens", opt.max_new_tokens, "Tokens to generate per prompt")->capture_default_str();
    auto* t = cmd->add_option("--temperature", temperature, "Sample at this temperature (> 0) instead of greedy");
    cmd->add_option("--top-k", opt.top_k, "Keep the k most likely tokens (0 = off)")->needs(t);
    cmd->add_option("--top-p", opt.top_p, "Keep the smallest set with probability >= p (1 = off)")->needs(t);
    cmd->add_option("--seed", opt.seed, "Sampling seed")->needs(t);
    g->excludes(t);
  };

  auto* gen = app.add_subcommand("generate", "Continue prompts (token ids or text) with a model folder");
  std::vector<std::string> prompts;
  std::string gen_in, gen_out;
  gen->add_option("--model", model_dir, "Model folder (a checkpoint, an export or an HF folder)")->required();
  auto* gin = gen->add_option("--input", gen_in, "ids.json: a JSON list of token-id lists (any lengths)");
  auto* gout = gen->add_option("--output", gen_out, "out.json: a JSON list of the generated id lists");
  auto* gp = gen->add_option("--prompt", prompts, "Prompt text (repeatable; \\n is a newline); prints JSON lines");
  gin->needs(gout);
  gout->needs(gin);
  gp->excludes(gin);
  auto* geos = gen->add_option("--eos-id", eos_id, "Stop token (default: the model's eos_token_id; -1 = none)");
  gen->add_option("--batch-size", opt.batch_size, "Prompts decoded together (0 = all)");
  add_sampling(gen);

  auto* chat = app.add_subcommand("chat", "Talk to a model folder: one user turn per line on stdin");
  bool no_history = false;
  chat->add_option("--model", model_dir, "Model folder with its tokenizer")->required();
  chat->add_flag("--no-history", no_history, "Answer each line on its own, forgetting earlier turns");
  add_sampling(chat);

  auto* exp = app.add_subcommand("export", "Write a checkpoint's model as a standalone Hugging Face folder");
  std::string ckpt, exp_out, exp_dtype = "float32";
  exp->add_option("--checkpoint", ckpt, "checkpoint-N/ folder (or any supported HF folder)")->required();
  exp->add_option("--output", exp_out, "New folder to write (must not exist or be empty)")->required();
  exp->add_option("--dtype", exp_dtype, "Weights dtype: float32, bfloat16 or float16")->capture_default_str();

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
    if (temperature > 0) {
      opt.greedy = false;
      opt.temperature = temperature;
    }
    if (gen->parsed()) {
      for (auto& p : prompts)
        for (size_t pos; (pos = p.find("\\n")) != std::string::npos;) p.replace(pos, 2, "\n");
      if (prompts.empty() && gen_in.empty()) throw anvil::ConfigError("generate: give --input/--output or --prompt");
      if (geos->count() > 0) opt.eos_id = eos_id;
      return cmd_generate(model_dir, prompts, gen_in, gen_out, opt, geos->count() > 0);
    }
    if (chat->parsed()) return cmd_chat(model_dir, opt, !no_history);
    if (exp->parsed()) {
      anvil::io::export_model_dir(ckpt, exp_out, exp_dtype);
      std::cout << "exported " << ckpt << " to " << exp_out << " (" << exp_dtype << ")\n";
      return 0;
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
