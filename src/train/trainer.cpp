#include "anvil/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "anvil/core/error.h"
#include "anvil/core/fs.h"
#include "anvil/core/logging.h"
#include "anvil/dist/env.h"
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
  try {
    return at::Device(d);
  } catch (const c10::Error&) {
    throw ConfigError(concat("train.device: expected cpu, cuda or cuda:N, got \"", d, "\""));
  }
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

}  // namespace

void request_stop() { g_stop.store(true); }

void add_sum(Sums& sums, const std::string& key, const at::Tensor& value) {
  auto v = value.detach().to(at::kDouble);
  auto [it, fresh] = sums.emplace(key, v);
  if (!fresh) it->second = it->second + v;
}

StepStats accumulate_gradients(Objective& objective, models::CausalLM& model, const std::vector<Batch>& batches) {
  StepStats s;
  for (const auto& b : batches) {
    s.num_targets += b.num_targets;
    s.num_tokens += b.num_tokens;
  }
  TORCH_CHECK(s.num_targets > 0, "accumulate_gradients: the step has no target tokens");
  const double scale = 1.0 / static_cast<double>(s.num_targets);
  at::Tensor total;  // summed on the device: one host sync per step, not per micro-batch
  for (const auto& b : batches) {
    auto loss = objective.loss_sum(model, b, s.sums);
    (loss * scale).backward();
    auto detached = loss.detach().to(at::kDouble);
    total = total.defined() ? total + detached : detached;
  }
  s.loss = total.item<double>() * scale;
  return s;
}

TrainResult run_training(const config::RunConfig& cfg) {
  log::configure(log::parse_level(cfg.logging.level));
  // Until sharded training lands, several processes would each train and
  // write the same output_dir; refuse rather than race.
  if (const auto proc = dist::discover_from_environment(); proc.world_size > 1)
    throw ConfigError(concat("launched as rank ", proc.rank, " of ", proc.world_size, " by ", proc.launcher,
                             ": multi-process training is not supported yet; run one process"));
  if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
  const auto device = parse_device(cfg.train.device);
  const stdfs::path out_dir = cfg.output_dir;
  stdfs::create_directories(out_dir);
  const auto config_yaml = config::to_yaml(cfg);

  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  auto tok = build_tokenizer(cfg);
  auto model = build_model(cfg, *tok);
  model->to(device);
  model->train();
  // data.max_length defaults to the model's context, which model.from only knows once loaded.
  auto data_cfg = cfg;
  if (data_cfg.data.max_length == 0) data_cfg.data.max_length = model->max_positions();
  if (data_cfg.data.max_length > model->max_positions())
    throw ConfigError(concat("data.max_length: ", data_cfg.data.max_length, " exceeds the model's ",
                             model->max_positions(), " positions"));
  auto objective = make_objective(data_cfg, *tok);
  objective->prepare(*model, {out_dir, device});
  auto optimizer = optim::make_optimizer(cfg.optimizer, model->parameters());

  int64_t step = 0;
  if (auto ckpt = io::latest_checkpoint(out_dir)) {
    auto st = io::load_checkpoint(*ckpt, *model, *optimizer);
    objective->train_source().restore(st.data);
    step = st.step;
    log::info("resumed from ", ckpt->string(), " at step ", step);
  }
  fs::write_file_atomic(out_dir / "config.yaml", config_yaml);
  MetricsWriter metrics(out_dir / "metrics.jsonl", step);

  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  const auto params_str = n_params >= 1e9 ? format_number(n_params / 1e9, 3) + "B"
                                          : format_number(n_params / 1e6, 3) + "M";
  log::info("model: ", model->family(), ", ", params_str, " parameters on ", device.str(),
            "; ", cfg.algorithm, " for ", cfg.train.max_steps, " steps of ", cfg.train.micro_batch_size, " x ",
            cfg.train.grad_accum_steps, " samples");

  auto save = [&](int64_t at_step) {
    io::CheckpointParts parts{model.get(), tok.get(), optimizer.get(),
                              {at_step, objective->train_source().state()}, config_yaml};
    const auto dir = io::save_checkpoint(out_dir, parts, cfg.train.keep_checkpoints);
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
  while (step < cfg.train.max_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    for (int64_t i = 0; i < cfg.train.grad_accum_steps; ++i) batches.push_back(objective->train_source().next());
    const double lr = optim::lr_at(cfg.schedule, cfg.optimizer.lr, step, cfg.train.max_steps);
    optim::set_lr(*optimizer, lr);
    optimizer->zero_grad();
    const auto s = accumulate_gradients(*objective, *model, batches);
    Metrics m{{"loss", s.loss}, {"lr", lr}, {"num_targets", static_cast<double>(s.num_targets)}};
    for (const auto& [k, v] : objective->step_metrics(s.sums)) m[k] = v;
    if (cfg.train.grad_clip > 0) m["grad_norm"] = torch::nn::utils::clip_grad_norm_(params, cfg.train.grad_clip);
    optimizer->step();
    ++step;

    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    m["tokens_per_s"] = static_cast<double>(s.num_tokens) / dt;
    if (every(step, cfg.train.log_every) || step == cfg.train.max_steps) {
      const double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(cfg.train.max_steps - step);
      log::progress(progress_line(step, cfg.train.max_steps, m, m["tokens_per_s"], eta));
    }
    if (every(step, cfg.train.eval_every) || step == cfg.train.max_steps) {
      auto r = objective->evaluate(*model);
      if (!r.metrics.empty()) {
        print_eval(step, r);
        m.insert(r.metrics.begin(), r.metrics.end());
        result.last_eval = r.metrics;
      }
    }
    metrics.write(step, m);
    const bool stop = g_stop.load();
    if (every(step, cfg.train.save_every) || step == cfg.train.max_steps || stop) save(step);
    if (stop) {
      log::warn("stop requested: saved step ", step, " and exiting; re-run the same command to resume");
      result.interrupted = true;
      break;
    }
  }
  result.step = step;
  return result;
}

}  // namespace anvil::train
