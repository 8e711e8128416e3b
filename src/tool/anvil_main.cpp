// anvil: the tools around training (generation, tokenization, ...), the
// whole program behind anvil::tool::anvil_main (apps/anvil calls it).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "anvil/tool/tool.h"
#include "core/cli.h"
#include "anvil/core/error.h"
#include "anvil/generation/generate.h"
#include "core/fs.h"
#include "core/hub_cache.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "data/jsonl.h"
#include "data/token_shards.h"
#include "distributed/checkpoint.h"
#include "distributed/comm.h"
#include "distributed/env.h"
#include "distributed/sharding.h"
#include "distributed/tensor_parallel.h"
#include "anvil/checkpoint/hf_model.h"
#include "checkpoint/peft.h"
#include "models/lora.h"
#include "anvil/train/ilql.h"
#include "io/safetensors.h"
#include "rewards/reward_model.h"
#include "anvil/tokenizer/tokenizer.h"
#include "tool/data_commands.h"

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
      if (!id.is_number_integer())
        throw anvil::DataError(anvil::concat(input, ": entry ", i, ": ids must be integers"));
      const auto v = id.get<int64_t>();
      if (v < 0 || v >= vocab)
        throw anvil::DataError(anvil::concat(input, ": entry ", i, ": token id ", v, " is outside [0, ", vocab, ")"));
      row.push_back(v);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

/// Where the model tools run: --device (cpu, cuda, cuda:N) and --dtype.
struct Placement {
  std::string device = "cpu", dtype = "float32";
  void apply(anvil::models::CausalLM& model) const {
    c10::optional<at::Device> d;
    try {
      d = at::Device(device);
    } catch (const std::exception&) {
      throw anvil::ConfigError(anvil::concat("--device: expected cpu, cuda or cuda:N, got \"", device, "\""));
    }
    if (d->is_cuda() && !at::hasCUDA())
      throw anvil::ConfigError(anvil::concat("--device: ", device, ", but this machine has no CUDA device"));
    model.to(*d, anvil::distributed::parse_dtype(dtype));
  }
};

/// generate, chat and logits need the LM head a reward model does not keep.
std::shared_ptr<anvil::models::CausalLM> load_language_model(const std::string& dir, const Placement& where) {
  auto model = anvil::checkpoint::load_model_dir(dir);
  if (model->has_score_head())
    throw anvil::ConfigError(anvil::concat("--model: ", dir, " is a reward model (",
                                           model->hf_config()["architectures"][0].get<std::string>(),
                                           " with a score head, no LM head); score it with anvil score"));
  where.apply(*model);
  return model;
}

/// --tensor-parallel T: the T ranks of this launch (mpirun, torchrun or srun) each keep a share of every block
/// (Megatron's tensor parallelism, docs/distributed.md); they decode the same prompts with the same seeds, so the
/// tokens are one process's. Returns the group (null for T = 1).
std::shared_ptr<anvil::distributed::Communicator> split_across_ranks(anvil::models::CausalLM& model, int64_t tp) {
  if (tp <= 1) return nullptr;
  const auto proc = anvil::distributed::discover_from_environment();
  if (proc.world_size != tp)
    throw anvil::ConfigError(
        anvil::concat("--tensor-parallel: ", tp, " splits each block across that many ranks, and this launch has ",
                      proc.world_size, "; start it as mpirun -np ", tp, " (or torchrun --nproc-per-node ", tp, ")"));
  auto comm = anvil::distributed::make_communicator(proc, model.parameters().front().device(), {});
  anvil::distributed::apply_tensor_parallel(model, comm, "--tensor-parallel");
  return comm;
}

/// --ilql-beta: sample an ILQL checkpoint with advantage-shaped scores.
void use_ilql_heads(anvil::models::CausalLM& model, const std::string& dir, double beta,
                    anvil::generation::SamplingOptions& opt) {
  if (beta < 0) return;
  try {
    opt.score_fn = anvil::train::ilql_score_fn(model, beta);
  } catch (const std::invalid_argument& e) {
    throw anvil::ConfigError(
        anvil::concat("--ilql-beta: ", dir, ": ", e.what(), "; it takes a checkpoint of algorithm: ilql"));
  }
}

/// How the chat tools pick a model folder's chat format.
struct ChatFormatFlags {
  std::string name;       // --template ("" = the folder's)
  bool force = false;     // --force-template
  std::string system;     // --system
  bool show_ids = false;  // --show-prompt-ids
  std::string kwargs;     // --template-kwargs (a JSON object)
};

