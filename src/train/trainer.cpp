#include "anvil/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "anvil/core/error.h"
#include "anvil/core/fs.h"
#include "anvil/core/logging.h"
#include "anvil/data/chat.h"
#include "anvil/dist/checkpoint.h"
#include "anvil/dist/comm.h"
#include "anvil/dist/env.h"
#include "anvil/dist/sharding.h"
#include "anvil/io/checkpoint.h"
#include "anvil/io/hf_model.h"
#include "anvil/models/registry.h"
#include "anvil/optim/optimizer.h"
#include "anvil/optim/schedule.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int sig) {
  g_stop.store(true);
  std::signal(sig, SIG_DFL);  // a second signal ends the process at once
}

struct SignalScope {
  SignalScope() {
    g_stop.store(false);
    prev_term = std::signal(SIGTERM, on_stop_signal);
    prev_int = std::signal(SIGINT, on_stop_signal);
  }
  ~SignalScope() {
    std::signal(SIGTERM, prev_term);
    std::signal(SIGINT, prev_int);
  }
  void (*prev_term)(int);
  void (*prev_int)(int);
};

std::string format_number(double x, int precision = 4) {
  std::ostringstream os;
  os << std::setprecision(precision) << x;
  return os.str();
}

std::string fmt_duration(double s) {
  std::ostringstream os;
  const auto t = static_cast<int64_t>(s);
  if (t >= 3600) os << t / 3600 << "h";
  if (t >= 60) os << (t / 60) % 60 << "m";
  os << t % 60 << "s";
  return os.str();
}

std::string progress_line(int64_t step, int64_t max_steps, const Metrics& m, double tok_s, double eta_s) {
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(1, max_steps));
  std::ostringstream os;
  os << "step " << step << "/" << max_steps << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.')
     << "] loss " << std::fixed << std::setprecision(4) << m.at("loss") << " | lr " << std::scientific
     << std::setprecision(2) << m.at("lr") << " | " << std::fixed << std::setprecision(0) << tok_s << " tok/s | eta "
     << fmt_duration(eta_s);
  return os.str();
}

void print_eval(int64_t step, const EvalResult& r) {
  std::ostringstream os;
  os << "eval @ step " << step << ":";
  for (const auto& [k, v] : r.metrics) os << " " << k << "=" << format_number(v);
  log::info(os.str());
  if (r.samples.empty()) return;
  auto clip = [](std::string s) {
    for (auto& c : s)
      if (c == '\n') c = ' ';
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
  };
  std::ostringstream t;
  t << std::left << std::setw(42) << "prompt" << std::setw(42) << "generated" << "reference\n";
  for (const auto& row : r.samples)
    t << std::setw(42) << clip(row[0]) << std::setw(42) << clip(row[1]) << clip(row[2]) << "\n";
  log::info("\n", t.str());
}

at::Device parse_device(const std::string& d) {
  at::Device device(at::kCPU);
  try {
    device = at::Device(d);
  } catch (const c10::Error&) {
    throw ConfigError(concat("train.device: expected cpu, cuda or cuda:N, got \"", d, "\""));
  }
  if (device.is_cuda()) {
    const int n = torch::cuda::device_count();  // a DeviceIndex (int8): printed as a number
    if (n == 0)
      throw ConfigError(concat("train.device: ", d, ", but no usable CUDA GPU is visible (",
                               at::hasCUDA() ? "check nvidia-smi and CUDA_VISIBLE_DEVICES"
                                             : "this LibTorch has no CUDA support",
                               "); use train.device=cpu to train on the CPU"));
    if (device.has_index() && device.index() >= n)
      throw ConfigError(concat("train.device: ", d, ", but ", n, n == 1 ? " GPU is" : " GPUs are",
                               " visible (cuda:0", n > 1 ? concat(" to cuda:", n - 1) : std::string(), ")"));
  }
  return device;
}

