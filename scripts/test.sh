#!/usr/bin/env bash
# Set up (idempotent), check the code's layout (.clang-format), build, and run the whole test suite under ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/format.sh --check
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
# ctest runs JOBS tests at once, each process with its own OpenMP threads: more threads than cores. LibTorch's
# OpenMP (libgomp) spins while it waits, and a spinning thread takes the core another process's thread needs:
# DocsCommands and TensorParallelRuns side by side took 118 s and 136 s spinning, 48 s and 72 s with idle threads
# sleeping (2-core Intel Xeon, 2026-12-07; docs/reliability.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
ctest -j "${JOBS:-$(nproc)}" --output-on-failure --timeout 900 "$@"
