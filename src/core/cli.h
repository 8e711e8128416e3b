#pragma once
// How Anvil's programs end on an error: one line on stderr and an exit code.

#include <functional>

namespace anvil {

/// Runs `body` and returns its exit code. An anvil::Error (bad input: a
/// config, a file, a flag) prints "error: <message>" and returns 2; any other
/// exception (LibTorch's included, without its C++ backtrace) prints it and
/// returns 1.
int run_reporting_errors(const std::function<int()>& body);

}  // namespace anvil
