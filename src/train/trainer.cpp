#include "anvil/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/device.h"
#include "anvil/core/error.h"
#include "core/tensorboard.h"
#include "core/fs.h"
#include "core/host_memory.h"
#include "core/logging.h"
#include "checkpoint/checkpoint.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/engine_setup.h"
#include "train/run_setup.h"
#include "core/test_hooks.h"
#include "train/memory_plan.h"
#include "train/step_pipeline.h"
#include "train/step_profiler.h"
#include "core/metrics.h"
#include "io/trainer_state.h"
#include "models/init.h"
#include "distributed/sharding.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
std::atomic<bool> g_stop{false};

extern "C" void on_second_stop_signal(int sig) {
  static const char msg[] =
      "\ntrainer: interrupted again: exiting now, without saving; the last complete checkpoint is kept\n";
  (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  ::_exit(128 + sig);
}

extern "C" void on_stop_signal(int sig) {
  g_stop.store(true);
  static const char msg[] =
      "\ntrainer: stop requested: finishing this step (an RL run: this iteration), then saving a checkpoint "
      "(interrupt again to exit at once, without saving)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  std::signal(sig, on_second_stop_signal);  // a second signal ends the process at once, saying so
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

std::string fmt_duration(double s) {
  std::ostringstream os;
  const auto t = static_cast<int64_t>(s);
  if (t >= 3600) os << t / 3600 << "h";
  if (t >= 60) os << (t / 60) % 60 << "m";
  os << t % 60 << "s";
  return os.str();
}

/// `columns`: the objective's console metrics (Objective::console_metrics) logged so far, at their latest values.
std::string progress_line(int64_t step, int64_t max_steps, const Metrics& m,
                          const std::vector<std::pair<std::string, double>>& columns, double tok_s, double eta_s) {
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(1, max_steps));
  std::ostringstream os;
  os << "step " << step << "/" << max_steps << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.')
     << "] loss " << std::fixed << std::setprecision(4) << m.at("loss");
  for (const auto& [name, value] : columns) os << " | " << name << " " << format_number(value);
  os << " | lr " << std::scientific << std::setprecision(2) << m.at("lr") << " | " << std::fixed << std::setprecision(0)
     << tok_s << " tok/s | eta " << fmt_duration(eta_s);
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
  t << std::left << std::setw(42) << "prompt" << std::setw(42) << "generated" << r.third_column << "\n";
  for (const auto& row : r.samples)
    t << std::setw(42) << clip(row[0]) << std::setw(42) << clip(row[1]) << clip(row[2]) << "\n";
  log::info("\n", t.str());
}

bool every(int64_t step, int64_t n) { return n > 0 && step % n == 0; }

}  // namespace

void request_stop() { g_stop.store(true); }

