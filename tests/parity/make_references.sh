#!/usr/bin/env bash
# make_references.sh PYTHON SCRIPT DIR: a ctest fixture (tests/CMakeLists.txt)
# that runs the reference script tests/parity/SCRIPT once into a fresh DIR,
# which the tests of its file then read (tests/test_util.h ReferenceFolder).
set -euo pipefail
python="$1" script="$2" dir="$3"
rm -rf "$dir"
mkdir -p "$dir"
exec "$python" "$(dirname "${BASH_SOURCE[0]}")/$script" "$dir"
