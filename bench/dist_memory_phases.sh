#!/usr/bin/env bash
# CPU tensor peaks (and the process's VmHWM) per phase and rank, with and without tensor parallelism: a GPT-2 of
# hidden 256 and 4 blocks (SFT fixture, 4 steps, saves at 2 and 4, then a resume from step 2), on 1 process,
# 2 and 4 full_shard ranks, tp 2 on 2 ranks and tp 2 x full_shard 2 on 4. Reads output_dir/host_memory/rank-N.json
# (core/host_memory.h). Needs build/ (scripts/build.sh) and OpenMPI. Prints the table docs/distributed.md quotes.
# Usage: bench/dist_memory_phases.sh   (writes under runs/bench-dist-memory/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT=runs/bench-dist-memory
rm -rf "$OUT" && mkdir -p "$OUT"
cat > "$OUT/run.yaml" <<YAML
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 256, num_hidden_layers: 4, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}]}
optimizer: {lr: 3.0e-3, weight_decay: 0.01}
schedule: {warmup_steps: 2}
train: {max_steps: 4, micro_batch_size: 2, global_batch_size: 12, save_every: 2, eval_every: 0, keep_checkpoints: 0,
        log_every: 1000, threads: 1, background_saves: false}
eval: {generate_samples: 0}
YAML
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -np"
run() {  # name, ranks (0: one plain process), extra keys
  local out="$OUT/$1" pre=""
  [ "$2" -gt 0 ] && pre="$MPI $2"
  $pre build/bin/trainer --config "$OUT/run.yaml" output_dir="$out" $3 >"$out.log" 2>&1
  mkdir -p "$out-resumed" && cp -r "$out/checkpoint-2" "$out-resumed/"
  $pre build/bin/trainer --config "$OUT/run.yaml" output_dir="$out-resumed" $3 >"$out-resumed.log" 2>&1
}
run "1 process" 0 ""
run "2, full_shard" 2 "dist.sharding=full_shard"
run "4, full_shard" 4 "dist.sharding=full_shard train.micro_batch_size=1"
run "2, tensor_parallel 2" 2 "dist.tensor_parallel=2"
run "4, tensor_parallel 2, full_shard" 4 "dist.tensor_parallel=2 dist.sharding=full_shard train.micro_batch_size=1"
"${PYTHON:-.venv/bin/python}" - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print("| ranks | rank | load | train | save | resume | VmHWM (MB, load/train/save/resume) |")
print("|---|---|---|---|---|---|---|")
for run in ["1 process", "2, full_shard", "4, full_shard", "2, tensor_parallel 2", "4, tensor_parallel 2, full_shard"]:
    for f in sorted(glob.glob(os.path.join(out, run, "host_memory", "rank-*.json"))):
        rank = int(f.rsplit("rank-", 1)[1].split(".")[0])
        a = json.load(open(f))["phases"]
        b = json.load(open(f.replace(os.path.join(out, run), os.path.join(out, run + "-resumed"))))["phases"]
        def mb(d, k, key):
            return "%.1f MB" % (d[k][key] / 1e6) if k in d else "-"
        hwm = "/".join(("%.0f" % (d[k]["peak_bytes"] / 1e6) if k in d else "-")
                       for d, k in [(a, "load"), (a, "train"), (a, "save"), (b, "resume")])
        print(f"| {run} | {rank} | {mb(a, 'load', 'tensor_peak_bytes')} | {mb(a, 'train', 'tensor_peak_bytes')} | "
              f"{mb(a, 'save', 'tensor_peak_bytes')} | {mb(b, 'resume', 'tensor_peak_bytes')} | {hwm} |")
PY
