#!/usr/bin/env bash
# Peak memory and speed of the language-model loss, plain (train.fused_loss:
# false) and fused (automatic chunks, and CHUNK rows a chunk), on the CPU: a
# 2-layer GPT-2 with GPT-2's vocabulary (50,257 rows), packed 512-token rows
# of the bundled SFT data, 16 rows a micro-batch, so the plain loss holds
# (16 x 512 x 50257) float32 logits (1.6 GB) and their gradient. Each setting
# runs STEPS steps in a fresh process; reports the process's peak RSS (GNU
# time) and the median tokens/s of metrics.jsonl.
# Usage: bench/loss_memory.sh [STEPS] [CHUNK]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-4}"
CHUNK="${2:-2048}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
cat > "$OUT/run.yaml" <<YAML
model: {family: gpt2, vocab_size: 50257, max_position_embeddings: 512, hidden_size: 256, num_hidden_layers: 2,
        num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], packing: true, max_length: 512}
train: {max_steps: $STEPS, micro_batch_size: 16, log_every: 1, eval_every: 0, save_every: 100000}
logging: {level: warn}
YAML
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
printf '%-22s %14s %14s\n' "loss" "peak RSS (MB)" "tokens/s (median)"
for setting in plain auto "$CHUNK"; do
  case $setting in
    plain) args=(train.fused_loss=false) name="plain" ;;
    auto) args=() name="fused (automatic)" ;;
    *) args=(train.loss_chunk_size="$setting") name="fused, chunk $setting" ;;
  esac
  rm -rf "$OUT/out"
  /usr/bin/time -f "%M" -o "$OUT/rss" build/bin/trainer --config "$OUT/run.yaml" output_dir="$OUT/out" \
    "${args[@]}" > "$OUT/log" 2>&1 || { cat "$OUT/log"; exit 1; }
  tps=$(.venv/bin/python - "$OUT/out/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1])][1:]  # the first step warms up
print(f"{statistics.median(v):.0f}")
PY
)
  printf '%-22s %14d %14s\n' "$name" "$(( $(cat "$OUT/rss") / 1024 ))" "$tps"
done
