#!/usr/bin/env bash
# Configure and build into build/ (Ninja, ccache, precompiled headers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
TORCH_PREFIX="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" "$@"
