#!/usr/bin/env bash
# Runs the CPU benchmarks and prints their JSON lines plus the ratios quoted in
# docs/benchmarks.md. The training-step comparison alternates Anvil and the
# transformers peer (ABAB...) in the same run; each program reports the median
# of its timed steps, and the ratio uses the median over rounds.
# usage: bench/run.sh [rounds=3]   (SECTIONS="train kv data" picks what runs)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${1:-3}"
SECTIONS="${SECTIONS:-train kv data}"
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
scripts/build.sh --target benchmarks >/dev/null
PY=.venv/bin/python
OUT="$(mktemp -d)"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
# Two batch shapes: 8 x 256 tokens (GEMM-bound) and 1 x 128 (overhead-bound).
has train && for shape in "8 256" "1 128"; do
  set -- $shape
  tag="b$1_t$2"
  for r in $(seq "$ROUNDS"); do
    build/bin/bench_train_step --batch "$1" --seq "$2" --steps 12 | tee -a "$OUT/anvil_$tag.jsonl"
    $PY bench/train_step_hf.py --batch "$1" --seq "$2" --steps 12 2>/dev/null | tee -a "$OUT/hf_$tag.jsonl"
  done
  build/bin/bench_train_step --batch "$1" --seq "$2" --steps 12 --fused 0 | tee -a "$OUT/unfused_$tag.jsonl"
done
has kv && for b in 1 8; do build/bin/bench_kv_cache_decode --batch "$b" | tee -a "$OUT/kv.jsonl"; done
if has data; then
  # Tokenizer throughput on one core vs HF tokenizers, alternating, on the
  # multilingual parity corpus and tokenizers trained by HF itself.
  $PY tests/parity/make_tokenizer_references.py "$OUT/tok" >/dev/null
  for t in gpt2 neox llama3; do for r in $(seq "$ROUNDS"); do
    build/bin/bench_tokenize_throughput --tokenizer "$OUT/tok/$t" --corpus "$OUT/tok/corpus.txt" --repeat 7 | tee -a "$OUT/tok_anvil_$t.jsonl"
    $PY bench/tokenize_hf.py --tokenizer "$OUT/tok/$t" --corpus "$OUT/tok/corpus.txt" --repeat 7 | tee -a "$OUT/tok_hf_$t.jsonl"
  done; done
  # Data loader vs trainer consumption on the quickstart.
  build/bin/bench_data_loader | tee -a "$OUT/loader.jsonl"
fi
$PY - "$OUT" <<'PYEOF'
import json, os, statistics, sys
d = sys.argv[1]
med = lambda f: statistics.median(json.loads(l)["tokens_per_s"] for l in open(f"{d}/{f}"))
medk = lambda f, k: statistics.median(json.loads(l)[k] for l in open(f"{d}/{f}"))
for tag in ("b8_t256", "b1_t128"):
    if not os.path.exists(f"{d}/anvil_{tag}.jsonl"):
        continue
    a, h, u = med(f"anvil_{tag}.jsonl"), med(f"hf_{tag}.jsonl"), med(f"unfused_{tag}.jsonl")
    print(f"train step {tag}: tokens/s anvil {a:.0f}, transformers {h:.0f}, ratio {a / h:.2f}x "
          f"(anvil with torch::optim::AdamW: {u:.0f}, {u / h:.2f}x)")
for l in (open(f"{d}/kv.jsonl") if os.path.exists(f"{d}/kv.jsonl") else []):
    k = json.loads(l)
    print(f"KV-cache decode, batch {k['batch']}, {k['new_tokens']} new tokens: {k['speedup']:.1f}x faster than "
          f"recompute ({k['kv_cache_tokens_per_s']:.0f} vs {k['recompute_tokens_per_s']:.0f} tokens/s)")
for t in ("gpt2", "neox", "llama3"):
    if os.path.exists(f"{d}/tok_anvil_{t}.jsonl"):
        a, h = medk(f"tok_anvil_{t}.jsonl", "mb_per_s"), medk(f"tok_hf_{t}.jsonl", "mb_per_s")
        print(f"tokenize {t}: {a:.1f} MB/s vs HF tokenizers {h:.1f} MB/s, ratio {a / h:.1f}x (one thread)")
if os.path.exists(f"{d}/loader.jsonl"):
    k = json.loads(open(f"{d}/loader.jsonl").readline())
    print(f"data loader (quickstart): {k['loader_samples_per_s']:.0f} samples/s unpacked, trainer consumes "
          f"{k['trainer_samples_per_s']:.0f} samples/s: loader {k['loader_over_trainer']:.0f}x faster")
PYEOF
