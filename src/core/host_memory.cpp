#include "core/host_memory.h"

#include <c10/core/CPUAllocator.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fs.h"

namespace anvil {

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = -1;
    fields >> key >> kib;
    if (key == "VmRSS:") m.resident = kib * 1024;
    if (key == "VmHWM:") m.peak = kib * 1024;
  }
  return m;
}

void return_free_host_memory() { ::malloc_trim(0); }

bool reset_host_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

namespace {

/// ATen's CPU allocator with a count of the bytes its tensors hold. Each
/// allocation is the base allocator's, 64 bytes longer: a header before the
/// data keeps its size and the base's context and deleter until the free.
/// Nothing else is allocated (a map of live pointers, tried first, put a
/// small heap node after every buffer, and glibc could no longer merge the
/// freed buffers: a 4-rank run's peak rose by up to 300 MB).
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return base_->allocate(0);
    auto d = base_->allocate(n + kHeader);
    auto* start = static_cast<char*>(d.get());
    auto* header = reinterpret_cast<Header*>(start);
    header->bytes = n;
    header->deleter = d.get_deleter();
    header->context = d.release_context();
    const auto now = current_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    for (auto& peak : peaks_) {
      auto seen = peak.load(std::memory_order_relaxed);
      while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
      }
    }
    void* data = start + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

  static void release(void* data) {
    if (data == nullptr) return;
    const auto* header = reinterpret_cast<const Header*>(static_cast<char*>(data) - kHeader);
    current_.fetch_sub(static_cast<int64_t>(header->bytes), std::memory_order_relaxed);
    const auto deleter = header->deleter;
    if (deleter != nullptr) deleter(header->context);
  }

  static TensorMemory read(TensorPeak which) {
    return {current_.load(std::memory_order_relaxed),
            peaks_[static_cast<size_t>(which)].load(std::memory_order_relaxed)};
  }
  static void reset(TensorPeak which) {
    peaks_[static_cast<size_t>(which)].store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

 private:
  struct Header {
    size_t bytes = 0;
    c10::DeleterFnPtr deleter = nullptr;
    void* context = nullptr;
  };
  // The data stays aligned as the base aligns it (c10's 64 bytes).
  static constexpr size_t kHeader = 64;
  static_assert(sizeof(Header) <= kHeader);
  c10::Allocator* base_;
  static inline std::atomic<int64_t> current_{0};
  static inline std::array<std::atomic<int64_t>, 2> peaks_{};
};

std::atomic<bool>& counting() {
  static std::atomic<bool> on{false};
  return on;
}

}  // namespace

void count_cpu_tensors() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: tensors freed at exit still reach it.
    static auto* counting_allocator = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(counting_allocator, std::numeric_limits<uint8_t>::max());
    counting().store(true);
  });
}

TensorMemory cpu_tensor_memory(TensorPeak which) {
  return counting().load() ? CountingCpuAllocator::read(which) : TensorMemory{};
}

void reset_cpu_tensor_peak(TensorPeak which) {
  if (counting().load()) CountingCpuAllocator::reset(which);
}

void HostPeaks::begin(const std::string& phase) {
  resets_ = reset_host_peak() && resets_;
  reset_cpu_tensor_peak(TensorPeak::phase);
  started_[phase] = host_memory().resident;
}

void HostPeaks::end(const std::string& phase) {
  const auto now = host_memory();
  auto& p = peaks_[phase];
  p.peak = std::max(p.peak, now.peak);
  p.tensor_peak = std::max(p.tensor_peak, cpu_tensor_memory(TensorPeak::phase).peak);
  if (const auto it = started_.find(phase); it != started_.end()) {
    p.resident_at_start = std::max(p.resident_at_start, it->second);
    started_.erase(it);
  }
}

void HostPeaks::write(const std::filesystem::path& path) const {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, p] : peaks_)
    phases[name] = {
        {"peak_bytes", p.peak}, {"resident_at_start_bytes", p.resident_at_start}, {"tensor_peak_bytes", p.tensor_peak}};
  std::filesystem::create_directories(path.parent_path());
  fs::write_file_atomic(path, nlohmann::json({{"phases", phases}, {"resets", resets_}}).dump(1) + "\n");
}

HostPeaks& host_peaks() {
  static HostPeaks peaks;
  return peaks;
}

}  // namespace anvil