/// --template-kwargs as the template's extra inputs (data::record_tools' form:
/// the variables plus "tools": null), "" without it.
std::string template_inputs(const ChatFormatFlags& f) {
  if (f.kwargs.empty()) return {};
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(f.kwargs);
  } catch (const nlohmann::json::exception&) {
  }
  if (!j.is_object())
    throw anvil::ConfigError(
        anvil::concat("--template-kwargs: expected a JSON object of template variables, e.g. "
                      "'{\"enable_thinking\": false}', got '",
                      f.kwargs, "'"));
  for (const char* reserved :
       {"messages", "add_generation_prompt", "tools", "documents", "bos_token", "eos_token", "pad_token"})
    if (j.contains(reserved))
      throw anvil::ConfigError(anvil::concat("--template-kwargs: \"", reserved,
                                             "\" is set by Anvil itself; expected other template variables"));
  j["tools"] = nullptr;
  return j.dump();
}

/// The folder's recorded format, unless --template names another: a
/// contradiction is an error, or with --force-template a logged override.
const anvil::chat::ChatTemplate& folder_template(const anvil::tokenizer::Tokenizer& tok, const std::string& model_dir,
                                                 const ChatFormatFlags& f) {
  return anvil::chat::ChatTemplate::get(anvil::chat::resolve_chat_template(
      tok, f.name.empty() ? "auto" : f.name, "--template", model_dir, f.force ? "" : "--force-template"));
}

void show_prompt_ids(const std::vector<int64_t>& ids) {
  std::cerr << "prompt ids: " << nlohmann::json(ids).dump() << "\n";
}

/// A prompt must leave the model room for one new token: longer, it is an
/// error naming `what`, its length and the limit, or with --truncate left it
/// keeps its last tokens, saying so.
void fit_prompt(std::vector<int64_t>& ids, int64_t positions, int64_t max_new_tokens, bool truncate_left,
                const std::string& what) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t limit = positions - 1;
  if (n > limit) {
    if (!truncate_left)
      throw anvil::DataError(anvil::concat(what, ": the prompt is ", n, " tokens; the model reads at most ", positions,
                                           " positions, prompt and reply together, so a prompt may hold ", limit,
                                           "; shorten it, or pass --truncate left to keep its last tokens"));
    const int64_t keep = std::max<int64_t>(1, std::min(limit, positions - max_new_tokens));
    ids.erase(ids.begin(), ids.end() - keep);
    anvil::log::warn(what, ": the prompt is ", n, " tokens; kept its last ", keep,
                     " (--truncate left; the model reads ", positions, " positions)");
  }
}

/// Says so when the model's positions stopped `reply` (to `prompt`) before
/// its end of turn and before --max-new-tokens: a reply that ends within
/// them is whole, however little room was left.
void report_cut_reply(const std::vector<int64_t>& prompt, const std::vector<int64_t>& reply, int64_t positions,
                      const anvil::generation::SamplingOptions& opt, const std::string& what) {
  const auto n = static_cast<int64_t>(prompt.size()), r = static_cast<int64_t>(reply.size());
  const bool ended = !reply.empty() && opt.eos_id >= 0 && reply.back() == opt.eos_id;
  if (!ended && r < opt.max_new_tokens && n + r >= positions)
    anvil::log::warn(what, ": the reply is cut at ", r, " tokens, where the model's ", positions, " positions end (a ",
                     n, "-token prompt, --max-new-tokens ", opt.max_new_tokens, ")");
}

