#include "core/host_memory.h"

#include <malloc.h>

#include <algorithm>
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

void HostPeaks::begin(const std::string& phase) {
  resets_ = reset_host_peak() && resets_;
  started_[phase] = host_memory().resident;
}

void HostPeaks::end(const std::string& phase) {
  const auto now = host_memory();
  auto& p = peaks_[phase];
  p.peak = std::max(p.peak, now.peak);
  if (const auto it = started_.find(phase); it != started_.end()) {
    p.resident_at_start = std::max(p.resident_at_start, it->second);
    started_.erase(it);
  }
}

void HostPeaks::write(const std::filesystem::path& path) const {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, p] : peaks_)
    phases[name] = {{"peak_bytes", p.peak}, {"resident_at_start_bytes", p.resident_at_start}};
  std::filesystem::create_directories(path.parent_path());
  fs::write_file_atomic(path, nlohmann::json({{"phases", phases}, {"resets", resets_}}).dump(1) + "\n");
}

HostPeaks& host_peaks() {
  static HostPeaks peaks;
  return peaks;
}

}  // namespace anvil
