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

/// Asks Intel MKL, LibTorch's CPU BLAS, for bit-reproducible results
/// (MKL_CBWR=AUTO,STRICT, unless the environment sets MKL_CBWR): otherwise
/// its float32 matrix products on AVX-512 CPUs depend on how the operands
/// happen to be aligned, and two runs of the same steps (a resumed run and
/// the uninterrupted one, a run that saved at once and one that saved in the
/// background) can part in the last bits. Call before the first product.
/// Measured on an Intel Xeon (AVX-512): no change in bench_train_step's
/// tokens/s (docs/reliability.md).
void reproducible_cpu_math();

/// This build's version ("0.1.0"): the top-level CMakeLists.txt's
/// project(VERSION), which `trainer --version` and `anvil --version` print.
const char* version();

}  // namespace anvil
