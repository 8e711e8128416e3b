# Sourced by the installed-package tests: their builds of a program against
# the installed package go through ccache, so that a rerun (and a fresh clone,
# whose folders are laid out alike) reuses the objects instead of compiling
# against LibTorch's headers again. The temp folder lies in the build tree, so
# when that is inside the checkout every path is relative to one base folder
# (CCACHE_BASEDIR) and the random folder name does not reach the cache key.
# Needs ROOT and TMP.
CCACHE_LAUNCHER=()
if command -v ccache >/dev/null; then
  CCACHE_LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  case "$TMP" in "$ROOT"/*) export CCACHE_BASEDIR="$ROOT" ;; *) export CCACHE_BASEDIR="$TMP" ;; esac
fi
