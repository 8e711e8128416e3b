#pragma once
// Small helpers shared by the benchmark programs.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace anvil::bench {

/// --key value pairs; every key must have a default in `defaults`.
inline std::map<std::string, std::string> parse_args(int argc, char** argv,
                                                     std::map<std::string, std::string> defaults) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || !defaults.count(k.substr(2))) {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      std::exit(2);
    }
    defaults[k.substr(2)] = argv[i + 1];
  }
  return defaults;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace anvil::bench