int cmd_generate(const std::string& model_dir, const std::vector<std::string>& prompts, const std::string& input,
                 const std::string& output, anvil::generation::SamplingOptions opt, bool eos_given, bool chat,
                 const ChatFormatFlags& format, double ilql_beta, bool truncate_left, const Placement& where,
                 int64_t tensor_parallel) {
  auto place = where;  // each rank of a tensor-parallel launch on its own GPU
  if (tensor_parallel > 1 && place.device == "cuda")
    place.device = anvil::concat("cuda:", anvil::distributed::discover_from_environment().local_rank);
  auto model = load_language_model(model_dir, place);
  const auto group = split_across_ranks(*model, tensor_parallel);
  const bool writes = !group || group->rank() == 0;  // rank 0 writes what every rank decoded
  use_ilql_heads(*model, model_dir, ilql_beta, opt);
  if (!eos_given) opt.eos_id = model->special_tokens.eos;
  if (!input.empty()) {  // ids in, ids out
    auto ids = read_id_lists(input, /*equal_lengths=*/false, model->vocab_size());
    for (size_t i = 0; i < ids.size(); ++i)
      fit_prompt(ids[i], model->max_positions(), opt.max_new_tokens, truncate_left,
                 anvil::concat(input, ": entry ", i));
    auto outs = anvil::generation::generate(*model, ids, opt);
    for (size_t i = 0; i < ids.size(); ++i)
      report_cut_reply(ids[i], outs[i], model->max_positions(), opt, anvil::concat(input, ": entry ", i));
    if (writes) anvil::fs::write_file_atomic(output, nlohmann::json(outs).dump() + "\n");
    return 0;
  }
  auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(model_dir);
  if (!eos_given) opt.eos_id = tok->eos_id();
  std::vector<std::vector<int64_t>> ids;
  if (chat) {  // each prompt is one user turn in the folder's chat format
    const auto& tmpl = folder_template(*tok, model_dir, format);
    if (!eos_given) opt.eos_id = tmpl.end_of_turn_id(*tok);
    const auto inputs = template_inputs(format);
    for (const auto& p : prompts) {
      std::vector<anvil::chat::Message> msgs;
      if (!format.system.empty()) msgs.push_back({"system", format.system});
      msgs.push_back({"user", p});
      ids.push_back(tmpl.encode_prompt(*tok, msgs, inputs));
    }
  } else {
    for (const auto& p : prompts) ids.push_back(tok->encode(p));
  }
  for (size_t i = 0; i < ids.size(); ++i)
    fit_prompt(ids[i], model->max_positions(), opt.max_new_tokens, truncate_left, anvil::concat("--prompt ", i + 1));
  if (format.show_ids)
    for (const auto& p : ids) show_prompt_ids(p);
  auto outs = anvil::generation::generate(*model, ids, opt);
  for (size_t i = 0; i < prompts.size(); ++i) {
    report_cut_reply(ids[i], outs[i], model->max_positions(), opt, anvil::concat("--prompt ", i + 1));
    if (chat && !outs[i].empty() && outs[i].back() == opt.eos_id) outs[i].pop_back();
    if (writes)
      std::cout << nlohmann::json({{"prompt", prompts[i]}, {"generated", tok->decode(outs[i])}}).dump() << "\n";
  }
  return 0;
}

/// Reads user turns from stdin; each reply continues the conversation so far.
int cmd_chat(const std::string& model_dir, anvil::generation::SamplingOptions opt, bool keep_history,
             const ChatFormatFlags& format, double ilql_beta, bool truncate_left, const Placement& where) {
  auto model = load_language_model(model_dir, where);
  use_ilql_heads(*model, model_dir, ilql_beta, opt);
  auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(model_dir);
  const auto& tmpl = folder_template(*tok, model_dir, format);
  const auto& system = format.system;
  const auto inputs = template_inputs(format);
  opt.eos_id = tmpl.end_of_turn_id(*tok);
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty)
    std::cerr << "anvil chat: " << model->family() << " from " << model_dir << " (" << tmpl.name()
              << " format). Empty line or /quit ends, /reset forgets the conversation.\n";
  std::vector<anvil::chat::Message> history;
  anvil::generation::Decoder decoder(*model);  // one for the whole conversation
  std::string line;
  int64_t line_no = 0;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line) || line.empty() || line == "/quit") break;
    ++line_no;
    if (line == "/reset") {
      history.clear();
      continue;
    }
    if (!keep_history) history.clear();
    history.push_back({"user", line});
    // Keep at least half the context for the prompt; generate() caps the reply to what is left.
    const auto room = std::max(model->max_positions() / 2, model->max_positions() - opt.max_new_tokens);
    std::vector<int64_t> prompt;
    while (true) {  // forget the oldest turns until the prompt fits
      std::vector<anvil::chat::Message> msgs;
      if (!system.empty()) msgs.push_back({"system", system});
      msgs.insert(msgs.end(), history.begin(), history.end());
      prompt = tmpl.encode_prompt(*tok, msgs, inputs);
      if (static_cast<int64_t>(prompt.size()) <= room || history.size() <= 1) break;
      history.erase(history.begin(), history.begin() + std::min<size_t>(2, history.size() - 1));
    }
    // The turn itself is never cut silently: it fits, or it is refused (or cut as --truncate left asks).
    const auto what = tty ? std::string("this line") : anvil::concat("line ", line_no);
    try {
      fit_prompt(prompt, model->max_positions(), opt.max_new_tokens, truncate_left, what);
    } catch (const anvil::DataError& e) {
      if (!tty) throw;
      std::cerr << "error: " << e.what() << "\n";
      history.pop_back();
      continue;
    }
    if (format.show_ids) show_prompt_ids(prompt);
    auto reply = decoder.generate({prompt}, opt)[0];
    report_cut_reply(prompt, reply, model->max_positions(), opt, what);
    if (!reply.empty() && reply.back() == opt.eos_id) reply.pop_back();
    const auto text = tok->decode(reply);
    std::cout << text << std::endl;
    history.push_back({"assistant", text});
  }
  return 0;
}