/// Builds the model: from model.from (HF folder) or randomly initialised.
std::shared_ptr<models::CausalLM> build_model(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok) {
  std::shared_ptr<models::CausalLM> model;
  if (!cfg.model.from.empty()) {
    model = io::load_model_dir(cfg.model.from);
    log::info("model: loaded ", model->family(), " from ", cfg.model.from);
  } else {
    auto mc = cfg.model;
    if (mc.vocab_size == 0) mc.vocab_size = tok.vocab_size();
    model = models::family_by_name(mc.family).from_config(mc);
  }
  if (model->vocab_size() < tok.vocab_size())
    throw ConfigError(concat("model.vocab_size: ", model->vocab_size(), " is smaller than the tokenizer's ",
                             tok.vocab_size()));
  model->special_tokens = {tok.bos_id(), tok.eos_id(), tok.pad_id()};
  return model;
}

std::unique_ptr<tokenizer::Tokenizer> build_tokenizer(const config::RunConfig& cfg) {
  if (!cfg.tokenizer.path.empty()) return tokenizer::load_tokenizer(cfg.tokenizer.type, cfg.tokenizer.path);
  return tokenizer::load_tokenizer_from_model_dir(cfg.model.from);
}

bool every(int64_t step, int64_t n) { return n > 0 && step % n == 0; }

/// Testing hook for the non-finite guard (docs/reliability.md):
/// ANVIL_TEST_NONFINITE="loss@3,grad@5" makes step 3's loss (on rank 0 only,
/// so the ranks must agree through the reduction) and step 5's gradients
/// (on every rank) infinite.
std::map<int64_t, std::string> injected_nonfinite() {
  std::map<int64_t, std::string> out;
  const char* env = std::getenv("ANVIL_TEST_NONFINITE");
  if (!env) return out;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto at = item.find('@');
    const auto what = item.substr(0, at);
    if (at == std::string::npos || (what != "loss" && what != "grad"))
      throw ConfigError(concat("ANVIL_TEST_NONFINITE: expected loss@STEP or grad@STEP items, got \"", item, "\""));
    out[std::stoll(item.substr(at + 1))] = what;
  }
  return out;
}

/// Global L2 norm of the gradients of `params`, clipped to `max_norm` when larger (0 = only measure).
double clip_or_measure(const std::vector<at::Tensor>& params, double max_norm) {
  if (max_norm > 0) return torch::nn::utils::clip_grad_norm_(params, max_norm);
  at::Tensor sq;  // summed on the device: one host sync
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    auto t = p.grad().to(at::kDouble).pow(2).sum();
    sq = sq.defined() ? sq + t : t;
  }
  return sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
}

}  // namespace

void request_stop() { g_stop.store(true); }

void add_sum(Sums& sums, const std::string& key, const at::Tensor& value) {
  auto v = value.detach().to(at::kDouble);
  auto [it, fresh] = sums.emplace(key, v);
  if (!fresh) it->second = it->second + v;
}

std::vector<double> sum_over_ranks(const RankContext& ranks, std::vector<double> head, Sums& sums) {
  if (!ranks.sum) return head;
  const size_t n = head.size();
  for (const auto& [key, t] : sums) head.push_back(t.item<double>());
  ranks.all_sum(head);
  size_t i = n;
  for (auto& [key, t] : sums) t = at::scalar_tensor(head[i++], at::kDouble);
  head.resize(n);
  return head;
}

StepStats accumulate_gradients(Objective& objective, models::CausalLM& model, const std::vector<Batch>& batches,
                               const AccumulateOptions& options) {
  StepStats s;
  for (const auto& b : batches) {
    s.num_targets += b.num_targets;
    s.num_tokens += b.num_tokens;
  }
  if (options.step_targets > 0) s.num_targets = options.step_targets;
  TORCH_CHECK(s.num_targets > 0, "accumulate_gradients: the step has no target tokens");
  const double scale = 1.0 / static_cast<double>(s.num_targets);
  at::Tensor total;  // summed on the device: one host sync per step, not per micro-batch
  for (size_t i = 0; i < batches.size(); ++i) {
    auto loss = objective.loss_sum(model, batches[i], s.sums);
    if (options.before_backward) options.before_backward(i + 1 == batches.size());
    (loss * scale).backward();
    if (options.after_backward) options.after_backward();
    auto detached = loss.detach().to(at::kDouble);
    total = total.defined() ? total + detached : detached;
  }
  s.loss = total.defined() ? total.item<double>() * scale : 0.0;
  return s;
}

