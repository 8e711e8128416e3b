#pragma once
// The one logging facade. Only src/core/logging.cpp sees spdlog (it is built
// without LibTorch's include path, whose bundled fmt clashes with Debian's).

#include <string>
#include <string_view>

#include "anvil/core/error.h"

namespace anvil::log {

enum class Level { debug, info, warn, error };

/// Minimum level printed; `rank` > 0 silences info/debug on non-zero ranks.
void configure(Level level, int rank = 0);
Level parse_level(std::string_view name);  // throws ConfigError

void write(Level level, std::string_view message);

/// A transient status line (progress bar). On a terminal it redraws in place;
/// otherwise it is printed as a normal info line.
void progress(std::string_view line);

template <class... Args>
void debug(Args&&... args) {
  write(Level::debug, concat(std::forward<Args>(args)...));
}
template <class... Args>
void info(Args&&... args) {
  write(Level::info, concat(std::forward<Args>(args)...));
}
template <class... Args>
void warn(Args&&... args) {
  write(Level::warn, concat(std::forward<Args>(args)...));
}
template <class... Args>
void error(Args&&... args) {
  write(Level::error, concat(std::forward<Args>(args)...));
}

}  // namespace anvil::log