int cmd_logits(const std::string& model_dir, const std::string& input, const std::string& output,
               const Placement& where) {
  auto model = load_language_model(model_dir, where);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto rows = read_id_lists(input, /*equal_lengths=*/true, model->vocab_size());
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  auto ids =
      at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  auto logits = model->forward(ids.to(model->parameters().front().device())).to(at::kCPU, at::kFloat);  // (B, T, V)
  anvil::io::save_safetensors(output, {{"logits", logits}});
  return 0;
}

/// Scores every reply of every line with a reward model; one JSON line out per line in.
int cmd_score(const std::string& model_dir, const std::string& input, const ChatFormatFlags& format, int64_t batch_size,
              const Placement& where) {
  const auto rm = anvil::rewards::RewardModel::load(model_dir, format.name, format.force);
  where.apply(*rm.model_ptr());
  struct Line {
    int64_t number;
    size_t replies;
    bool pair;
  };
  std::vector<Line> lines;
  std::vector<std::vector<int64_t>> rows;  // prompt + reply, one per reply, in line order
  int64_t line_no = 0;
  anvil::data::read_jsonl(input, anvil::data::OnError::fail, [&](const anvil::data::Record& r) {
    Line l{++line_no, 0, false};
    std::vector<std::string> replies;
    if (r.has("ranked")) {
      const auto& list = r.at("ranked");
      if (!list.is_array() || list.empty()) r.fail("ranked", "expected a list of replies");
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string()) r.fail(anvil::concat("ranked[", i, "]"), "expected a string");
        replies.push_back(list[i].get<std::string>());
      }
    } else if (r.has("chosen") || r.has("rejected")) {
      replies = {r.string("chosen"), r.string("rejected")};
      l.pair = true;
    } else {
      replies = {r.string("response")};
    }
    // The prompt as the reward model was trained on it (anvil::data::PreferenceDataset).
    const auto prompt = anvil::data::record_messages(r, "prompt", "", false);
    const bool text = anvil::data::is_text_prompt(r, "prompt");
    const auto tools = anvil::data::record_tools(r);
    if (format.show_ids) show_prompt_ids(rm.encode_prompt(prompt, text, tools));
    for (const auto& reply : replies) {
      auto row = rm.encode(prompt, text, reply, tools);
      if (static_cast<int64_t>(row.size()) > rm.model().max_positions())
        throw anvil::DataError(anvil::concat(r.where(), ": prompt + reply is ", row.size(),
                                             " tokens; the model reads at most ", rm.model().max_positions()));
      rows.push_back(std::move(row));
    }
    l.replies = replies.size();
    lines.push_back(l);
  });
  const auto scores = rm.score(rows, batch_size);
  size_t k = 0;
  int64_t pairs = 0, correct = 0;
  for (const auto& l : lines) {
    std::vector<double> r(scores.begin() + static_cast<std::ptrdiff_t>(k),
                          scores.begin() + static_cast<std::ptrdiff_t>(k + l.replies));
    k += l.replies;
    nlohmann::json out = {{"line", l.number}, {"rewards", r}};
    if (l.pair) {
      out["chosen"] = r[0];
      out["rejected"] = r[1];
    }
    for (size_t a = 0; a < r.size(); ++a)
      for (size_t b = a + 1; b < r.size(); ++b) {
        ++pairs;
        correct += r[a] > r[b];
      }
    std::cout << out.dump() << "\n";
  }
  if (pairs > 0)
    std::cerr << "anvil score: " << lines.size() << " lines; replies ranked as listed (best first) in " << correct
              << " of " << pairs << " pairs (" << 100.0 * static_cast<double>(correct) / static_cast<double>(pairs)
              << "%)\n";
  return 0;
}

