// The run config: a YAML file plus command-line overrides, as
// `trainer --config F key=value...` reads them. The input is the YAML text,
// then NUL-separated overrides. A config that loads must survive a round trip
// through to_yaml (what a run saves as config.yaml and a resume compares).

#include <unistd.h>

#include <vector>

#include "anvil/config/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool in_source = ::chdir(anvil::fuzz::source_dir()) == 0;  // the configs' relative paths resolve
  (void)in_source;
  auto [yaml, rest] = anvil::fuzz::split_at_nul(data, size);
  std::vector<std::string> overrides;
  while (!rest.empty() && overrides.size() < 8) {
    const auto k = rest.find('\0');
    overrides.emplace_back(rest.substr(0, k));
    rest = k == std::string_view::npos ? std::string_view{} : rest.substr(k + 1);
  }
  const auto file = anvil::fuzz::scratch_dir() / "run.yaml";
  anvil::fuzz::write_file(file, yaml);
  return anvil::fuzz::guarded([&] {
    const auto cfg = anvil::config::load_config({file.string()}, overrides);
    const auto saved = anvil::config::to_yaml(cfg);
    const auto again_file = anvil::fuzz::scratch_dir() / "again.yaml";
    anvil::fuzz::write_file(again_file, saved);
    std::string again;
    try {
      again = anvil::config::to_yaml(anvil::config::load_config({again_file.string()}, {}));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz: the saved config does not load again: %s\n%s\n", e.what(), saved.c_str());
      std::abort();
    }
    if (again != saved) {
      std::fprintf(stderr, "fuzz: the config changed in a round trip:\n%s\n---\n%s\n", saved.c_str(), again.c_str());
      std::abort();
    }
  });
}
