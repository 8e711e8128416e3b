#pragma once
// train.profile_steps: the training loop records a Kineto trace (LibTorch's
// profiler) of a range of optimizer steps on rank 0 and writes
// output_dir/profile/: trace.json, summary.json and summary.txt. The summary
// is computed as bench/gpu/profile_summary.py computes it for the
// transformers peer, so the two read side by side.

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::train {

/// One event of a trace as the summary reads it. Steps are host-side
/// annotations named "ProfilerStep#N" (torch.profiler's name for them).
struct TraceEvent {
  std::string name;
  bool on_device = false;  // a GPU kernel, memcpy or memset; else a host op, annotation or runtime call
  int64_t start_ns = 0, duration_ns = 0;
  uint64_t thread = 0;  // the host thread (self time nests within one)
};

/// summary.json: the profiled steps, wall time per step, the top 15 kernels by
/// GPU time (`gpu`) or ops by self CPU time, the GPU busy fraction, kernel
/// launches and host syncs per step. `source` names the program.
nlohmann::json profile_summary(const std::vector<TraceEvent>& events, bool gpu, const std::string& source);
/// summary.txt: the same, for reading.
std::string profile_summary_text(const nlohmann::json& summary);

/// Records steps [first, last] (1-based) when `on`; the loop calls
/// begin_step/end_step around each step and finish when it ends.
class StepProfiler {
 public:
  StepProfiler(const std::vector<int64_t>& steps, std::filesystem::path dir, c10::Device device, bool on);
  /// A recording that an error interrupted is stopped; nothing is written.
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Step `step` begins (a second call for the same step does nothing).
  void begin_step(int64_t step);
  /// Step `step` ended; after the range's last step, stops and writes.
  void end_step(int64_t step);
  /// The run ended: writes what was recorded if the range was cut short.
  void finish();

 private:
  struct Recording;
  void write();

  int64_t first_ = 0, last_ = -1;
  std::filesystem::path dir_;
  c10::Device device_;
  bool on_ = false, done_ = false;
  int64_t open_step_ = 0;
  std::unique_ptr<Recording> rec_;
};

}  // namespace anvil::train