/// anvil export: a checkpoint (plain or sharded) as one HF folder; a LoRA
/// checkpoint with --merge-lora as its base with the adapters folded in.
int cmd_export(const std::string& ckpt, const std::string& out, const std::string& dtype, bool merge_lora,
               const std::string& base) {
  if (merge_lora || anvil::checkpoint::is_peft_adapter_dir(ckpt)) {
    if (!merge_lora)
      throw anvil::ConfigError(
          anvil::concat("export: ", ckpt,
                        " is a LoRA adapter (adapter_config.json): add --merge-lora to write its base model with "
                        "the adapters folded in (the folder itself loads in PEFT as is)"));
    if (!anvil::checkpoint::is_peft_adapter_dir(ckpt))
      throw anvil::ConfigError(
          anvil::concat("export --merge-lora: ", ckpt, " has no adapter_config.json; it is not a LoRA checkpoint"));
    anvil::checkpoint::check_export_target(out, dtype);
    auto model = anvil::checkpoint::load_model_dir(ckpt, base);
    anvil::models::merge_lora(*model);
    std::unique_ptr<anvil::tokenizer::Tokenizer> tok;
    if (anvil::tokenizer::has_tokenizer(ckpt)) tok = anvil::tokenizer::load_tokenizer_from_model_dir(ckpt);
    anvil::checkpoint::write_model_dir_atomic(*model, tok.get(), out, dtype);
    std::cout << "exported " << ckpt << " with its LoRA adapters merged to " << out << " (" << dtype << ")\n";
    return 0;
  }
  const bool sharded = anvil::distributed::is_sharded_checkpoint(ckpt);
  if (sharded)
    anvil::distributed::export_sharded_checkpoint(ckpt, out, dtype);
  else
    anvil::checkpoint::export_model_dir(ckpt, out, dtype);
  std::cout << "exported " << (sharded ? "(consolidated shards of) " : "") << ckpt << " to " << out << " (" << dtype
            << ")\n";
  return 0;
}

/// A subcommand and what runs when it is the one given.
using Command = std::pair<CLI::App*, std::function<int()>>;

