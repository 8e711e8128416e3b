#pragma once
// How Anvil's programs end on an error (one line on stderr and an exit code),
// and the version they print.

#include <functional>

namespace anvil {

/// Runs `body` and returns its exit code. An anvil::Error (bad input: a
/// config, a file, a flag) prints "error: <message>" and returns 2; any other
/// exception (LibTorch's included, without its C++ backtrace) prints it and
/// returns 1.
int run_reporting_errors(const std::function<int()>& body);

/// This build's version ("0.1.0"): the top-level CMakeLists.txt's
/// project(VERSION), which `trainer --version` and `anvil --version` print.
const char* version();

}  // namespace anvil
