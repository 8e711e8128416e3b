// spdlog lives here only; this TU is compiled without LibTorch's include path.
#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

namespace anvil::log {
namespace {

struct State {
  std::shared_ptr<spdlog::logger> logger;
  Level level = Level::info;
  int rank = 0;
  bool progress_open = false;  // a '\r' line is on screen
  bool tty = false;
  std::mutex mu;
};

State& state() {
  static State s;
  static std::once_flag once;
  std::call_once(once, [] {
    s.logger = spdlog::stderr_color_mt("anvil");
    s.logger->set_pattern("%^[%H:%M:%S %L]%$ %v");
    s.logger->set_level(spdlog::level::trace);
    s.tty = isatty(fileno(stderr)) != 0;
  });
  return s;
}

spdlog::level::level_enum to_spd(Level l) {
  switch (l) {
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

bool enabled(const State& s, Level l) {
  if (l < s.level) return false;
  return s.rank == 0 || l >= Level::warn;
}

}  // namespace

void configure(Level level, int rank) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  s.level = level;
  s.rank = rank;
}

Level parse_level(std::string_view name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  throw ConfigError(concat("unknown log level \"", name, "\"; expected one of debug, info, warn, error"));
}

void write(Level level, std::string_view message) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  if (!enabled(s, level)) return;
  if (s.progress_open) {
    std::fputs("\r\033[K", stderr);
    s.progress_open = false;
  }
  s.logger->log(to_spd(level), "{}", message);
}

void progress(std::string_view line) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  if (!enabled(s, Level::info)) return;
  if (!s.tty) {
    s.logger->log(spdlog::level::info, "{}", line);
    return;
  }
  std::fprintf(stderr, "\r\033[K%.*s", static_cast<int>(line.size()), line.data());
  std::fflush(stderr);
  s.progress_open = true;
}

}  // namespace anvil::log
