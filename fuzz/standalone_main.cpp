// Runs a fuzz target over files and folders of inputs without libFuzzer: how
// ctest replays each target's corpus (seeds and the reproducers of past
// findings) in the GCC build. Exits non-zero when no input was found.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace stdfs = std::filesystem;
  std::vector<stdfs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const stdfs::path p = argv[i];
    if (stdfs::is_directory(p)) {
      for (const auto& e : stdfs::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else {
      inputs.push_back(p);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...: no inputs found\n", argv[0]);
    return 2;
  }
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "running %s (%zu bytes)\n", p.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "%zu inputs, all handled\n", inputs.size());
  return 0;
}