namespace {

int64_t optimizer_bytes(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> ts;
  for (auto& [key, st] : opt.state())
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(st.get())) {
      ts.push_back(a->exp_avg());
      ts.push_back(a->exp_avg_sq());
      if (a->max_exp_avg_sq().defined()) ts.push_back(a->max_exp_avg_sq());
    }
  std::unordered_set<const void*> seen;
  return dist::storage_bytes(ts, seen);
}

}  // namespace

namespace {

/// Row 0 of a batch as text, trained tokens inside [[ ]]; trailing padding
/// (untrained pad tokens) dropped.
std::string render_first_row(const Batch& batch, const tokenizer::Tokenizer& tok) {
  const auto ids_it = batch.tensors.find("input_ids"), labels_it = batch.tensors.find("labels");
  if (ids_it == batch.tensors.end() || labels_it == batch.tensors.end()) return "(this objective's batches hold no input_ids/labels)";
  const auto ids = ids_it->second[0].contiguous(), labels = labels_it->second[0].contiguous();
  const auto* id = ids.data_ptr<int64_t>();
  const auto* label = labels.data_ptr<int64_t>();
  int64_t n = ids.numel();
  const int64_t pad = tok.pad_id() >= 0 ? tok.pad_id() : std::max<int64_t>(0, tok.eos_id());
  while (n > 0 && id[n - 1] == pad && label[n - 1] == data::kIgnoreIndex) --n;
  std::string out;
  for (int64_t i = 0; i < n;) {
    const bool trained = label[i] != data::kIgnoreIndex;
    std::vector<int64_t> span;
    for (; i < n && (label[i] != data::kIgnoreIndex) == trained; ++i) span.push_back(id[i]);
    const auto text = tok.decode(span, false);
    out += trained ? "[[" + text + "]]" : text;
  }
  return out;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return format_number(b, 3) + " " + units[u];
}

std::string format_seconds(double s) {
  if (s < 60) return format_number(s, 3) + " s";
  const auto m = static_cast<int64_t>(s / 60);
  if (m < 60) return concat(m, " min ", static_cast<int64_t>(s) % 60, " s");
  return concat(m / 60, " h ", m % 60, " min");
}

/// The checkpoint a run continues from: train.resume_from, else output_dir's
/// latest complete one (train.resume: auto), else none.
std::optional<stdfs::path> checkpoint_to_resume(const config::RunConfig& cfg, const stdfs::path& out_dir) {
  if (!cfg.train.resume_from.empty()) {
    const stdfs::path from = cfg.train.resume_from;
    if (!stdfs::exists(from / io::kTrainerStateFile))
      throw ConfigError(concat("train.resume_from: ", from.string(), " is not a complete checkpoint (no ",
                               io::kTrainerStateFile, ")"));
    return from;
  }
  auto latest = io::latest_checkpoint(out_dir);
  if (latest && cfg.train.resume == "never")
    throw ConfigError(concat("train.resume: never, but ", out_dir.string(), " holds ", latest->filename().string(),
                             "; use another output_dir, or train.resume: auto to continue that run"));
  return latest;
}

/// A resume compares the new config with the checkpoint's: keys that extend
/// or observe the run may change (each change logged); any other difference
/// stops the run unless train.allow_config_change is set.
void check_resume_config(const stdfs::path& ckpt, const std::string& config_yaml, const config::RunConfig& cfg) {
  const auto saved_path = ckpt / "config.yaml";
  if (!stdfs::exists(saved_path)) {
    log::warn("resume: ", saved_path.string(), " is missing, so the config cannot be compared with the run's");
    return;
  }
  std::vector<config::ConfigChange> blocked;
  for (const auto& c : config::config_changes(fs::read_file(saved_path), config_yaml)) {
    if (config::may_change_on_resume(c.key)) {
      log::info("resume: ", c.key, " changes from ", c.before, " to ", c.after);
    } else if (cfg.train.allow_config_change) {
      log::warn("resume: ", c.key, " changes from ", c.before, " to ", c.after, " (train.allow_config_change)");
    } else {
      blocked.push_back(c);
    }
  }
  if (blocked.empty()) return;
  std::string list;
  for (const auto& c : blocked) list += concat("\n  ", c.key, ": ", c.before, " -> ", c.after);
  throw ConfigError(concat("resuming ", ckpt.string(), ": this config differs from the run's (", saved_path.string(),
                           ") in keys that change training:", list,
                           "\nStart a new run with another output_dir, or set train.allow_config_change=true to "
                           "continue with the new values (each start's config is kept in output_dir/config-history/)."));
}

}  // namespace

