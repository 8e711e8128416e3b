#!/usr/bin/env bash
# Runs the CPU benchmarks and prints their JSON lines plus the ratios quoted in
# docs/benchmarks.md. The training-step comparison alternates Anvil and the
# transformers peer (ABAB...) in the same run; each program reports the median
# of its timed steps, and the ratio uses the median over rounds.
# usage: bench/run.sh [--smoke] [--no-build] [rounds=3]
#   SECTIONS="train kv data" picks what runs; BUILD=build names the build folder.
#   --smoke: one round of every section on tiny shapes (seconds, not minutes),
#   for the suite's BenchSmoke test: every program must still build, run and
#   print its line; its figures mean nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SMOKE=0 BUILD_STEP=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --smoke) SMOKE=1 ;;
    --no-build) BUILD_STEP=0 ;;
    *) echo "bench/run.sh: unknown option $1 (usage: bench/run.sh [--smoke] [--no-build] [rounds])" >&2; exit 2 ;;
  esac
  shift
done
ROUNDS="${1:-3}"
SECTIONS="${SECTIONS:-train kv data}"
BUILD="${BUILD:-build}"
BIN="$BUILD/bin"
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
if [[ $BUILD_STEP == 1 ]]; then
  log="$(mktemp)"
  if ! BUILD_DIR="$BUILD" scripts/build.sh --target benchmarks >"$log" 2>&1; then
    echo "bench/run.sh: building the benchmarks failed:" >&2
    tail -n 60 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
fi
# Shapes: the figures' own, or tiny ones for --smoke.
if [[ $SMOKE == 1 ]]; then
  ROUNDS=1
  TRAIN_SHAPES=("2 16") STEPS=2 KV_ARGS=(--prompt 8 --new 8 --repeats 1) TOK_REPEAT=1
  LOADER_ARGS=(--loader_batches 3 --train_steps 2)
else
  TRAIN_SHAPES=("8 256" "1 128") STEPS=12 KV_ARGS=() TOK_REPEAT=7 LOADER_ARGS=()
fi
PY="${PYTHON:-.venv/bin/python}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
# Two batch shapes: 8 x 256 tokens (GEMM-bound) and 1 x 128 (overhead-bound).
has train && for shape in "${TRAIN_SHAPES[@]}"; do
  set -- $shape
  tag="b$1_t$2"
  for r in $(seq "$ROUNDS"); do
    "$BIN/bench_train_step" --batch "$1" --seq "$2" --steps "$STEPS" | tee -a "$OUT/anvil_$tag.jsonl"
    $PY bench/train_step_hf.py --batch "$1" --seq "$2" --steps "$STEPS" | tee -a "$OUT/hf_$tag.jsonl"
  done
  "$BIN/bench_train_step" --batch "$1" --seq "$2" --steps "$STEPS" --fused 0 | tee -a "$OUT/unfused_$tag.jsonl"
  # optimizer.state_dtype: bfloat16 against float32 moments (the anvil lines above): median_optimizer_step_s.
  "$BIN/bench_train_step" --batch "$1" --seq "$2" --steps "$STEPS" --state-dtype bfloat16 | tee -a "$OUT/bf16_state_$tag.jsonl"
done
has kv && for b in 1 8; do "$BIN/bench_kv_cache_decode" --batch "$b" "${KV_ARGS[@]}" | tee -a "$OUT/kv.jsonl"; done
if has data; then
  # Tokenizer throughput on one core vs HF tokenizers, alternating, on the
  # multilingual parity corpus and tokenizers trained by HF itself.
  $PY tests/parity/make_tokenizer_references.py "$OUT/tok" >/dev/null
  for t in gpt2 neox llama3; do for r in $(seq "$ROUNDS"); do
    "$BIN/bench_tokenize_throughput" --tokenizer "$OUT/tok/$t" --corpus "$OUT/tok/corpus.txt" --repeat "$TOK_REPEAT" | tee -a "$OUT/tok_anvil_$t.jsonl"
    $PY bench/tokenize_hf.py --tokenizer "$OUT/tok/$t" --corpus "$OUT/tok/corpus.txt" --repeat "$TOK_REPEAT" | tee -a "$OUT/tok_hf_$t.jsonl"
  done; done
  # Data loader vs trainer consumption on the quickstart.
  "$BIN/bench_data_loader" "${LOADER_ARGS[@]}" | tee -a "$OUT/loader.jsonl"
fi
$PY - "$OUT" <<'PYEOF'
import glob, json, os, statistics, sys
d = sys.argv[1]
med = lambda f: statistics.median(json.loads(l)["tokens_per_s"] for l in open(f"{d}/{f}"))
medk = lambda f, k: statistics.median(json.loads(l)[k] for l in open(f"{d}/{f}"))
for tag in sorted((os.path.basename(f)[6:-6] for f in glob.glob(f"{d}/anvil_*.jsonl")), reverse=True):
    a, h, u = med(f"anvil_{tag}.jsonl"), med(f"hf_{tag}.jsonl"), med(f"unfused_{tag}.jsonl")
    print(f"train step {tag}: tokens/s anvil {a:.0f}, transformers {h:.0f}, ratio {a / h:.2f}x "
          f"(anvil with torch::optim::AdamW: {u:.0f}, {u / h:.2f}x)")
    o32, o16 = medk(f"anvil_{tag}.jsonl", "median_optimizer_step_s"), medk(f"bf16_state_{tag}.jsonl", "median_optimizer_step_s")
    b = med(f"bf16_state_{tag}.jsonl")
    print(f"  optimizer.state_dtype bfloat16: AdamW step {o16 * 1e3:.1f} ms vs {o32 * 1e3:.1f} ms with float32 moments "
          f"({o16 / o32:.1f}x), tokens/s {b:.0f} ({b / a:.2f}x)")
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
