#!/usr/bin/env bash
# Set up (idempotent), build, and run the whole test suite under ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest -j "${JOBS:-$(nproc)}" --output-on-failure --timeout 900 "$@"