TrainResult run_training(const config::RunConfig& cfg, const RunOptions& options) {
  log::configure(log::parse_level(cfg.logging.level));
  const auto proc = dist::discover_from_environment();
  if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
  auto device = parse_device(cfg.train.device);
  if (device.is_cuda() && !device.has_index() && proc.world_size > 1)
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(proc.local_rank));

  // Sharded runs (several ranks, a sharding strategy or mixed precision on
  // one, or one resuming a sharded checkpoint) go through
  // dist::ShardedModel; a plain single-process run keeps HF-layout checkpoints.
  const stdfs::path out_dir = cfg.output_dir;
  const auto config_yaml = config::to_yaml(cfg);
  const auto latest = checkpoint_to_resume(cfg, out_dir);
  // Evaluating a checkpoint continues nothing, so any config may evaluate it.
  if (latest && !options.eval_only) check_resume_config(*latest, config_yaml, cfg);
  const bool sharded_run = proc.world_size > 1 || cfg.dist.sharding != "no_shard" ||
                           cfg.dist.param_dtype != "float32" || cfg.dist.reduce_dtype != "float32" ||
                           (latest && dist::is_sharded_checkpoint(*latest));
  std::shared_ptr<dist::Communicator> comm;
  if (sharded_run) {
    dist::CommOptions co;
    co.backend = cfg.dist.backend;
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    comm = dist::make_communicator(proc, device, co);
  }
  const int64_t world = comm ? comm->world_size() : 1;
  const int64_t rank = comm ? comm->rank() : 0;
  const bool lead = rank == 0;
  if (!lead) log::configure(log::Level::warn);  // one rank reports

  // Batch math: the same global batch whatever the world size.
  const int64_t micro_per_step = cfg.train.global_batch_size > 0
                                     ? cfg.train.global_batch_size / cfg.train.micro_batch_size
                                     : cfg.train.grad_accum_steps;
  if (micro_per_step % world != 0)
    throw ConfigError(concat(cfg.train.global_batch_size > 0 ? "train.global_batch_size" : "train.grad_accum_steps",
                             ": a step of ", micro_per_step, " micro-batches of ", cfg.train.micro_batch_size,
                             " samples does not divide among ", world, " ranks; expected a multiple of ",
                             world * cfg.train.micro_batch_size, " samples per step"));

  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  auto tok = build_tokenizer(cfg);
  auto model = build_model(cfg, *tok);
  model->to(device);
  model->train();
  // data.max_length defaults to the model's context, which model.from only knows once loaded.
  auto data_cfg = cfg;
  if (data_cfg.data.max_length == 0) data_cfg.data.max_length = model->max_positions();
  if (cfg.algorithm != "pretrain") {
    // One chat format from data to checkpoint: the model folder's recorded
    // one unless data.template names another, and the checkpoints record it.
    // The model folder records it, else the tokenizer's own folder.
    const bool from_model = !cfg.model.from.empty() && tokenizer::has_tokenizer(cfg.model.from);
    const auto where = from_model ? cfg.model.from : cfg.tokenizer.path;
    const auto recorder = from_model && !cfg.tokenizer.path.empty() ? tokenizer::load_tokenizer_from_model_dir(where)
                                                                     : nullptr;
    const auto& rec_tok = recorder ? *recorder : *tok;
    data_cfg.data.template_name =
        data::resolve_chat_template(rec_tok, cfg.data.template_name, "data.template", where, /*override_hint=*/"");
    if (cfg.data.template_name == "auto")
      log::info("data.template: ", data_cfg.data.template_name,
                data::recorded_chat_format(rec_tok).kind == data::RecordedChatFormat::Kind::builtin
                    ? concat(", the format recorded in ", where)
                    : concat(" (", where, " records no chat format)"));
    tok->set_chat_template(data::ChatTemplate::get(data_cfg.data.template_name).jinja(*tok));
  }
  if (data_cfg.data.max_length > model->max_positions())
    throw ConfigError(concat("data.max_length: ", data_cfg.data.max_length, " exceeds the model's ",
                             model->max_positions(), " positions"));
  auto objective = make_objective(data_cfg, *tok);
  RankContext ranks;
  ranks.rank = rank;
  ranks.world = world;
  if (comm && world > 1)
    ranks.sum = [comm, device](std::vector<double>& v) {
      auto t = at::tensor(v, at::kDouble).to(device);
      comm->all_reduce_sum(t, "step or evaluation statistics");
      t = t.cpu();
      for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
    };
  objective->set_ranks(ranks);

  if (options.dry_run) {
    if (lead) {
      int64_t n_params = 0;
      for (const auto& p : model->parameters()) n_params += p.numel();
      const int64_t samples_per_step = micro_per_step * cfg.train.micro_batch_size;
      auto first = objective->train_source().next();
      const auto sample = render_first_row(first, *tok);
      const double tokens_per_sample =
          static_cast<double>(first.num_tokens) / static_cast<double>(std::max<int64_t>(1, cfg.train.micro_batch_size));
      std::ostringstream plan;
      plan << "dry run: nothing is trained or written\n"
           << "  model: " << model->family() << ", " << n_params << " parameters, " << model->max_positions()
           << " positions, on " << device.str() << (world > 1 ? concat(", ", world, " ranks") : std::string()) << "\n"
           << "  algorithm: " << cfg.algorithm << "; " << cfg.train.max_steps << " steps of " << samples_per_step
           << " samples (" << micro_per_step << (micro_per_step == 1 ? " micro-batch" : " micro-batches") << " of "
           << cfg.train.micro_batch_size << ")";
      if (const auto epoch = objective->train_source().samples_per_epoch(); epoch > 0)
        plan << " = " << format_number(static_cast<double>(cfg.train.max_steps * samples_per_step) /
                                           static_cast<double>(epoch), 3)
             << " epochs of " << epoch << " samples";
      plan << "\n  tokens per step: about "
           << std::llround(tokens_per_sample * static_cast<double>(samples_per_step))
           << " (the first micro-batch holds " << first.num_tokens << " tokens and " << first.num_targets
           << (cfg.algorithm == "sft" || cfg.algorithm == "pretrain" ? " trained tokens" : " preference examples")
           << ")\n"
           << "  memory: about " << format_bytes(16.0 * static_cast<double>(n_params))
           << " for weights, gradients and AdamW state (fp32: 4 + 4 + 8 bytes per parameter"
           << (world > 1 && cfg.dist.sharding != "no_shard" ? ", before sharding" : "") << "), plus activations\n"
           << "  resume: "
           << (latest ? concat("continues ", latest->string()) : std::string("starts fresh in ") + out_dir.string())
           << "\n"
           << "  first training sample (trained tokens in [[ ]]):\n" << sample << "\n";
      log::info(plan.str());
    }
    return {};
  }

  stdfs::create_directories(out_dir);
  objective->prepare(*model, {out_dir, device});

  std::unique_ptr<dist::ShardedModel> sharded;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<io::TrainerState> resumed;
  if (sharded_run) {
    // A plain checkpoint (a single-process run going multi-process) is read
    // into the whole model and a per-parameter optimizer first; sharding then
    // flattens both.
    std::unique_ptr<torch::optim::Optimizer> plain;
    if (latest && !dist::is_sharded_checkpoint(*latest)) {
      plain = optim::make_optimizer(cfg.optimizer, model->parameters());
      resumed = io::load_checkpoint(*latest, *model, *plain);
    }
    dist::ShardingOptions so;
    so.strategy = dist::parse_sharding(cfg.dist.sharding);
    so.param_dtype = dist::parse_dtype(cfg.dist.param_dtype);
    so.reduce_dtype = dist::parse_dtype(cfg.dist.reduce_dtype);
    so.activation_checkpointing = cfg.train.activation_checkpointing;
    sharded = std::make_unique<dist::ShardedModel>(model, comm, so);
    optimizer = optim::make_optimizer(cfg.optimizer, sharded->master_parameters());
    if (plain) dist::import_optimizer_state(*sharded, *plain, *optimizer);
    else if (latest) resumed = dist::load_sharded_checkpoint(*latest, *sharded, *optimizer);
  } else {
    if (cfg.train.activation_checkpointing)
      model->set_block_runner([](size_t, const at::Tensor& x, const models::BlockFn& block) {
        return dist::checkpoint_block(block, x);
      });
    optimizer = optim::make_optimizer(cfg.optimizer, model->parameters());
    if (latest) resumed = io::load_checkpoint(*latest, *model, *optimizer);
  }

  int64_t step = 0;
  if (resumed) {
    const auto& st = *resumed;
    const auto& ckpt = latest;
    try {
      objective->train_source().restore(st.data);
    } catch (const std::exception& e) {  // a user objective's restore may throw anything
      throw CheckpointError(concat((*ckpt / io::kTrainerStateFile).string(), ": ", e.what()));
    }
    step = st.step;
    log::info(options.eval_only ? "evaluating " : "resumed from ", ckpt->string(), " at step ", step);
  }
  auto evaluate = [&] {
    if (sharded) sharded->gather_full_parameters();
    auto r = objective->evaluate(*model);
    if (sharded) sharded->release_full_parameters();
    return r;
  };
  if (options.eval_only) {
    // Reads the run, changes none of it: no metrics.jsonl, no config files.
    if (!latest && cfg.model.from.empty())
      log::warn("--eval-only: no checkpoint in ", out_dir.string(), " and no model.from; evaluating a freshly "
                "initialised model");
    auto r = evaluate();
    if (r.metrics.empty()) throw ConfigError("--eval-only: the config has no evaluation data (data.eval or "
                                             "data.train[].eval_fraction)");
    if (lead) {
      print_eval(step, r);
      nlohmann::json j = {{"step", step}, {"checkpoint", latest ? latest->string() : cfg.model.from},
                          {"metrics", r.metrics}, {"samples", nlohmann::json::array()}};
      for (const auto& row : r.samples)
        j["samples"].push_back({{"prompt", row[0]}, {"generated", row[1]}, {"reference", row[2]}});
      const auto file = out_dir / concat("eval-step-", step, ".json");
      fs::write_file_atomic(file, j.dump(2) + "\n");
      log::info("wrote ", file.string());
    }
    TrainResult result;
    result.step = step;
    result.last_eval = r.metrics;
    return result;
  }
  if (lead) {
    // config.yaml is the run's current config; config-history/ keeps the one
    // of every start and resume, by the step it started from.
    fs::write_file_atomic(out_dir / "config.yaml", config_yaml);
    stdfs::create_directories(out_dir / "config-history");
    fs::write_file_atomic(out_dir / "config-history" / concat("step-", step, ".yaml"), config_yaml);
  }
  std::optional<MetricsWriter> metrics;
  if (lead) metrics.emplace(out_dir / "metrics.jsonl", step);

  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  const auto params_str = n_params >= 1e9 ? format_number(n_params / 1e9, 3) + "B"
                                          : format_number(n_params / 1e6, 3) + "M";
  log::info("model: ", model->family(), ", ", params_str, " parameters on ", device.str(), "; ", cfg.algorithm,
            " for ", cfg.train.max_steps, " steps of ", micro_per_step * cfg.train.micro_batch_size, " samples (",
            micro_per_step, " micro-batches of ", cfg.train.micro_batch_size, ")",
            sharded ? concat("; ", world, " rank(s), ", comm->backend(), ", ", cfg.dist.sharding,
                             cfg.dist.param_dtype != "float32" ? ", " + cfg.dist.param_dtype : std::string())
                    : std::string());

  int64_t nonfinite_total = resumed ? resumed->nonfinite_steps : 0, nonfinite_in_a_row = 0;
  const auto injected = injected_nonfinite();
  auto save = [&](int64_t at_step) {
    io::TrainerState state{at_step, objective->train_source().state(), nonfinite_total};
    stdfs::path dir;
    if (sharded) {
      dir = dist::save_sharded_checkpoint(out_dir, *sharded, *optimizer, tok.get(), state, config_yaml,
                                          cfg.train.keep_checkpoints, cfg.dist.consolidated_checkpoints);
    } else {
      io::CheckpointParts parts{model.get(), tok.get(), optimizer.get(), state, config_yaml};
      dir = io::save_checkpoint(out_dir, parts, cfg.train.keep_checkpoints);
    }
    log::info("saved ", dir.string());
  };

  if (step >= cfg.train.max_steps)
    log::info("the run in ", out_dir.string(), " is already complete (step ", step, " of ", cfg.train.max_steps,
              "); raise train.max_steps to train further");
  SignalScope signals;
  TrainResult result;
  auto params = model->parameters();
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  double last_loss = NAN;
  std::map<int64_t, double> eval_loss_at;  // for the best checkpoint of the summary
  std::vector<int64_t> saved_steps;
  while (step < cfg.train.max_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    // Every rank reads the whole step (same order, same padding as on one
    // rank) and keeps micro-batches rank, rank + world, ...
    std::vector<Batch> batches;
    int64_t step_targets = 0, step_tokens = 0;
    for (int64_t i = 0; i < micro_per_step; ++i) {
      auto b = objective->train_source().next();
      step_targets += b.num_targets;
      step_tokens += b.num_tokens;
      if (i % world == rank) batches.push_back(std::move(b));
    }
    const double lr = optim::lr_at(cfg.schedule, cfg.optimizer.lr, step, cfg.train.max_steps);
    optim::set_lr(*optimizer, lr);
    optimizer->zero_grad();
    AccumulateOptions ao;
    ao.step_targets = step_targets;
    if (sharded) {
      sharded->begin_step();
      ao.before_backward = [&](bool last) { sharded->set_grad_sync(last); };
      ao.after_backward = [&] { sharded->finish_backward(); };
    }
    auto s = accumulate_gradients(*objective, *model, batches, ao);
    if (const auto it = injected.find(step + 1); it != injected.end()) {
      at::NoGradGuard no_grad;
      if (it->second == "loss" && lead) s.loss = std::numeric_limits<double>::infinity();
      if (it->second == "grad")
        (sharded ? sharded->master_parameters() : params).front().mutable_grad().fill_(NAN);
    }
    bool stop = g_stop.load();
    // One reduction for the loss, the objective's sums and the stop flag.
    const auto head = sum_over_ranks(ranks, {s.loss, stop ? 1.0 : 0.0}, s.sums);
    s.loss = head[0];
    stop = head[1] > 0;
    Metrics m{{"loss", s.loss}, {"lr", lr}, {"num_targets", static_cast<double>(step_targets)}};
    for (const auto& [k, v] : objective->step_metrics(s.sums)) m[k] = v;
    // The loss is summed over ranks and the norm is global, so every rank takes the same decision.
    const double norm = sharded ? sharded->clip_grad_norm(cfg.train.grad_clip)
                                : clip_or_measure(params, cfg.train.grad_clip);
    if (cfg.train.grad_clip > 0) m["grad_norm"] = norm;
    if (std::isfinite(s.loss) && std::isfinite(norm)) {
      optimizer->step();
      nonfinite_in_a_row = 0;
    } else {
      const auto what = !std::isfinite(s.loss) ? concat("loss is ", s.loss) : concat("gradient norm is ", norm);
      const auto kept = io::latest_checkpoint(out_dir);
      const auto intact = kept ? concat("; the last checkpoint, ", kept->string(), ", is as it was")
                               : std::string("; no checkpoint was written");
      if (cfg.train.on_nonfinite == "stop")
        throw Error(concat("step ", step + 1, ": the ", what, " (not finite); the step was not applied and "
                           "nothing was saved from it", intact, ". Lower optimizer.lr or check the data; "
                           "train.on_nonfinite: skip drops such steps instead"));
      ++nonfinite_total;
      if (++nonfinite_in_a_row >= cfg.train.max_nonfinite_in_a_row)
        throw Error(concat("step ", step + 1, ": ", nonfinite_in_a_row, " non-finite steps in a row (the ", what,
                           "; train.max_nonfinite_in_a_row is ", cfg.train.max_nonfinite_in_a_row,
                           "); stopping without saving", intact));
      log::warn("step ", step + 1, ": the ", what, "; step skipped (", nonfinite_total, " so far)");
    }
    if (sharded) sharded->after_optimizer_step();
    ++step;
    if (cfg.train.on_nonfinite == "skip") m["nonfinite_steps"] = static_cast<double>(nonfinite_total);

    // Per-rank bytes of parameters, gradients and optimizer state held now.
    if (sharded) {
      const auto mem = sharded->memory();
      m["memory/parameter_bytes"] = static_cast<double>(mem.parameters);
      m["memory/gradient_bytes"] = static_cast<double>(mem.gradients);
      m["memory/peak_gathered_parameter_bytes"] = static_cast<double>(mem.peak_gathered);
    } else {
      std::unordered_set<const void*> seen;
      std::vector<at::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.grad());
      m["memory/parameter_bytes"] = static_cast<double>(dist::storage_bytes(params, seen));
      m["memory/gradient_bytes"] = static_cast<double>(dist::storage_bytes(grads, seen));
    }
    m["memory/optimizer_bytes"] = static_cast<double>(optimizer_bytes(*optimizer));

    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    m["tokens_per_s"] = static_cast<double>(step_tokens) / dt;
    result.tokens += step_tokens;
    last_loss = s.loss;
    if (every(step, cfg.train.log_every) || step == cfg.train.max_steps) {
      const double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(cfg.train.max_steps - step);
      log::progress(progress_line(step, cfg.train.max_steps, m, m["tokens_per_s"], eta));
    }
    if (every(step, cfg.train.eval_every) || step == cfg.train.max_steps) {
      auto r = evaluate();
      if (!r.metrics.empty()) {
        if (lead) print_eval(step, r);
        m.insert(r.metrics.begin(), r.metrics.end());
        result.last_eval = r.metrics;
        if (const auto it = r.metrics.find("eval/loss"); it != r.metrics.end()) eval_loss_at[step] = it->second;
      }
    }
    if (metrics) metrics->write(step, m);
    if (every(step, cfg.train.save_every) || step == cfg.train.max_steps || stop) {
      save(step);
      saved_steps.push_back(step);
    }
    if (stop) {
      log::warn("stop requested: saved step ", step, " and exiting; re-run the same command to resume");
      result.interrupted = true;
      break;
    }
  }
  result.step = step;
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  double best = INFINITY;
  for (const auto at_step : saved_steps)
    if (const auto it = eval_loss_at.find(at_step); it != eval_loss_at.end() && it->second < best &&
                                                    stdfs::exists(out_dir / concat("checkpoint-", at_step))) {
      best = it->second;
      result.best_checkpoint = (out_dir / concat("checkpoint-", at_step)).string();
    }
  if (lead && step > first_step) {
    std::ostringstream os;
    os << "run summary: steps " << first_step << " -> " << step << " in " << format_seconds(result.wall_s) << ", "
       << format_number(static_cast<double>(result.tokens), 4) << " tokens ("
       << format_number(static_cast<double>(result.tokens) / std::max(result.wall_s, 1e-9), 4)
       << " tokens/s); final loss " << format_number(last_loss);
    for (const auto& [k, v] : result.last_eval) os << ", " << k << " " << format_number(v);
    if (!result.best_checkpoint.empty())
      os << "; best checkpoint by eval/loss: " << result.best_checkpoint << " (" << format_number(best) << ")";
    log::info(os.str());
  }
  return result;
}

}  // namespace anvil::train