namespace {

std::string format_seconds(double s) {
  if (s < 60) return format_number(s, 3) + " s";
  const auto m = static_cast<int64_t>(s / 60);
  if (m < 60) return concat(m, " min ", static_cast<int64_t>(s) % 60, " s");
  return concat(m / 60, " h ", m % 60, " min");
}

/// The objective's evaluation through the shards (Engine::evaluating; generation gathers the whole model).
EvalResult evaluate(Engine& engine, Objective& objective) {
  auto evaluating = engine.evaluating();
  return objective.evaluate(engine.model());
}

/// --eval-only: evaluates once and writes eval-step-<N>.json; the run's
/// metrics and config files stay as they were.
TrainResult evaluate_only(RunSetup& r, StepEngine& engine, const config::RunConfig& cfg, int64_t step) {
  if (!r.latest && cfg.model.from.empty())
    log::warn("--eval-only: no checkpoint in ", r.out_dir.string(),
              " and no model.from; evaluating a freshly "
              "initialised model");
  auto e = evaluate(engine, *r.objective);
  if (e.metrics.empty())
    throw ConfigError("--eval-only: the config has no evaluation data (data.eval or data.train[].eval_fraction)");
  if (r.lead) {
    print_eval(step, e);
    nlohmann::json j = {{"step", step},
                        {"checkpoint", r.latest ? r.latest->string() : cfg.model.from},
                        {"metrics", e.metrics},
                        {"samples", nlohmann::json::array()}};
    for (const auto& row : e.samples)
      j["samples"].push_back({{"prompt", row[0]}, {"generated", row[1]}, {e.third_column, row[2]}});
    const auto file = r.out_dir / concat("eval-step-", step, ".json");
    fs::write_file_atomic(file, j.dump(2) + "\n");
    log::info("wrote ", file.string());
  }
  TrainResult result;
  result.step = step;
  result.last_eval = e.metrics;
  return result;
}

/// Whether a multiple of `every` lies in (from, to].
bool crossed(int64_t from, int64_t to, int64_t every) { return every > 0 && from / every != to / every; }

/// The training loop: iterations of the objective's steps, with eval, saving,
/// the non-finite guard, progress and the end-of-run summary.
class TrainLoop {
 public:
  TrainLoop(const config::RunConfig& cfg, RunSetup& run, StepEngine& engine,
            const std::optional<io::TrainerState>& resumed)
      : cfg_(cfg),
        run_(run),
        engine_(engine),
        objective_(*run.objective),
        pipeline_(cfg, run, engine, *run.objective, resumed ? resumed->micro_batch_size : 0),
        profiler_(cfg.train.profile_steps, run.out_dir / "profile", run.device, run.lead) {
    if (resumed) {
      step_ = resumed->step;
      iteration_ = resumed->iteration;
      nonfinite_total_ = resumed->nonfinite_steps;
    }
    first_step_ = step_;
    if (run_.lead && cfg_.schedule.warmup_steps > cfg_.train.max_steps)
      log::warn("schedule.warmup_steps (", cfg_.schedule.warmup_steps, ") is longer than train.max_steps (",
                cfg_.train.max_steps, "): the warmup is clamped to the run's ", cfg_.train.max_steps, " steps");
    if (run_.lead) metrics_.emplace(run_.out_dir / "metrics.jsonl", step_);
    if (run_.lead && cfg_.logging.tensorboard) {
      const auto dir = cfg_.logging.tensorboard_dir.empty() ? run_.out_dir / "tensorboard"
                                                            : stdfs::path(cfg_.logging.tensorboard_dir);
      tb_.emplace(dir, resumed ? std::optional<int64_t>(step_) : std::nullopt);
      tb_->text(step_, "config", "```yaml\n" + run_.config_yaml + "```");
      log::info("tensorboard: ", tb_->path().string());
    }
  }

