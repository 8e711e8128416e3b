#!/usr/bin/env bash
# bench/run.sh --smoke: the CPU benchmarks that docs/benchmarks.md quotes, each
# program run once on a tiny shape with this build's binaries, so that a
# benchmark that no longer builds (the suite builds the `benchmarks` target)
# or no longer prints its line fails the suite, not the next person who wants
# a figure. Checks every JSON line and every summary line of every section.
# usage: cpu_bench_smoke.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1 SRC=$2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cd "$SRC"
if ! BUILD=$BUILD PYTHON=$SRC/.venv/bin/python bash bench/run.sh --smoke --no-build >"$LOG" 2>&1; then
  echo "bench/run.sh --smoke failed:"; cat "$LOG"; exit 1
fi
# Every JSON line by what it must hold, and every summary line of bench/run.sh.
"$SRC/.venv/bin/python" - "$LOG" <<'PYEOF' || { echo "--- bench/run.sh --smoke printed:"; cat "$LOG"; exit 1; }
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
rows = []
for l in lines:
    if l.startswith("{"):
        rows.append(json.loads(l))
def n(**want):
    return sum(all((r.get(k) == v if not callable(v) else k in r and v(r[k])) for k, v in want.items()) for r in rows)
pos = lambda x: isinstance(x, (int, float)) and x > 0
expect = {
    "train step, anvil": (n(impl="anvil", state_dtype="float32", tokens_per_s=pos, final_loss=pos, batch=2, seq=16), 1),
    "train step, bfloat16 AdamW state": (n(impl="anvil", state_dtype="bfloat16", median_optimizer_step_s=pos), 1),
    "train step, torch::optim::AdamW": (n(impl="anvil (torch::optim::AdamW)", tokens_per_s=pos), 1),
    "train step, transformers": (n(impl="transformers", tokens_per_s=pos, batch=2, seq=16), 1),
    "KV-cache decode (batch 1 and 8)": (n(speedup=pos, same_tokens=True), 2),
    "tokenize, anvil (3 tokenizers)": (n(impl="anvil", mb_per_s=pos), 3),
    "tokenize, HF tokenizers (3 tokenizers)": (sum(1 for r in rows if "mb_per_s" in r and r.get("impl") != "anvil"), 3),
    "data loader": (n(loader_samples_per_s=pos, trainer_samples_per_s=pos, loader_over_trainer=pos), 1),
}
summary = [r"^train step b2_t16: tokens/s anvil \d+, transformers \d+, ratio [\d.]+x",
           r"^  optimizer.state_dtype bfloat16: AdamW step [\d.]+ ms vs [\d.]+ ms with float32 moments",
           r"^KV-cache decode, batch 1, 8 new tokens: [\d.]+x faster", r"^KV-cache decode, batch 8, 8 new tokens",
           r"^tokenize gpt2: ", r"^tokenize neox: ", r"^tokenize llama3: ",
           r"^data loader \(quickstart\): \d+ samples/s unpacked, trainer consumes \d+ samples/s"]
bad = [f"{what}: {got} line(s), expected {n_}" for what, (got, n_) in expect.items() if got != n_]
bad += [f"no summary line matching {p}" for p in summary if not any(re.match(p, l) for l in lines)]
print("\n".join(bad) if bad else "bench/run.sh --smoke: every section printed its lines")
sys.exit(1 if bad else 0)
PYEOF
