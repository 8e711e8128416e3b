#include "train/step_profiler.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/record_function.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/logging.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
constexpr const char* kStepPrefix = "ProfilerStep#";
constexpr size_t kTop = 15, kNameChars = 100;

bool is_step(const TraceEvent& e) { return !e.on_device && e.name.rfind(kStepPrefix, 0) == 0; }

/// A CUDA runtime call's name without its version suffix (cudaLaunchKernelExC_v11060).
std::string runtime_name(const std::string& name) {
  const auto v = name.rfind("_v");
  if (v == std::string::npos || v + 2 == name.size()) return name;
  return name.find_first_not_of("0123456789", v + 2) == std::string::npos ? name.substr(0, v) : name;
}

/// Each host event's time less that of the events nested in it on its thread.
std::vector<int64_t> self_times(const std::vector<const TraceEvent*>& host) {
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < host.size(); ++i) by_thread[host[i]->thread].push_back(i);
  std::vector<int64_t> self(host.size());
  for (size_t i = 0; i < host.size(); ++i) self[i] = host[i]->duration_ns;
  for (auto& [thread, idx] : by_thread) {
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return host[a]->start_ns != host[b]->start_ns ? host[a]->start_ns < host[b]->start_ns
                                                    : host[a]->duration_ns > host[b]->duration_ns;
    });
    std::vector<size_t> open;  // enclosing events, innermost last
    for (const auto i : idx) {
      const auto start = host[i]->start_ns, end = start + host[i]->duration_ns;
      while (!open.empty() && host[open.back()]->start_ns + host[open.back()]->duration_ns <= start) open.pop_back();
      if (!open.empty()) {
        const auto& p = *host[open.back()];
        self[open.back()] -= std::min(end, p.start_ns + p.duration_ns) - start;
      }
      open.push_back(i);
    }
  }
  for (auto& s : self) s = std::max<int64_t>(s, 0);
  return self;
}

/// The time covered by at least one of the intervals.
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, cur_start = 0, cur_end = std::numeric_limits<int64_t>::min();
  for (const auto& [s, e] : spans) {
    if (s > cur_end) {
      if (cur_end > cur_start) total += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (cur_end > cur_start) total += cur_end - cur_start;
  return total;
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, x);
  return buf;
}

}  // namespace