  TrainResult run() {
    int64_t n_params = 0;
    for (const auto& p : engine_.model().parameters()) n_params += p.numel();
    const auto params_str =
        n_params >= 1e9 ? format_number(n_params / 1e9, 3) + "B" : format_number(n_params / 1e6, 3) + "M";
    const auto where = engine_.describe();
    log::info("model: ", engine_.model().family(), ", ", params_str, " parameters on ", engine_.device().str(), "; ",
              cfg_.algorithm, " for ", cfg_.train.max_steps, " steps of ",
              run_.micro_per_step * cfg_.train.micro_batch_size, " samples (", run_.micro_per_step,
              " micro-batches of ", cfg_.train.micro_batch_size, ")", where.empty() ? "" : "; " + where,
              pipeline_.overlapped() ? "; each step read while the next runs" : "");
    if (step_ >= cfg_.train.max_steps)
      log::info("the run in ", run_.out_dir.string(), " is already complete (step ", step_, " of ",
                cfg_.train.max_steps, "); raise train.max_steps to train further");
    SignalScope signals;
    t_start_ = std::chrono::steady_clock::now();
    try {
      while (step_ < cfg_.train.max_steps && !stop_) run_iteration();
      if (last_) write_last();  // (the last iteration reads its step)
      objective_.finish(engine_);
      profiler_.finish();
      engine_.collect_save(/*wait=*/true);  // the last checkpoint is on disk before the run ends
    } catch (...) {
      try {  // a step the device finished before the error keeps its line
        if (last_ && !reading_) write_last();
      } catch (const std::exception& e) {
        log::error(e.what());
      }
      try {  // a checkpoint being written is finished; this error is the one the run ends with
        engine_.collect_save(/*wait=*/true);
      } catch (const std::exception& e) {
        log::error(e.what());
      }
      throw;
    }
    result_.step = step_;
    result_.wall_s = seconds_since(t_start_);
    summarize();
    return result_;
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  void write_metrics(int64_t step, const Metrics& m) {
    if (metrics_) metrics_->write(step, m);
    if (tb_) tb_->scalars(step, std::vector<std::pair<std::string, double>>(m.begin(), m.end()));
  }
  static std::string samples_markdown(const EvalResult& e) {
    auto cell = [](std::string s) {
      std::string out;
      for (const char c : s) out += c == '|' ? std::string("\\|") : c == '\n' ? std::string("<br>") : std::string(1, c);
      return out;
    };
    std::string md = "| prompt | generated | " + e.third_column + " |\n|---|---|---|\n";
    for (const auto& r : e.samples) md += "| " + cell(r[0]) + " | " + cell(r[1]) + " | " + cell(r[2]) + " |\n";
    return md;
  }

  /// A step the loop has run, and its metrics line once its values are read.
  struct StepRecord {
    QueuedStep q;
    Metrics known;  // what was known when it was queued (memory, the iteration's metrics)
    Metrics line;   // once read
  };

  /// Writes the line of the last step run (reading it first when it was queued).
  void write_last() {
    write_metrics(last_->q.step, read(*last_));
    last_.reset();
  }

  /// before_iteration, then the iteration's steps; eval and save at its end.
  void run_iteration() {
    const int64_t start = step_;
    profiler_.begin_step(step_ + 1);  // a rollout before the iteration counts toward its first step
    // The last iteration's last step, before a rollout that needs its after_step().
    if (last_ && objective_.step_needs().reads == Objective::StepReads::within_iteration) write_last();
    Metrics extra = objective_.before_iteration(engine_, iteration_, step_);
    const int64_t n = std::min(std::max<int64_t>(1, objective_.steps_per_iteration()), cfg_.train.max_steps - step_);
    // A stop request finishes the iteration: an RL run then saves at the
    // rollout boundary, as its periodic saves do, and resumes exactly.
    for (int64_t k = 0; k < n; ++k) {
      profiler_.begin_step(step_ + 1);
      if (last_ && last_->q.read) write_last();  // read at once: its line goes out before the next step
      auto next = run_step(std::exchange(extra, {}));
      if (last_) write_last();  // overlapped: read now, while the device runs the step just queued
      last_ = std::move(next);
      profiler_.end_step(step_);
    }
    ++iteration_;
    const bool last = step_ == cfg_.train.max_steps;
    const bool eval = crossed(start, step_, cfg_.train.eval_every) || last;
    const bool save = crossed(start, step_, cfg_.train.save_every) || last || stop_;
    // Overlapped, an iteration without eval or save leaves its step unread
    // until the next step is queued.
    if (pipeline_.overlapped() && !eval && !save) return;
    auto m = read(*last_);
    const int64_t at = last_->q.step;
    last_.reset();
    if (eval) {
      auto e = evaluate(engine_, objective_);
      if (!e.metrics.empty()) {
        if (run_.lead) print_eval(step_, e);
        if (tb_ && !e.samples.empty()) tb_->text(step_, "eval/samples", samples_markdown(e));
        m.insert(e.metrics.begin(), e.metrics.end());
        result_.last_eval = e.metrics;
        if (const auto it = e.metrics.find("eval/loss"); it != e.metrics.end()) eval_loss_at_[step_] = it->second;
      }
    }
    write_metrics(at, m);
    if (save) this->save();
    if (stop_) {
      engine_.collect_save(/*wait=*/true);
      log::warn("stop requested: saved step ", step_, " and exiting; re-run the same command to resume");
      result_.interrupted = true;
    }
  }

  /// Step step_ + 1, the one path of every step: its micro-batches drawn (every rank reads the whole step, same
  /// order, same padding as on one rank, and keeps micro-batches rank, rank + world, ...), its learning rate,
  /// and the step queued (StepPipeline). Read at once unless steps are read late (StepPipeline::overlapped).
  /// `known`: metrics for its line from before it (the iteration's).
  StepRecord run_step(Metrics known) {
    StepRecord r;
    r.known = std::move(known);
    const auto t0 = std::chrono::steady_clock::now();
    // Tests: signals raised at a known step (ANVIL_TEST_SIGNALS_AT_STEP, core/test_hooks.h).
    if (const auto& test = test_hooks::signals_at_step(); step_ == test.step)
      for (const int sig : test.signals) std::raise(sig);
    std::vector<Batch> batches;
    int64_t targets = 0, tokens = 0;
    for (int64_t i = 0; i < run_.micro_per_step; ++i) {
      auto b = objective_.train_source().next();
      targets += b.num_targets;
      tokens += b.num_tokens;
      if (i % run_.ranks.world == run_.ranks.rank) batches.push_back(std::move(b));
    }
    const double lr = optim::lr_at(cfg_.schedule, cfg_.optimizer.lr, step_, cfg_.train.max_steps);
    r.q = pipeline_.queue(step_ + 1, batches, targets, tokens, lr, g_stop.load());
    r.q.t0 = t0;
    if (pipeline_.auto_rows() > 0) r.known["micro_batch_size"] = static_cast<double>(pipeline_.auto_rows());
    stop_ = pipeline_.stop_agreed();
    ++step_;
    for (const auto& [k, v] : engine_.memory()) r.known[k] = v;
    for (const auto& [k, v] : accelerator_memory_metrics(run_.device)) r.known[k] = v;
    if (!pipeline_.overlapped()) r.line = read(r);
    return r;
  }

  /// The metrics line of step `r`, reading it first when it is not yet: one copy to the host for its loss, norm
  /// and sums. after_step() runs for an applied step; a skipped one is counted (or stops the run) here.
  Metrics read(StepRecord& r) {
    if (r.q.read) return std::move(r.line);
    reading_ = true;
    if (pipeline_.read(r.q)) {
      nonfinite_in_a_row_ = 0;
      objective_.after_step(engine_, r.q.step);
    } else {
      guard_nonfinite(r.q.step, r.q.loss_value, r.q.norm_value);
    }
    stop_ = pipeline_.stop_agreed();
    reading_ = false;
    return line(r);
  }

  /// A read step's metrics line; the progress line at the log cadence.
  Metrics line(StepRecord& r) {
    auto& q = r.q;
    const double loss = q.loss_value, norm = q.norm_value;
    Metrics m{{"loss", loss}, {"lr", q.lr}, {"num_targets", static_cast<double>(q.targets)}};
    for (const auto& [k, v] : objective_.step_metrics(q.stats.sums)) m[k] = v;
    if (const auto aux = q.stats.sums.find("moe/aux_loss"); aux != q.stats.sums.end())
      m["moe/aux_loss"] = aux->second.item<double>();
    if (cfg_.train.grad_clip > 0) m["grad_norm"] = norm;
    for (const auto& [k, v] : q.companions) m[k] = v;
    if (cfg_.train.on_nonfinite == config::OnNonfinite::kSkip)
      m["nonfinite_steps"] = static_cast<double>(nonfinite_total_);
    for (const auto& [k, v] : r.known) m.emplace(k, v);
    // How long saves since the last line blocked the loop, and background writes finished since.
    for (const auto& [k, v] : engine_.collect_save(/*wait=*/false)) m[k] = v;
    // Its wall time: from the later of its start and the previous step's end (overlapped, steps follow each
    // other on the device) to its own end, which a device that runs as it queues has already marked.
    if (q.done == std::chrono::steady_clock::time_point{}) q.done = std::chrono::steady_clock::now();
    const auto from = std::max(q.t0, last_done_);
    last_done_ = q.done;
    m["tokens_per_s"] = static_cast<double>(q.tokens) / std::chrono::duration<double>(q.done - from).count();
    result_.tokens += q.tokens;
    last_loss_ = loss;
    for (const auto& k : console_metrics_)
      if (const auto it = m.find(k); it != m.end()) console_latest_[k] = it->second;
    if (every(q.step, cfg_.train.log_every) || q.step == cfg_.train.max_steps) {
      const double eta = seconds_since(t_start_) / static_cast<double>(q.step - first_step_) *
                         static_cast<double>(cfg_.train.max_steps - q.step);
      std::vector<std::pair<std::string, double>> columns;
      for (const auto& k : console_metrics_)
        if (const auto it = console_latest_.find(k); it != console_latest_.end()) columns.emplace_back(k, it->second);
      log::progress(progress_line(q.step, cfg_.train.max_steps, m, columns, m["tokens_per_s"], eta));
    }
    return m;
  }

  /// A non-finite loss or gradient norm at step `step`: stop (on_nonfinite:
  /// stop, or too many in a row), else count it; the step is not applied
  /// either way.
  void guard_nonfinite(int64_t step, double loss, double norm) {
    const auto what = !std::isfinite(loss) ? concat("loss is ", loss) : concat("gradient norm is ", norm);
    if (cfg_.train.on_nonfinite == config::OnNonfinite::kStop ||
        nonfinite_in_a_row_ + 1 >= cfg_.train.max_nonfinite_in_a_row)
      engine_.collect_save(/*wait=*/true);  // the checkpoint named below is the newest on disk
    const auto kept = checkpoint::latest_checkpoint(run_.out_dir);
    const auto intact = kept ? concat("; the last checkpoint, ", kept->string(), ", is as it was")
                             : std::string("; no checkpoint was written");
    if (cfg_.train.on_nonfinite == config::OnNonfinite::kStop)
      throw Error(concat("step ", step, ": the ", what,
                         " (not finite); the step was not applied and "
                         "nothing was saved from it",
                         intact,
                         ". Lower optimizer.lr or check the data; "
                         "train.on_nonfinite: skip drops such steps instead"));
    ++nonfinite_total_;
    if (++nonfinite_in_a_row_ >= cfg_.train.max_nonfinite_in_a_row)
      throw Error(concat("step ", step, ": ", nonfinite_in_a_row_, " non-finite steps in a row (the ", what,
                         "; train.max_nonfinite_in_a_row is ", cfg_.train.max_nonfinite_in_a_row,
                         "); stopping without saving", intact));
    log::warn("step ", step, ": the ", what, "; step skipped (", nonfinite_total_, " so far)");
  }

  void save() {
    io::TrainerState state;
    state.step = step_;
    state.data = objective_.train_source().state();
    state.nonfinite_steps = nonfinite_total_;
    state.objective = objective_.state();
    state.iteration = iteration_;
    if (pipeline_.auto_rows() > 0) state.micro_batch_size = pipeline_.auto_rows();
    host_peaks().end("train");
    // What the steps freed (activations, gathered units) goes back first: the save's copies take fresh pages
    // instead of a heap the steps left in pieces, and its phase starts from what is live.
    return_free_host_memory();
    host_peaks().begin("save");
    engine_.save(run_.out_dir, state, run_.tok.get(), run_.config_yaml, cfg_.train.keep_checkpoints);
    host_peaks().end("save");
    return_free_host_memory();
    host_peaks().begin("train");
    saved_steps_.push_back(step_);
  }

  void summarize() {
    double best = INFINITY;
    for (const auto at_step : saved_steps_) {
      const auto it = eval_loss_at_.find(at_step);
      const auto dir = run_.out_dir / concat("checkpoint-", at_step);
      if (it != eval_loss_at_.end() && it->second < best && stdfs::exists(dir)) {
        best = it->second;
        result_.best_checkpoint = dir.string();
      }
    }
    if (!run_.lead || step_ <= first_step_) return;
    std::ostringstream os;
    os << "run summary: steps " << first_step_ << " -> " << step_ << " in " << format_seconds(result_.wall_s) << ", "
       << format_number(static_cast<double>(result_.tokens), 4) << " tokens ("
       << format_number(static_cast<double>(result_.tokens) / std::max(result_.wall_s, 1e-9), 4)
       << " tokens/s); final loss " << format_number(last_loss_);
    for (const auto& [k, v] : result_.last_eval) os << ", " << k << " " << format_number(v);
    if (!result_.best_checkpoint.empty())
      os << "; best checkpoint by eval/loss: " << result_.best_checkpoint << " (" << format_number(best) << ")";
    log::info(os.str());
  }

  const config::RunConfig& cfg_;
  RunSetup& run_;
  StepEngine& engine_;
  Objective& objective_;
  StepPipeline pipeline_;
  StepProfiler profiler_;
  std::optional<MetricsWriter> metrics_;
  std::optional<TensorBoardWriter> tb_;
  int64_t step_ = 0, iteration_ = 0, first_step_ = 0;
  int64_t nonfinite_total_ = 0, nonfinite_in_a_row_ = 0;
  bool stop_ = false;
  std::optional<StepRecord> last_;  // the last step run, its line not yet written
  bool reading_ = false;            // inside read() (an error there leaves its step unread)
  // The end of the last step whose line was made.
  std::chrono::steady_clock::time_point last_done_;
  double last_loss_ = NAN;
  std::chrono::steady_clock::time_point t_start_;
  std::map<int64_t, double> eval_loss_at_;  // for the best checkpoint of the summary
  std::vector<int64_t> saved_steps_;
  TrainResult result_;
  // The progress line's columns of the objective's metrics, and each one's latest value.
  const std::vector<std::string> console_metrics_ = objective_.console_metrics();
  Metrics console_latest_;
};

}  // namespace

TrainResult run_training(const config::RunConfig& given, const RunOptions& options) {
  count_cpu_tensors();  // memory/cpu_peak_bytes and the phases' tensor peaks (core/host_memory.h)
  auto run = setup_run(given, options);
  // From here on, the length and warmup as resolved (config.yaml keeps the keys as given).
  const auto cfg = resolve_length(given, run);
  if (run.lead && !options.dry_run)  // over every training rank (a mesh's too: the plan divides them)
    log::info("memory plan\n",
              describe(held_against(plan_memory(*run.model, cfg, run.comm ? run.comm->world_size() : 1), run.device)));
  if (options.dry_run) {
    if (run.lead) print_plan(run, cfg);
    return {};
  }
  if (run.side) {
    // A rank apart from training (the objective's side ranks): its part of the run, until the trainers end it.
    // A stop signal is the trainers' to agree on (at an iteration boundary); they then end this rank's part.
    SignalScope signals;
    if (!options.eval_only) run.objective->serve(*run.model, SideContext{run.device, run.world, run.trainers});
    return {};
  }
  stdfs::create_directories(run.out_dir);
  RunContext ctx;
  ctx.output_dir = run.out_dir;
  ctx.device = run.device;
  ctx.comm = run.comm;
  ctx.world = run.world;
  ctx.trainers = run.trainers;
  {
    auto so = sharding_options(cfg);
    if (run.mesh && run.mesh->layout.tp() > 1)  // frozen models cut alike
      so.tensor_parallel = run.mesh->tp, so.data_parallel = run.mesh->dp;
    ctx.sharding = std::make_shared<const distributed::ShardingOptions>(std::move(so));
  }
  if (run.mesh && run.mesh->layout.cp() > 1) ctx.context_comm = run.mesh->cp;
  if (models::has_deferred(*run.model) && run.objective->prepare_reads_weights()) {
    // An objective that reads the weights in prepare() gets them whole, as one process would.
    log::info("model: built whole on every rank: the ", cfg.algorithm,
              " objective reads the weights in prepare() (Objective::prepare_reads_weights)");
    models::materialize_deferred(*run.model);
  }
  run.objective->prepare(*run.model, ctx);
  // The engine's view of the config keeps train.micro_batch_size: auto (the resolved config holds its start), so
  // that the ranks agree on out-of-memory errors (distributed::ShardingOptions::agree_on_out_of_memory).
  auto engine_cfg = cfg;
  if (run.auto_micro_batch) engine_cfg.train.micro_batch_size = config::TrainConfig::kAutoMicroBatch;
  auto start = make_engine(engine_cfg, run.model, run.comm, *run.objective, run.latest, *ctx.companions, run.mesh);
  // Host memory per phase (core/host_memory.h): load is everything up to a built engine, or up to a sharded
  // resume, which is its own phase.
  if (!host_peaks().has("load")) host_peaks().end("load");
  int64_t step = 0;
  if (start.resumed) {
    try {
      run.objective->train_source().restore(start.resumed->data);
      run.objective->restore(start.resumed->objective);
    } catch (const std::exception& e) {  // a user objective's restore may throw anything
      throw CheckpointError(concat((*run.latest / io::kTrainerStateFile).string(), ": ", e.what()));
    }
    step = start.resumed->step;
    log::info(options.eval_only ? "evaluating " : "resumed from ", run.latest->string(), " at step ", step);
  }
  if (options.eval_only) return evaluate_only(run, *start.engine, cfg, step);
  if (run.lead) {
    // config.yaml is the run's current config; config-history/ keeps the one
    // of every start and resume, by the step it started from.
    fs::write_file_atomic(run.out_dir / "config.yaml", run.config_yaml);
    stdfs::create_directories(run.out_dir / "config-history");
    fs::write_file_atomic(run.out_dir / "config-history" / concat("step-", step, ".yaml"), run.config_yaml);
  }
  return_free_host_memory();  // what the load and a resume freed
  host_peaks().begin("train");
  auto result = TrainLoop(cfg, run, *start.engine, start.resumed).run();
  host_peaks().end("train");
  // By the launch's rank (the ranks of a tensor-parallel group share a data-parallel one).
  const auto rank = run.mesh ? run.comm->rank() : run.ranks.rank;
  host_peaks().write(run.out_dir / "host_memory" / concat("rank-", rank, ".json"));
  return result;
}

}  // namespace anvil::train
