#include "core/metrics.h"

#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "anvil/core/error.h"
#include "core/fs.h"

namespace anvil {

MetricsWriter::MetricsWriter(const std::filesystem::path& path, int64_t keep_until_step) : path_(path) {
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::vector<std::string> kept;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line from a killed run is not valid JSON: drop it.
      if (j.is_discarded() || !j.contains("step")) continue;
      if (j["step"].get<int64_t>() <= keep_until_step) kept.push_back(line);
    }
    std::ostringstream os;
    for (const auto& l : kept) os << l << '\n';
    fs::write_file_atomic(path, os.str());
  }
  out_.open(path, std::ios::app);
  if (!out_) throw IoError(concat(path.string(), ": cannot open for appending"));
}

void MetricsWriter::write(int64_t step, const Metrics& metrics) {
  if (!out_.is_open()) return;
  nlohmann::json j;
  j["step"] = step;
  for (const auto& [k, v] : metrics) j[k] = v;
  out_ << j.dump() << '\n';
  out_.flush();
}

}  // namespace anvil
