#!/usr/bin/env bash
# bench/gpu/run.sh --smoke: the one-command GPU benchmark's own script, run on
# tiny models on the CPU with the binaries of this build, so that a lent GPU
# machine finds it working. Every check must pass and every section must
# produce its rows: Anvil and
# the transformers peers side by side for training, full_shard and
# activation checkpointing, the checkpoint stall of background and
# synchronous saves, generation against transformers.generate, and the
# profile section's two summaries.
# usage: gpu_bench_smoke.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1 SRC=$2
OUTD=$(mktemp -d)
trap 'rm -rf "$OUTD"' EXIT
cd "$SRC"
if ! OUT=$OUTD BUILD=$BUILD PYTHON=$SRC/.venv/bin/python bash bench/gpu/run.sh --smoke --no-build >"$OUTD/log" 2>&1; then
  echo "bench/gpu/run.sh --smoke failed:"; cat "$OUTD/log"; exit 1
fi
T=$OUTD/table.md
fail=0
# The check section's 54 comparisons (on the CPU: bench_kernels' 4 of the loss and 8 of rope, glu
# (silu and GELU-tanh gates) and layer_norm against ATen in double, its chi-square test of the sampler and 2 of packed attention in
# bf16 against float32; bench_mesh's 9 (the mesh's groups of one process, their collectives and ring attention); the other 30
# CPU against CPU, which must pass, trivially but for the two overlapped-step-reads checks, which compare two
# ways of running on the same device).
n=$(grep -c '^PASS ' "$OUTD/checks.txt")
[[ $n == 54 ]] || { echo "expected 54 PASS lines from the checks, got $n"; fail=1; }
m=$(grep -c '^PASS mesh: ' "$OUTD/checks.txt")
[[ $m == 9 ]] || { echo "expected 9 PASS lines from bench_mesh, got $m"; fail=1; }
row() { # a table row matching the regex, with a number in the tokens/s column
  grep -qE "^\| $1 \| [0-9][0-9,]* \|" "$T" || { echo "no row matching: $1"; fail=1; }
}
row "gpt2-debug, 2 x 64, bf16 \| anvil \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| transformers-eager \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-read-each-step \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-unverified-cuda \(n=1\)"
row "llama-debug, 2 x 64, bf16 \| anvil-unverified-cuda \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-cuda-graphs \(n=1\)"
row "llama-debug, 2 x 64, bf16 \| anvil \(n=1\)"
row "llama-debug, 2 x 64, bf16 \| transformers-eager \(n=1\)"
row "qwen3_moe-debug, 2 x 64, bf16 \| anvil \(n=1\)"
row "qwen3_moe-debug, 2 x 64, bf16 \| transformers-eager \(n=1\)"
row "gpt2-debug, 2 x 64, tf32 \| anvil \(n=1\)"
row "gpt2-debug, 2 x 64, tf32 \| transformers-eager \(n=1\)"
row "gpt2-debug, 2 x 64, tf32 \| anvil-cuda-graphs \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-full_shard \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-full_shard-ckpt \(n=1\)"
row "gpt2-debug, 2 x 64, bf16 \| anvil-ckpt \(n=1\)"
row "gpt2, 4, 8 \+ 8, greedy, float32 \| anvil \(n=1\)"
row "gpt2, 4, 8 \+ 8, greedy, float32 \| transformers-default \(n=1\)"
row "gpt2, 4, 8 \+ 8, sample, float32 \| anvil \(n=1\)"
row "gpt2, 4, 8 \+ 8, sample, float32 \| transformers-default \(n=1\)"
# GRPO-shaped: 2 prompts x 2 samples, 6 new tokens.
row "gpt2, 4, 8 \+ 6, sample, float32 \| anvil \(n=1\)"
row "gpt2, 4, 8 \+ 6, sample, float32 \| transformers-default \(n=1\)"
# A stall for the save at step 4 (that of the final save at step 8 comes after the last line).
grep -qE "^checkpoint stall, anvil-save-background: per save [0-9.]+ s" "$T" || { echo "no background stall line"; fail=1; }
grep -qE "^checkpoint stall, anvil-save-sync: per save [0-9.]+ s" "$T" || { echo "no synchronous stall line"; fail=1; }
# The profile section's two summaries (train.profile_steps and bench/gpu/profile_hf.py), CPU ops ranked.
for who in anvil hf; do
  grep -qE "^top [0-9]+ ops by self CPU time:" "$OUTD/profile-$who.txt" 2>/dev/null ||
    { echo "no profile summary from $who"; fail=1; }
done
grep -q "^profile (anvil): steps 5-7 (3) on cpu" "$OUTD/profile-anvil.txt" 2>/dev/null ||
  { echo "the anvil profile is not of steps 5-7"; fail=1; }
[[ $(grep -c "^profile (anvil): steps 5-7 (3) on cpu" "$OUTD/profile-anvil.txt" 2>/dev/null) == 2 ]] &&
  grep -q "^---- the same, train.overlap_step_reads=false" "$OUTD/profile-anvil.txt" ||
  { echo "no second anvil profile with train.overlap_step_reads=false"; fail=1; }
# $OUT holds the summaries alone (a lent GPU machine returns 8 files of it); runs and logs are in WORK.
n=$(find "$OUTD" -maxdepth 1 -type f ! -name log | wc -l)
((n <= 8)) || { echo "run.sh left $n files in OUT (at most 8):"; ls "$OUTD"; fail=1; }
grep -q '^\[bench/gpu [0-9]* s\] done' "$OUTD/stamps.txt" 2>/dev/null || { echo "no stamps.txt with the sections' times"; fail=1; }
if ((fail)); then echo "--- table"; cat "$T"; echo "--- log"; cat "$OUTD/log"; exit 1; fi
cat "$T"
