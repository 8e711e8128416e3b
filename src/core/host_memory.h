#pragma once
// The process's host memory as the kernel counts it (VmRSS and its
// high-water mark VmHWM, /proc/self/status), and the peaks of a run's phases
// (load, resume, train, save): each the high-water mark from the phase's
// start, where it is reset (/proc/self/clear_refs), to its end. The trainer
// writes them per rank (output_dir/host_memory/rank-NNNNN.json), so memory
// claims about sharding are measured, not computed (docs/distributed.md).

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace anvil {

/// Bytes resident now and the high-water mark; -1 where /proc cannot tell.
struct HostMemory {
  int64_t resident = -1;
  int64_t peak = -1;
};
HostMemory host_memory();

/// Resets the high-water mark to what is resident now; false where the
/// kernel refuses (then a phase's peak is the process's peak so far).
bool reset_host_peak();

/// Gives the free memory inside glibc's heaps back to the kernel
/// (malloc_trim): buffers below its mmap threshold (which grows to 32 MB)
/// are freed into the heap, and the holes a phase leaves stay resident and
/// count in the next phase's peak. Called where a phase that allocates and
/// frees much ends: the load, a resume, the steps before a save, a save.
void return_free_host_memory();

/// Bytes held by CPU tensors: an allocator wrapped around ATen's CPU
/// allocator counts each allocation and its free (torch.cuda's
/// memory_allocated and max_memory_allocated, for the host). The trainer
/// installs it on CPU runs; tensors allocated before are not counted, their
/// frees neither. Two peaks, reset apart: a step's (memory/cpu_peak_bytes)
/// and a phase's (HostPeaks).
struct TensorMemory {
  int64_t current = -1;  // -1 when not counting
  int64_t peak = -1;
};
enum class TensorPeak { step, phase };
/// Installs the counting allocator; later calls do nothing. Call it before
/// threads allocate (it replaces ATen's CPU allocator).
void count_cpu_tensors();
TensorMemory cpu_tensor_memory(TensorPeak which);
/// Resets `which` peak to the bytes held now.
void reset_cpu_tensor_peak(TensorPeak which);

/// The largest high-water mark seen in each named phase.
class HostPeaks {
 public:
  /// Starts a phase: resets the high-water mark.
  void begin(const std::string& phase);
  /// Ends a phase: its peak is the high-water mark now (the process's peak
  /// since start for a phase never begun, such as load); the largest over
  /// the phase's repeats is kept.
  void end(const std::string& phase);
  /// Writes {"phases": {name: {"peak_bytes", "resident_at_start_bytes", "tensor_peak_bytes"}}, "resets": bool}
  /// to `path` (tensor_peak_bytes: CPU tensors' peak in the phase, -1 when not counting).
  void write(const std::filesystem::path& path) const;
  bool has(const std::string& phase) const { return peaks_.count(phase) > 0; }

 private:
  struct Peak {
    int64_t peak = -1, resident_at_start = -1, tensor_peak = -1;
  };
  std::map<std::string, Peak> peaks_;
  std::map<std::string, int64_t> started_;  // resident bytes when each open phase began
  bool resets_ = true;
};

/// The process's phases (one per process: each rank records its own).
HostPeaks& host_peaks();

}  // namespace anvil
