#!/usr/bin/env bash
# Measures the figures of the learning tests over fixtures and seeds, so that
# their thresholds come from the spread of many runs rather than one machine's
# one run (docs/reliability.md, "Learning tests that hold on any machine").
#
#   scripts/learning_sweep.sh                       # every learning test
#   scripts/learning_sweep.sh 'LoraLearning.*'      # a gtest filter
#
# Each variation is a quickstart fixture trained with its own seed
# (FIXTURE_SEEDS; 1234 is the shipped one) times a seed of the test's own runs
# (TEST_SEEDS; "default" keeps the seed of the test's config). Tests that start
# from no fixture (FIXTURE_FREE) run once per seed of FREE_SEEDS instead. The
# tests run against a copy of the binaries made at the start (a rebuild during
# the sweep cannot change them), JOBS at a time with one thread each; each
# test's record_figure() lines go to OUT/records.jsonl, and OUT/table.md holds
# the table: per figure its threshold, the baseline, the min, median and max
# over the variations, and the margin (the worst variation's distance from the
# threshold). A test whose figure misses its threshold does not stop the sweep.
#
#   FIXTURE_SEEDS="1234 1 2 3"  TEST_SEEDS="default 7"  FREE_SEEDS="default 1 2 3 4 5 6 7"
#   JOBS=2  OUT=build/learning-sweep  NO_BUILD=1 (use build/ as it is)
#   KEEP_SNAPSHOT=1 (reuse OUT/snapshot, the binaries of an earlier call)
#   KEEP_RECORDS=1 (add to OUT/records.jsonl instead of starting it anew: a
#   sweep in parts, with a filter each; FREE_SEEDS= skips the fixture-free tests)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FIXTURE_SEEDS=${FIXTURE_SEEDS-"1234 1 2 3"}
TEST_SEEDS=${TEST_SEEDS-"default 7"}
FREE_SEEDS=${FREE_SEEDS-"default 1 2 3 4 5 6 7"}
JOBS=${JOBS:-2}
OUT=${OUT:-build/learning-sweep}
FIXTURE_FREE=${FIXTURE_FREE:-"GalacticaTiny.LearnsAndResumesBitExactlyAfterSigkill"}
DEFAULT_FILTER="PreferenceLearning.*:PpoLearning.*:PpoRuns.SeparateCriticLearnsResumesAndShards"
DEFAULT_FILTER+=":IlqlRuns.ShapedSamplingBeatsTheDataAndBetaZeroAndResumesExactly:LoraLearning.*"
DEFAULT_FILTER+=":LoraRuns.DpoReferenceIsThePolicyWithAdaptersOff:ChatFormatOnQuickstart.*"
FILTER=${1:-$DEFAULT_FILTER}

if [ -z "${NO_BUILD:-}" ]; then
  bash scripts/setup.sh
  bash scripts/build.sh
fi
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)

# The binaries, copied: build/ keeps changing while an hour of runs goes on.
snap="$OUT/snapshot"
if [ -z "${KEEP_SNAPSHOT:-}" ] || [ ! -x "$snap/bin/anvil_tests" ]; then
  rm -rf "$snap"
  mkdir -p "$snap"
  cp -a build/bin build/lib "$snap/"
  true  # anvil_tests is in build/bin
fi
export LD_LIBRARY_PATH="$snap/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ANVIL_TRAINER_BIN="$snap/bin/trainer" ANVIL_CLI_BIN="$snap/bin/anvil"
export ANVIL_LEARNING_RECORD="$OUT/records.jsonl" OUT snap
[ -n "${KEEP_RECORDS:-}" ] || : >"$ANVIL_LEARNING_RECORD"
key=$(cat "$snap/bin/trainer" "$snap"/lib/libanvil.so* configs/quickstart.yaml data/sft_train.jsonl \
  data/sft_add_train.jsonl data/sft_eval.jsonl | sha256sum | cut -c1-16)

# 1. The fixtures: the quickstart once per seed (cached by binaries and data).
fixture() {
  local seed=$1 dir="$OUT/fixture-$1"
  [ -n "$seed" ] || return 0
  if [ "$(cat "$dir.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$dir" "$dir.key"
    "$ANVIL_TRAINER_BIN" --config configs/quickstart.yaml output_dir="$dir" train.seed="$seed" train.threads=1 \
      logging.level=warn >"$OUT/logs/fixture-$seed.log" 2>&1 || { echo "fixture $seed failed: $OUT/logs/fixture-$seed.log"; return 1; }
    echo "$key" >"$dir.key"
  fi
  [ -n "${KEEP_RECORDS:-}" ] && grep -q "\"fixture\": \"$dir\"" "$ANVIL_LEARNING_RECORD" && return 0
  .venv/bin/python - "$dir" "$seed" <<'PY' >>"$ANVIL_LEARNING_RECORD"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()][-1]
print(json.dumps({"test": "QuickstartLearning.QuickstartReachesHeldOutAccuracy", "figure": "held-out exact match",
                  "value": last["eval/exact_match"], "baseline": 0.0, "threshold": 0.85,
                  "fixture": sys.argv[1], "seed": sys.argv[2]}))
PY
  echo "fixture seed $seed: $(tail -n 1 "$ANVIL_LEARNING_RECORD")"
}
export -f fixture
export key
printf '%s\n' $FIXTURE_SEEDS | xargs -r -P "$JOBS" -I{} bash -c 'fixture "$@"' _ {}

# 2. The tests: every fixture with every test seed; fixture-free tests per seed.
variation() {
  local fseed=$1 tseed=$2 filter=$3 log
  log="$OUT/logs/tests-f$fseed-t$tseed.log"
  [ "$fseed" = none ] && log="$OUT/logs/free-t$tseed.log"
  local env=(ANVIL_TEST_SEED=)
  [ "$tseed" != default ] && env=(ANVIL_TEST_SEED="$tseed")
  [ "$fseed" != none ] && env+=(ANVIL_FIXTURE_CHECKPOINT="$OUT/fixture-$fseed/checkpoint-1000")
  local start=$SECONDS rc=0
  env "${env[@]}" "$snap/bin/anvil_tests" --gtest_filter="$filter" >"$log" 2>&1 || rc=$?
  echo "fixture $fseed, test seed $tseed: exit $rc, $((SECONDS - start)) s ($log)"
}
export -f variation
{
  for f in $FIXTURE_SEEDS; do for t in $TEST_SEEDS; do echo "$f $t $FILTER"; done; done
  for t in $FREE_SEEDS; do echo "none $t $FIXTURE_FREE"; done
} | xargs -r -P "$JOBS" -L 1 bash -c 'variation "$@"' _

# 3. The table.
.venv/bin/python - "$ANVIL_LEARNING_RECORD" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["test"], r["figure"]), []).append(r)
print("| test | figure | threshold | baseline | min | median | max | runs | margin |")
print("|---|---|---|---|---|---|---|---|---|")
for (test, figure), rs in sorted(rows.items()):
    v = [r["value"] for r in rs]
    thr = rs[0]["threshold"]
    below = rs[0].get("at_most", False)  # held below the threshold (a loss, an untrained score)
    margin = thr - max(v) if below else min(v) - thr
    print(f"| {test} | {figure} | {'<' if below else '>='} {thr:g} | {statistics.median(r['baseline'] for r in rs):.3f} "
          f"| {min(v):.3f} | {statistics.median(v):.3f} | {max(v):.3f} | {len(v)} | {margin:+.3f} |")
PY