void add_placement(CLI::App* cmd, Placement& where) {
  cmd->add_option("--device", where.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", where.dtype, "Weights and compute: float32, bfloat16 or float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
}

/// generate's and chat's decoding flags.
struct SamplingFlags {
  anvil::generation::SamplingOptions opt;
  double temperature = 0;
  bool greedy = false;
  double ilql_beta = -1;
  bool truncate_left = false;

  void add(CLI::App* cmd) {
    auto* g = cmd->add_flag("--greedy", greedy, "Greedy decoding (the default)");
    cmd->add_option("--max-new-tokens", opt.max_new_tokens, "Tokens to generate per prompt")->capture_default_str();
    auto* t = cmd->add_option("--temperature", temperature, "Sample at this temperature (> 0) instead of greedy");
    cmd->add_option("--top-k", opt.top_k, "Keep the k most likely tokens (0 = off)")->needs(t);
    cmd->add_option("--top-p", opt.top_p, "Keep the smallest set with probability >= p (1 = off)")->needs(t);
    cmd->add_option("--min-p", opt.min_p, "Drop tokens less likely than p times the likeliest (0 = off)")
        ->check(CLI::Range(0.0, 1.0))
        ->needs(t);
    cmd->add_option("--seed", opt.seed, "Sampling seed")->needs(t);
    cmd->add_option("--repetition-penalty", opt.repetition_penalty,
                    "Divide positive (multiply negative) scores of the prompt's and output's tokens (1 = off)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--presence-penalty", opt.presence_penalty, "Subtract from the scores of tokens already output");
    cmd->add_option("--frequency-penalty", opt.frequency_penalty,
                    "Subtract, per occurrence, from the scores of tokens already output");
    cmd->add_option_function<std::string>(
           "--cuda-graphs",
           [this](const std::string& v) {
             opt.cuda_graphs = v == "on"    ? anvil::generation::CudaGraphs::kOn
                               : v == "off" ? anvil::generation::CudaGraphs::kOff
                                            : anvil::generation::CudaGraphs::kAuto;
           },
           "Decode steps on CUDA as one captured graph: auto (on where possible), on or off")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    cmd->add_option_function<std::string>(
           "--truncate", [this](const std::string& v) { truncate_left = v == "left"; },
           "A prompt longer than the model's positions: none (an error, the default) or left (keep its last "
           "tokens, with a warning)")
        ->check(CLI::IsMember({"none", "left"}));
    cmd->add_option("--ilql-beta", ilql_beta,
                    "An ILQL checkpoint: choose from log-softmax + beta (min target Q - V), its heads' advantage "
                    "shaping (0 = the LM alone)")
        ->check(CLI::NonNegativeNumber);
    g->excludes(t);
  }
  anvil::generation::SamplingOptions options() const {
    auto o = opt;
    if (temperature > 0) {
      o.greedy = false;
      o.temperature = temperature;
    }
    return o;
  }
};

/// --template (needing `needs` when given), --force-template, --show-prompt-ids.
void add_format(CLI::App* cmd, ChatFormatFlags& fmt, CLI::Option* needs) {
  auto* t = cmd->add_option("--template", fmt.name,
                            "Chat format: plain, chatml, llama3, oasst, or hf (the folder's "
                            "own Jinja chat_template as written; default: the format "
                            "the folder's tokenizer_config.json records, else plain)");
  auto* f = cmd->add_flag("--force-template", fmt.force,
                          "Use --template even where it contradicts the folder's "
                          "recorded format");
  f->needs(t);
  cmd->add_flag("--show-prompt-ids", fmt.show_ids, "Print each prompt's token ids (JSON) to stderr");
  if (needs) t->needs(needs);
}

/// --template-kwargs, for the commands that render generation prompts.
void add_template_kwargs(CLI::App* cmd, ChatFormatFlags& fmt) {
  cmd->add_option("--template-kwargs", fmt.kwargs,
                  "More variables for the folder's own Jinja chat_template, a JSON object, as "
                  "apply_chat_template(..., **kwargs) passes them: '{\"enable_thinking\": false}' gives Qwen3's "
                  "prompt without thinking");
}

/// --model / --tokenizer / --base: a folder (or file), or a Hugging Face model
/// id (owner/name[@revision]) read from the local cache, replaced by its
/// snapshot folder; an id not in the cache says where Anvil looked.
CLI::Validator hub_path() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (const auto r = anvil::hub::resolve(s)) {
          s = r->string();
          return "";
        }
        if (anvil::hub::is_repo_id(s))
          return anvil::concat(
              "\"", s, "\" is no folder here, nor a model in the Hugging Face cache: ", anvil::hub::explain_missing(s));
        return "";
      },
      "PATH|HUB_ID");
}

Command add_generate(CLI::App& app) {
  struct Flags {
    std::string model_dir, in, out;
    std::vector<std::string> prompts;
    int64_t eos_id = -1;
    bool chat = false;
    ChatFormatFlags fmt;
    SamplingFlags sampling;
    Placement where;
    CLI::Option* eos = nullptr;
    int64_t tensor_parallel = 1;
  };
  auto f = std::make_shared<Flags>();
  auto* gen = app.add_subcommand("generate", "Continue prompts (token ids or text) with a model folder");
  gen->add_option("--model", f->model_dir, "Model folder (a checkpoint, an export or an HF folder)")
      ->required()
      ->transform(hub_path());
  auto* gin = gen->add_option("--input", f->in, "ids.json: a JSON list of token-id lists (any lengths)");
  auto* gout = gen->add_option("--output", f->out, "out.json: a JSON list of the generated id lists");
  auto* gp = gen->add_option("--prompt", f->prompts, "Prompt text (repeatable; \\n is a newline); prints JSON lines");
  gin->needs(gout);
  gout->needs(gin);
  gp->excludes(gin);
  f->eos = gen->add_option("--eos-id", f->eos_id,
                           "Stop token (default: the model's eos_token_id, or with --chat "
                           "the format's end of turn; -1 = none)");
  gen->add_option("--batch-size", f->sampling.opt.batch_size, "Prompts decoded together (0 = all)");
  auto* gchat = gen->add_flag("--chat", f->chat, "Each --prompt is a user turn in the folder's chat format");
  gchat->needs(gp);
  add_format(gen, f->fmt, gchat);
  add_template_kwargs(gen, f->fmt);
  gen->add_option("--system", f->fmt.system, "With --chat: a system turn before each prompt")->needs(gchat);
  f->sampling.add(gen);
  add_placement(gen, f->where);
  gen->add_option("--tensor-parallel", f->tensor_parallel,
                  "Split each block across the ranks of an mpirun/torchrun launch of this many (Megatron's tensor "
                  "parallelism); rank 0 writes the output")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return {gen, [f] {
            for (auto& p : f->prompts) {  // a typed "\n" is a newline
              std::string out;
              for (size_t i = 0; i < p.size(); ++i) out += p.compare(i, 2, "\\n") == 0 ? (++i, '\n') : p[i];
              p = std::move(out);
            }
            if (f->prompts.empty() && f->in.empty())
              throw anvil::ConfigError("generate: give --input/--output or --prompt");
            auto opt = f->sampling.options();
            const bool eos_given = f->eos->count() > 0;
            if (eos_given) opt.eos_id = f->eos_id;
            return cmd_generate(f->model_dir, f->prompts, f->in, f->out, opt, eos_given, f->chat, f->fmt,
                                f->sampling.ilql_beta, f->sampling.truncate_left, f->where, f->tensor_parallel);
          }};
}

