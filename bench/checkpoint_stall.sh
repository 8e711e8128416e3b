#!/usr/bin/env bash
# Checkpoint stall: how long a save blocks the step loop, written at once
# (ANVIL_CHECKPOINT_SYNC=1, the behaviour before background saves) and in the
# background (the default), on GPT-2 small (configs/models/gpt2-124m.yaml:
# 124.4 M parameters, so 1.49 GB of float32 weights and AdamW moments per
# checkpoint) on the CPU. Every step saves; the stall is time/checkpoint_stall_s
# of metrics.jsonl (the save call, plus any wait of the next optimizer step
# for the background copy). A third run saves only at its end, for the steps'
# own time. Runs alternate (sync, background, none) for `rounds` rounds.
# With RANKS=N (N > 1) every run is N OpenMPI ranks under dist.sharding:
# full_shard, each rank with 1 thread and 2 micro-batches a step (sharded
# checkpoints: shard files plus the consolidated model, 2 GB a save).
# Needs build/ (scripts/build.sh) and about 5 GB free under runs/.
# EXTRA="key=value ..." adds trainer overrides to every run.
# Usage: [RANKS=2] [EXTRA=...] bench/checkpoint_stall.sh [steps=6] [rounds=2]   (writes under runs/bench-ckpt/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${1:-6}"
ROUNDS="${2:-2}"
OUT=runs/bench-ckpt
rm -rf "$OUT" && mkdir -p "$OUT"
cat > "$OUT/run.yaml" <<YAML
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}]}
optimizer: {lr: 1.0e-4}
train: {max_steps: $STEPS, micro_batch_size: 4, save_every: 1, keep_checkpoints: 1, log_every: 1, threads: $(nproc)}
eval: {generate_samples: 0}
YAML
RANKS="${RANKS:-1}"
LAUNCH=() DIST=()
if [ "$RANKS" -gt 1 ]; then
  LAUNCH=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x ANVIL_CHECKPOINT_SYNC -np "$RANKS")
  DIST=(dist.sharding=full_shard train.threads=1 train.grad_accum_steps=$((2 * RANKS)))
fi
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
DIST+=("${EXTRA_ARGS[@]}")
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $STEPS steps x $ROUNDS rounds, $RANKS rank(s) ${EXTRA:-}"
run() {  # name, env, overrides...
  local name=$1 env=$2; shift 2
  local t0; t0=$(date +%s.%N)
  env $env "${LAUNCH[@]}" build/bin/trainer --config "$OUT/run.yaml" --config configs/models/gpt2-124m.yaml \
    output_dir="$OUT/$name" "${DIST[@]}" "$@" > "$OUT/$name.log" 2>&1
  awk "BEGIN { print $(date +%s.%N) - $t0 }" > "$OUT/$name.wall"
  rm -rf "$OUT/$name"/checkpoint-*  # keep the disk free; metrics.jsonl and the log stay
}
for r in $(seq "$ROUNDS"); do
  run "sync-$r" ANVIL_CHECKPOINT_SYNC=1
  run "background-$r" ANVIL_CHECKPOINT_SYNC=0
  run "none-$r" ANVIL_CHECKPOINT_SYNC=0 train.save_every=0
done
.venv/bin/python - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def lines(name):
    return [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl"))]
def wall_s(name):  # the whole process: start-up, steps, saves, the wait for the last write
    return float(open(os.path.join(out, name + ".wall")).read())
def collect(kind):
    runs = [f"{kind}-{r}" for r in range(1, rounds + 1)]
    ms = [m for n in runs for m in lines(n)]
    stall = [m["time/checkpoint_stall_s"] for m in ms if "time/checkpoint_stall_s" in m]
    write = [m["time/checkpoint_write_s"] for m in ms if "time/checkpoint_write_s" in m]
    return stall, write, statistics.median(wall_s(n) for n in runs)
sync, _, sync_wall = collect("sync")
bg, bg_write, bg_wall = collect("background")
_, _, none_wall = collect("none")
med = statistics.median
print("| saves | stalls measured | stall per save: median (min - max) | background write: median | process wall time (median) |")
print("|---|---|---|---|---|")
print(f"| at once (ANVIL_CHECKPOINT_SYNC=1) | {len(sync)} | {med(sync):.2f} s ({min(sync):.2f} - {max(sync):.2f}) | - | {sync_wall:.1f} s |")
print(f"| background (default) | {len(bg)} | {med(bg):.3f} s ({min(bg):.3f} - {max(bg):.3f}) | {med(bg_write):.2f} s | {bg_wall:.1f} s |")
print(f"| none (one save at the end) | - | - | - | {none_wall:.1f} s |")
print(f"background stall / stall at once: {med(bg) / med(sync):.1%} (median), {max(bg) / med(sync):.1%} (worst)")
PY
