#!/usr/bin/env bash
# Trains the quickstart once per seed and prints each run's held-out exact
# match: the figures README quotes. Extra arguments are config overrides.
#   SEEDS="1234 1 2 3 4" (default)   JOBS=2: two runs at a time, one thread each
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/build.sh --target trainer
SEEDS=${SEEDS:-"1234 1 2 3 4"}
JOBS=${JOBS:-1}
threads=0
[ "$JOBS" -gt 1 ] && threads=1
export threads
run_seed() {
  local seed=$1; shift
  local out="runs/quickstart-seed$seed" start
  rm -rf "$out"
  start=$(date +%s)
  build/bin/trainer --config configs/quickstart.yaml train.seed="$seed" output_dir="$out" \
    train.threads="$threads" logging.level=warn "$@" >"$out.log" 2>&1 || { echo "seed $seed: failed, see $out.log"; return 1; }
  .venv/bin/python - "$out/metrics.jsonl" "$seed" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
print(f"seed {sys.argv[2]}: step {last['step']}, held-out exact match {last['eval/exact_match']:.4f}, "
      f"eval loss {last['eval/loss']:.4f}, {sys.argv[3]} s")
PY
}
export -f run_seed
printf '%s\n' $SEEDS | xargs -P "$JOBS" -I{} bash -c 'run_seed "$@"' _ {} "$@"