Command add_chat(CLI::App& app) {
  struct Flags {
    std::string model_dir;
    bool no_history = false;
    ChatFormatFlags fmt;
    SamplingFlags sampling;
    Placement where;
  };
  auto f = std::make_shared<Flags>();
  auto* chat = app.add_subcommand("chat", "Talk to a model folder: one user turn per line on stdin");
  chat->add_option("--model", f->model_dir, "Model folder with its tokenizer")->required()->transform(hub_path());
  chat->add_flag("--no-history", f->no_history, "Answer each line on its own, forgetting earlier turns");
  add_format(chat, f->fmt, nullptr);
  add_template_kwargs(chat, f->fmt);
  chat->add_option("--system", f->fmt.system, "System prompt: a system turn first (plain: a line before the user's)");
  f->sampling.add(chat);
  add_placement(chat, f->where);
  return {chat, [f] {
            return cmd_chat(f->model_dir, f->sampling.options(), !f->no_history, f->fmt, f->sampling.ilql_beta,
                            f->sampling.truncate_left, f->where);
          }};
}

Command add_export(CLI::App& app) {
  struct Flags {
    std::string ckpt, out, dtype = "float32", base;
    bool merge_lora = false;
  };
  auto f = std::make_shared<Flags>();
  auto* exp = app.add_subcommand("export", "Write a checkpoint's model as a standalone Hugging Face folder");
  exp->add_option("--checkpoint", f->ckpt, "checkpoint-N/ folder, sharded or not (or any supported HF folder)")
      ->required();
  exp->add_option("--output", f->out, "New folder to write (must not exist or be empty)")->required();
  exp->add_option("--dtype", f->dtype, "Weights dtype: float32, bfloat16 or float16")->capture_default_str();
  exp->add_flag("--merge-lora", f->merge_lora,
                "The checkpoint is a LoRA adapter (a run with lora.r): write its base model with the adapters folded "
                "into the weights");
  exp->add_option("--base", f->base,
                  "With --merge-lora: the base model's folder (default: adapter_config.json's base_model_name_or_path)")
      ->transform(hub_path());
  return {exp, [f] { return cmd_export(f->ckpt, f->out, f->dtype, f->merge_lora, f->base); }};
}

Command add_logits(CLI::App& app) {
  struct Flags {
    std::string model_dir, in, out;
    Placement where;
  };
  auto f = std::make_shared<Flags>();
  auto* logc = app.add_subcommand("logits", "Write a model's logits for given token ids");
  logc->add_option("--model", f->model_dir, "Model folder (HF layout)")->required()->transform(hub_path());
  logc->add_option("--input", f->in, "ids.json: a JSON list of equal-length token-id lists")->required();
  logc->add_option("--output", f->out, "out.safetensors with float32 `logits` [batch, seq, vocab]")->required();
  add_placement(logc, f->where);
  return {logc, [f] { return cmd_logits(f->model_dir, f->in, f->out, f->where); }};
}