nlohmann::json profile_summary(const std::vector<TraceEvent>& events, bool gpu, const std::string& source) {
  std::vector<const TraceEvent*> steps, host;
  for (const auto& e : events) {
    if (is_step(e))
      steps.push_back(&e);
    else if (!e.on_device)
      host.push_back(&e);
  }
  std::sort(steps.begin(), steps.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
  // The window: from the first step's start to the end of the last step or
  // of the last device work it queued, whichever is later.
  int64_t w0 = std::numeric_limits<int64_t>::max(), host_end = std::numeric_limits<int64_t>::min();
  for (const auto* s : steps.empty() ? host : steps) {
    w0 = std::min(w0, s->start_ns);
    host_end = std::max(host_end, s->start_ns + s->duration_ns);
  }
  int64_t w1 = host_end;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const auto& e : events)
    if (e.on_device && e.start_ns + e.duration_ns > w0) {
      busy.emplace_back(std::max(e.start_ns, w0), e.start_ns + e.duration_ns);
      w1 = std::max(w1, e.start_ns + e.duration_ns);
    }
  const double window_ns = w1 > w0 ? static_cast<double>(w1 - w0) : 0.0;
  const auto n_steps = static_cast<int64_t>(std::max<size_t>(steps.size(), 1));

  // Runtime calls made by the steps (not the profiler's own closing sync).
  int64_t launches = 0, syncs = 0;
  static const std::set<std::string> sync_calls = {"cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                   "cudaEventSynchronize", "cudaMemcpy"};
  for (const auto* e : host) {
    if (e->start_ns < w0 || e->start_ns > host_end) continue;
    const auto name = runtime_name(e->name);
    if (name == "cudaLaunchKernel" || name == "cudaLaunchKernelExC" || name.rfind("cuLaunchKernel", 0) == 0)
      ++launches;
    else if (sync_calls.count(name))
      ++syncs;
  }

  std::map<std::string, std::pair<int64_t, int64_t>> by_name;  // total ns, calls
  int64_t all_ns = 0;
  if (gpu) {
    for (const auto& e : events)
      if (e.on_device) {
        auto& [ns, calls] = by_name[e.name];
        ns += e.duration_ns, ++calls, all_ns += e.duration_ns;
      }
  } else {
    const auto self = self_times(host);
    for (size_t i = 0; i < host.size(); ++i) {
      auto& [ns, calls] = by_name[host[i]->name];
      ns += self[i], ++calls, all_ns += self[i];
    }
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> ranked(by_name.begin(), by_name.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  if (ranked.size() > kTop) ranked.resize(kTop);
  auto top = nlohmann::json::array();
  for (const auto& [name, t] : ranked)
    top.push_back({{"name", name.substr(0, kNameChars)},
                   {"total_ms", static_cast<double>(t.first) / 1e6},
                   {"calls", t.second},
                   {"percent", all_ns > 0 ? 100.0 * static_cast<double>(t.first) / static_cast<double>(all_ns) : 0.0}});

  auto step_ms = nlohmann::json::array();
  for (const auto* s : steps) step_ms.push_back(static_cast<double>(s->duration_ns) / 1e6);
  const auto step_number = [&](const TraceEvent* e) {
    return std::stoll(e->name.substr(std::string(kStepPrefix).size()));
  };
  return {{"source", source},
          {"device", gpu ? "cuda" : "cpu"},
          {"steps", static_cast<int64_t>(steps.size())},
          {"first_step", steps.empty() ? 0 : step_number(steps.front())},
          {"last_step", steps.empty() ? 0 : step_number(steps.back())},
          {"window_ms", window_ns / 1e6},
          {"wall_ms_per_step", window_ns / 1e6 / static_cast<double>(n_steps)},
          {"step_ms", step_ms},
          {"gpu_busy_fraction",
           gpu && window_ns > 0 ? nlohmann::json(std::min(1.0, union_ns(busy) / window_ns)) : nlohmann::json(nullptr)},
          {"kernel_launches_per_step", static_cast<double>(launches) / static_cast<double>(n_steps)},
          {"host_syncs_per_step", static_cast<double>(syncs) / static_cast<double>(n_steps)},
          {"ranked_by", gpu ? "gpu_time" : "self_cpu_time"},
          {"top", top}};
}

// bench/gpu/profile_summary.py's summary_text writes the same lines.
std::string profile_summary_text(const nlohmann::json& s) {
  std::string steps_ms;
  for (const auto& ms : s["step_ms"]) steps_ms += (steps_ms.empty() ? "" : ", ") + fixed(ms.get<double>(), 2);
  std::string out = concat("profile (", s["source"].get<std::string>(), "): steps ", s["first_step"].get<int64_t>(),
                           "-", s["last_step"].get<int64_t>(), " (", s["steps"].get<int64_t>(), ") on ",
                           s["device"].get<std::string>(), "\n");
  out += concat("wall time per step: ", fixed(s["wall_ms_per_step"].get<double>(), 2), " ms (window ",
                fixed(s["window_ms"].get<double>(), 2), " ms; steps on the host: ", steps_ms, " ms)\n");
  out += s["gpu_busy_fraction"].is_null()
             ? std::string("GPU busy: - (no GPU)\n")
             : concat("GPU busy: ", fixed(100 * s["gpu_busy_fraction"].get<double>(), 1), "% of the window\n");
  out += concat("kernel launches per step: ", fixed(s["kernel_launches_per_step"].get<double>(), 1), "\n");
  out += concat("host syncs per step: ", fixed(s["host_syncs_per_step"].get<double>(), 1), "\n");
  out += concat("top ", s["top"].size(),
                s["ranked_by"] == "gpu_time" ? " kernels by GPU time:\n" : " ops by self CPU time:\n");
  out += "  total ms    calls       %  name\n";
  for (const auto& t : s["top"]) {
    char row[64];
    std::snprintf(row, sizeof(row), "%10.3f %8lld %6.1f%%  ", t["total_ms"].get<double>(),
                  static_cast<long long>(t["calls"].get<int64_t>()), t["percent"].get<double>());
    out += row + t["name"].get<std::string>() + "\n";
  }
  return out;
}

struct StepProfiler::Recording {
  std::optional<at::RecordFunction> step;  // the open step's ProfilerStep#N annotation
};

StepProfiler::StepProfiler(const std::vector<int64_t>& steps, std::filesystem::path dir, c10::Device device, bool on)
    : dir_(std::move(dir)), device_(device), on_(on && steps.size() == 2) {
  if (on_) first_ = steps[0], last_ = steps[1];
}

StepProfiler::~StepProfiler() {
  if (!rec_) return;
  rec_->step.reset();
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (const std::exception& e) {
    log::warn("train.profile_steps: stopping the profiler: ", e.what());
  }
}

void StepProfiler::begin_step(int64_t step) {
  if (!on_ || done_ || step < first_ || step > last_ || open_step_ == step) return;
  if (!rec_) {
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
    if (device_.is_cuda()) {
      activities.insert(impl::ActivityType::CUDA);
      at::accelerator::synchronizeDevice(device_.has_index() ? device_.index() : at::accelerator::getDeviceIndex());
    }
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    rec_ = std::make_unique<Recording>();
  }
  rec_->step.emplace(at::RecordScope::USER_SCOPE);
  if (rec_->step->isActive()) rec_->step->before(concat(kStepPrefix, step));
  open_step_ = step;
}

void StepProfiler::end_step(int64_t step) {
  if (!rec_ || open_step_ != step) return;
  rec_->step.reset();
  open_step_ = 0;
  if (step >= last_) write();
}

void StepProfiler::finish() {
  if (rec_) {
    rec_->step.reset();
    write();
  } else if (on_ && !done_) {
    log::warn("train.profile_steps: steps ", first_, "-", last_, " did not run; nothing profiled");
  }
}

void StepProfiler::write() {
  done_ = true;
  // The last step's kernels finish inside the recording (this sync is not
  // counted: it comes after the last step's annotation).
  if (device_.is_cuda())
    at::accelerator::synchronizeDevice(device_.has_index() ? device_.index() : at::accelerator::getDeviceIndex());
  rec_.reset();
  auto result = torch::autograd::profiler::disableProfiler();
  stdfs::create_directories(dir_);
  result->save((dir_ / "trace.json").string());
  std::vector<TraceEvent> events;
  events.reserve(result->events().size());
  for (const auto& e : result->events()) {
    const auto type = static_cast<libkineto::ActivityType>(e.activityType());
    const bool on_device = e.deviceType() == c10::DeviceType::CUDA;
    auto name = e.name();
    // Annotations but the host's step markers (the device's copies of them would count as busy time).
    const bool annotation =
        type == libkineto::ActivityType::USER_ANNOTATION || type == libkineto::ActivityType::GPU_USER_ANNOTATION;
    if (annotation && (on_device || name.rfind(kStepPrefix, 0) != 0)) continue;
    events.push_back({std::move(name), on_device, static_cast<int64_t>(e.startNs()),
                      static_cast<int64_t>(e.durationNs()), e.startThreadId()});
  }
  const auto summary = profile_summary(events, device_.is_cuda(), "anvil");
  fs::write_file_atomic(dir_ / "summary.json", summary.dump(2) + "\n");
  fs::write_file_atomic(dir_ / "summary.txt", profile_summary_text(summary));
  if (summary["last_step"].get<int64_t>() < last_)
    log::warn("train.profile_steps: the run ended after step ", summary["last_step"].get<int64_t>(), ", before step ",
              last_, "; profiled what ran");
  log::info("profile of steps ", summary["first_step"].get<int64_t>(), "-", summary["last_step"].get<int64_t>(), ": ",
            dir_.string(), " (trace.json, summary.txt)");
}

}  // namespace anvil::train
