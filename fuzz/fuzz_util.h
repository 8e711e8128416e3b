#pragma once
// Shared by the fuzz targets. Each target feeds its input to one of Anvil's
// parsers through the entry point a user's file reaches. The contract checked:
// any input either loads or raises an anvil::Error (whose message names the
// file and key); any other exception, a crash, a hang or a sanitizer report
// is a finding.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "anvil/core/error.h"

namespace anvil::fuzz {

/// The checkout (fuzz/source_dir.cpp; one TU holds the absolute path, so
/// that ccache reuses the targets' objects in another clone).
const char* source_dir();

/// A folder of this process's own, in /dev/shm when there is one (the
/// targets write their input to files, as a user's data arrives).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    auto d = base / ("anvil-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Runs `fn`; an anvil::Error is the expected answer to bad input, anything
/// else aborts (a finding, with the exception's type and message).
template <class Fn>
int guarded(Fn&& fn) {
  try {
    fn();
  } catch (const anvil::Error& e) {
    if (std::getenv("ANVIL_FUZZ_VERBOSE")) std::fprintf(stderr, "rejected: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: uncaught %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: uncaught non-std exception\n");
    std::abort();
  }
  return 0;
}

/// Splits `data` at the first NUL byte: {before, after} (after empty if none).
inline std::pair<std::string_view, std::string_view> split_at_nul(const uint8_t* data, size_t size) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  const auto k = s.find('\0');
  if (k == std::string_view::npos) return {s, {}};
  return {s.substr(0, k), s.substr(k + 1)};
}

}  // namespace anvil::fuzz
