#!/usr/bin/env bash
# No std:: symbol that trainer, anvil or libanvil uses may bind to a torch
# library: the wheel's libtorch exports its own copies of some libstdc++ code,
# and its std::filesystem::remove_all crashes against GCC 12/13's libstdc++
# (cmake/AnvilPrivateStdcxx.cmake). Checked with the dynamic linker's own
# report (LD_DEBUG=bindings, every symbol bound at start-up with LD_BIND_NOW),
# on a run that saves and prunes checkpoints, both as linked and with
# libtorch.so preloaded, which puts its symbols ahead of everything else.
#
# usage: symbol_binding_test.sh <build-dir> <source-dir>
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
TRAINER="$BUILD/bin/trainer"
CLI="$BUILD/bin/anvil"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0

torch_lib=$(ldd "$TRAINER" | awk '/libtorch\.so / {print $3}')
[ -n "$torch_lib" ] || { echo "FAIL: trainer does not link libtorch.so"; exit 1; }

# Prints the std:: bindings from Anvil's binaries into torch libraries found
# in an LD_DEBUG log (one file per process: <prefix>.<pid>).
torch_bindings() {
  cat "$1".* 2>/dev/null |
    grep -E "binding file [^ ]*(/trainer|/anvil|/libanvil\.so[.0-9]*) \[[0-9]+\] to [^ ]*/libtorch[^ ]*\.so[^ ]* \[[0-9]+\]: normal symbol \`_Z(N|NK)?St" |
    sed -E 's/^ *[0-9]+: *//' | sort -u || true
}

# check <name> <env...> -- <command...>: runs it with binding reports on.
check() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local log="$WORK/ld-$name"
  if ! env "${envs[@]}" LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log" "$@" >"$WORK/$name.out" 2>&1; then
    echo "FAIL [$name]: exited non-zero: $*"; tail -20 "$WORK/$name.out"; fail=1
  fi
  local bad
  bad=$(torch_bindings "$log")
  if [ -n "$bad" ]; then
    echo "FAIL [$name]: std:: symbols bound to torch:"; echo "$bad" | head -20; fail=1
  else
    local n
    n=$(cat "$log".* | grep -cE 'binding file [^ ]*(/trainer|/anvil|/libanvil\.so[.0-9]*) .*normal symbol `_Z(N|NK)?St' || true)
    echo "ok [$name]: $n std:: bindings from Anvil's binaries, none into torch"
  fi
  rm -f "$log".*
}

# A run that saves every 10 steps and keeps one checkpoint: pruning calls
# std::filesystem::remove_all on checkpoint-10 and checkpoint-20.
train_args=(--config "$SRC/configs/quickstart.yaml" train.max_steps=30 schedule.warmup_steps=0
  train.save_every=10 train.keep_checkpoints=1 train.eval_every=1000 eval.generate_samples=0
  train.log_every=10 train.threads=1 logging.level=warn)
pruned_only_last() {
  local out=$1
  if [ -d "$out/checkpoint-30" ] && [ ! -e "$out/checkpoint-10" ] && [ ! -e "$out/checkpoint-20" ]; then
    echo "ok: $out holds checkpoint-30 only"
  else
    echo "FAIL: pruning left $(ls "$out" | tr '\n' ' ')"; fail=1
  fi
}

cd "$SRC"
check trainer -- "$TRAINER" "${train_args[@]}" output_dir="$WORK/run"
pruned_only_last "$WORK/run"
check trainer-preloaded LD_PRELOAD="$torch_lib" -- "$TRAINER" "${train_args[@]}" output_dir="$WORK/run-preloaded"
pruned_only_last "$WORK/run-preloaded"
check anvil-generate -- "$CLI" generate --model "$WORK/run/checkpoint-30" --prompt 'upper: abc\n' --max-new-tokens 4
check anvil-export-preloaded LD_PRELOAD="$torch_lib" -- "$CLI" export --checkpoint "$WORK/run/checkpoint-30" --output "$WORK/export"

if [ "$fail" -ne 0 ]; then echo "symbol binding test FAILED"; exit 1; fi
echo "symbol binding test passed"
