#!/usr/bin/env bash
# The C++ and CUDA sources' layout (.clang-format, clang-format 14 as Debian
# bookworm ships it; scripts/setup.sh installs it).
#   scripts/format.sh          rewrite every tracked source in place
#   scripts/format.sh --check  change nothing; list the files that differ and exit 1 (scripts/test.sh runs this)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CF=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$CF" ] || { echo "[format] clang-format is missing: run scripts/setup.sh" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  # One clang-format for every file: each one that would change is reported as an error.
  rc=0
  out=$("$CF" --style=file --dry-run -Werror "${files[@]}" 2>&1) || rc=$?
  mapfile -t bad < <(printf '%s\n' "$out" |
    sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
  if [ $rc -ne 0 ] && [ ${#bad[@]} -eq 0 ]; then
    printf '%s\n' "$out" | tail -n 20 >&2
    echo "[format] $CF failed (exit status $rc)" >&2
    exit 1
  fi
  if [ ${#bad[@]} -gt 0 ]; then
    echo "[format] ${#bad[@]} file(s) differ from .clang-format's layout:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "[format] fix with: scripts/format.sh   (or: $CF -i --style=file FILE)" >&2
    exit 1
  fi
  echo "[format] ${#files[@]} files follow .clang-format"
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: scripts/format.sh [--check]" >&2; exit 2; }
"$CF" -i --style=file "${files[@]}"
echo "[format] formatted ${#files[@]} files"