Command add_score(CLI::App& app) {
  struct Flags {
    std::string model_dir, in;
    int64_t batch = 64;
    ChatFormatFlags fmt;
    Placement where;
  };
  auto f = std::make_shared<Flags>();
  auto* scorec =
      app.add_subcommand("score", "Score replies with a reward model: one JSON line of rewards per input line");
  scorec->add_option("--model", f->model_dir, "Reward-model folder (a checkpoint or export of algorithm: reward)")
      ->required()
      ->transform(hub_path());
  add_placement(scorec, f->where);
  scorec
      ->add_option("--input", f->in,
                   "JSONL: {prompt, chosen, rejected}, {prompt, ranked: [...]} or "
                   "{prompt, response} per line")
      ->required();
  add_format(scorec, f->fmt, nullptr);
  scorec->add_option("--batch-size", f->batch, "Replies scored together")->capture_default_str();
  return {scorec, [f] { return cmd_score(f->model_dir, f->in, f->fmt, std::max<int64_t>(1, f->batch), f->where); }};
}

Command add_tokenize(CLI::App& app) {
  struct Flags {
    std::string tok_path, type = "auto", in, out;
    bool decode = false, keep_special = false;
  };
  auto f = std::make_shared<Flags>();
  auto* tokc = app.add_subcommand("tokenize", "Tokenize (or --decode) one line at a time");
  tokc->add_option("--tokenizer", f->tok_path, "Tokenizer file (tokenizer.json, .model) or a folder holding one")
      ->required()
      ->transform(hub_path());
  tokc->add_option("--type", f->type, "auto, hf or sentencepiece")->capture_default_str();
  tokc->add_option("--input", f->in, "Text lines (or JSON id lists with --decode); - reads standard input")->required();
  tokc->add_option("--output", f->out,
                   "ids.jsonl: one JSON list of ids per line (or text with --decode); - writes standard output")
      ->required();
  tokc->add_flag("--decode", f->decode, "Decode JSON id lists back to text");
  tokc->add_flag("--keep-special-tokens", f->keep_special, "With --decode: keep special tokens (BOS, EOS, ...)");
  return {tokc, [f] { return cmd_tokenize(f->tok_path, f->type, f->in, f->out, f->decode, f->keep_special); }};
}

Command add_prepare(CLI::App& app) {
  struct Flags {
    std::string tok_path, type = "auto", out, on_error = "fail", format = "anvil";
    std::vector<std::string> in, text_fields;
    int64_t shard_tokens = int64_t{1} << 28;
    bool no_eos = false;
  };
  auto f = std::make_shared<Flags>();
  auto* prep = app.add_subcommand("prepare", "Tokenize pretraining text into memory-mapped token shards");
  prep->add_option("--tokenizer", f->tok_path, "Tokenizer file or a folder holding one")
      ->required()
      ->transform(hub_path());
  prep->add_option("--type", f->type, "auto, hf or sentencepiece")->capture_default_str();
  prep->add_option("--input", f->in,
                   "A .jsonl file (one {text} document a line) or a text file (one document "
                   "a line); repeatable")
      ->required();
  prep->add_option("--output", f->out,
                   "New folder for meta.json and the shards (--format megatron: the "
                   "PREFIX of PREFIX.bin and PREFIX.idx)")
      ->required();
  prep->add_option("--format", f->format,
                   "anvil (token shards) or megatron (a GPT-NeoX / Megatron indexed "
                   "dataset, MMIDIDX)")
      ->check(CLI::IsMember({"anvil", "megatron"}))
      ->capture_default_str();
  prep->add_option("--text-field", f->text_fields,
                   "JSONL field holding the text (default text; repeat to join "
                   "several fields, e.g. --text-field prompt --text-field response)");
  prep->add_option("--shard-tokens", f->shard_tokens, "Tokens per shard")->capture_default_str();
  prep->add_flag("--no-eos", f->no_eos, "Do not end each document with EOS");
  prep->add_option("--on-error", f->on_error, "Malformed JSONL lines: fail or skip")->capture_default_str();
  return {prep, [f] {
            return cmd_prepare(f->tok_path, f->type, f->in, f->out,
                               f->text_fields.empty() ? std::vector<std::string>{"text"} : f->text_fields,
                               f->shard_tokens, f->no_eos, f->on_error, f->format);
          }};
}

}  // namespace

namespace anvil::tool {

int anvil_main(int argc, char** argv) {
  CLI::App app{"anvil: tools around Anvil training runs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("anvil ") + anvil::version(), "Print the version and exit");
  const std::vector<Command> commands = {add_generate(app), add_chat(app),     add_export(app), add_logits(app),
                                         add_score(app),    add_tokenize(app), add_prepare(app)};
  CLI11_PARSE(app, argc, argv);
  return anvil::run_reporting_errors([&] {
    for (const auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
    return 0;
  });
}

}  // namespace anvil::tool
