#!/usr/bin/env bash
# Set up (idempotent), check the code's layout (.clang-format), build, and run the whole test suite under ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/format.sh --check
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest -j "${JOBS:-$(nproc)}" --output-on-failure --timeout 900 "$@"
