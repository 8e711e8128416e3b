#!/usr/bin/env bash
# Fuzzing campaigns for the parsers of user files, with libFuzzer (clang) and
# AddressSanitizer + UndefinedBehaviorSanitizer. Each target starts from its
# seeds and past reproducers in fuzz/corpus/<target>/ and runs until RUNS
# executions or MAX_TIME seconds, whichever comes first; the grown corpus,
# crash artifacts and logs stay in build/fuzz-libfuzzer/. A finding is fixed,
# and its reproducer copied to fuzz/corpus/<target>/regress-<what>, where the
# ctest replay (Fuzz.<target>.Corpus) keeps checking it.
#
#   scripts/fuzz.sh                      # every target, 2M runs or 30 min each
#   RUNS=100000 scripts/fuzz.sh jsonl    # one target, a short run
#   PARALLEL=2 scripts/fuzz.sh           # two targets at once (2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${RUNS:-2000000}"
MAX_TIME="${MAX_TIME:-1800}"
PARALLEL="${PARALLEL:-1}"
OUT="${OUT:-build/fuzz-libfuzzer}"
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors trainer_state token_shards jsonl config hf_tokenizer sentencepiece chat_template)

bash scripts/setup.sh >/dev/null
# clang and its runtime (libFuzzer, the sanitizers): only this script needs them.
need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
[ -f /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

if [ ! -f "$OUT/build.ninja" ]; then
  cmake -S fuzz -B "$OUT" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DANVIL_FUZZ_ENGINE=libfuzzer \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$OUT" -j "$(nproc)" --target $(printf 'anvil_fuzz_%s ' "${TARGETS[@]}")

run_one() {
  local t="$1"
  mkdir -p "$OUT/corpus/$t" "$OUT/artifacts/$t" "$OUT/logs"
  local log="$OUT/logs/$t.log"
  local start=$SECONDS
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$OUT/anvil_fuzz_$t" -runs="$RUNS" -max_total_time="$MAX_TIME" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/" \
    "$OUT/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  local rc=$?
  set -e
  local execs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  printf '%-14s rc=%-3s execs=%-9s seconds=%-5s corpus=%-5s artifacts=%s\n' "$t" "$rc" "$execs" \
    "$((SECONDS - start))" "$(ls "$OUT/corpus/$t" | wc -l)" "$(ls "$OUT/artifacts/$t" | wc -l)"
}

export -f run_one
export OUT RUNS MAX_TIME
printf '%s\n' "${TARGETS[@]}" | xargs -P "$PARALLEL" -I{} bash -c 'run_one {}'
