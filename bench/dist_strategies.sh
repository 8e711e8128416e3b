#!/usr/bin/env bash
# Sharding strategies on CPU ranks (OpenMPI), against one plain process on
# the same global batch, all measured in this run: per-step loss agreement,
# per-rank bytes of parameters + gradients + optimizer state (counted from
# tensor storages by the trainer) and median tokens/s. Needs build/ (scripts/build.sh).
# Usage: bench/dist_strategies.sh [steps]   (writes under runs/bench-dist/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${1:-40}"
OUT=runs/bench-dist
rm -rf "$OUT" && mkdir -p "$OUT"
cat > "$OUT/run.yaml" <<YAML
model: {family: gpt2, max_position_embeddings: 64, hidden_size: 128, num_hidden_layers: 4, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}]}
optimizer: {lr: 1.0e-3}
train: {max_steps: $STEPS, micro_batch_size: 8, global_batch_size: 48, save_every: 0, log_every: 1000, threads: 1}
eval: {generate_samples: 0}
YAML
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
run() {  # name, ranks (0 = plain), extra overrides...
  local name=$1 ranks=$2; shift 2
  local launch=""; [ "$ranks" -gt 0 ] && launch="$MPI -np $ranks"
  $launch build/bin/trainer --config "$OUT/run.yaml" output_dir="$OUT/$name" train.save_every=0 "$@" > "$OUT/$name.log" 2>&1
}
run plain 0
for n in 2 3; do
  for s in no_shard shard_grad_op full_shard; do run "$s-$n" "$n" dist.sharding=$s; done
done
run full_shard-2-ac 2 dist.sharding=full_shard train.activation_checkpointing=true
run full_shard-2-bf16 2 dist.sharding=full_shard dist.param_dtype=bfloat16
.venv/bin/python - "$OUT" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl"))]
base = load("plain")
def state(m): return m["memory/parameter_bytes"] + m["memory/gradient_bytes"] + m["memory/optimizer_bytes"]
print("| run | ranks | max rel. loss diff vs 1 process | state bytes per rank (rel. to 1 process) | median tokens/s (x 1 process) |")
print("|---|---|---|---|---|")
bt = statistics.median(m["tokens_per_s"] for m in base[1:])
print(f"| plain | 1 | - | {state(base[-1]):,.0f} (1.000) | {bt:,.0f} (1.00) |")
for name in sorted(os.listdir(out)):
    if name == "plain" or not os.path.isdir(os.path.join(out, name)): continue
    ms = load(name)
    diff = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(base, ms))
    t = statistics.median(m["tokens_per_s"] for m in ms[1:])
    ranks = name.split("-")[1]
    print(f"| {name} | {ranks} | {diff:.1e} | {state(ms[-1]):,.0f} ({state(ms[-1]) / state(base[-1]):.3f}) | {t:,.0f} ({t / bt:.2f}) |")
PY
