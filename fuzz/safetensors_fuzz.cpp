// The safetensors header and tensor table (what SafetensorsFile reads from a
// model or checkpoint folder before touching any tensor). Every tensor span
// the parser accepts is read back, so an offset it let through outside the
// file is an AddressSanitizer report.

#include <vector>

#include "io/safetensors_header.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: reading past it is caught.
  const std::vector<char> file(data, data + size);
  return anvil::fuzz::guarded([&] {
    const auto h = anvil::io::parse_safetensors_header(file.data(), file.size(), "fuzz.safetensors");
    volatile unsigned char sum = 0;
    for (const auto& [name, e] : h.entries)
      for (size_t i = e.begin; i < e.end; i += 61) sum = sum + static_cast<unsigned char>(file[h.data_start + i]);
    for (const auto& [name, e] : h.entries)
      if (e.end > e.begin) sum = sum + static_cast<unsigned char>(file.at(h.data_start + e.end - 1));
  });
}
