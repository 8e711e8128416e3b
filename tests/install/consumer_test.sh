#!/usr/bin/env bash
# Installs the build into a temp prefix, builds tests/install/ against it with
# find_package(anvil), and runs the result.
set -euo pipefail
BUILD_DIR="$1"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$SRC/../.." && pwd)"
TMP="$(realpath "$(mktemp -d -p "$BUILD_DIR" install-test.XXXXXX)")"
trap 'rm -rf "$TMP"' EXIT
source "$ROOT/tests/install/ccache_env.sh"
cmake --install "$BUILD_DIR" --prefix "$TMP/prefix" >/dev/null
TORCH_PREFIX="$("$ROOT/.venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
cmake -S "$SRC" -B "$TMP/build" -G Ninja "${CCACHE_LAUNCHER[@]}" -DCMAKE_PREFIX_PATH="$TMP/prefix;$TORCH_PREFIX" >/dev/null
cmake --build "$TMP/build" >/dev/null
out="$("$TMP/build/consumer")"
echo "$out"
[[ "$out" == "logits [1, 4, 10] keys "* ]]
