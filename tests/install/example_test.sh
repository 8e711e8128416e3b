#!/usr/bin/env bash
# examples/custom_objective as a C++ team builds it: against the installed
# package (find_package(anvil)), then trained from its YAML file, resumed,
# and checked for its own section, metric and error messages.
set -euo pipefail
BUILD_DIR="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TMP="$(realpath "$(mktemp -d -p "$BUILD_DIR" install-test.XXXXXX)")"
trap 'rm -rf "$TMP"' EXIT
source "$ROOT/tests/install/ccache_env.sh"
cmake --install "$BUILD_DIR" --prefix "$TMP/prefix" >/dev/null
TORCH_PREFIX="$("$ROOT/.venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
cmake -S "$ROOT/examples/custom_objective" -B "$TMP/build" -G Ninja "${CCACHE_LAUNCHER[@]}" \
  -DCMAKE_PREFIX_PATH="$TMP/prefix;$TORCH_PREFIX" >/dev/null
cmake --build "$TMP/build" >/dev/null
bin="$TMP/build/weighted_trainer"
cd "$ROOT"
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --help | grep -qE "sft, pretrain, reward, dpo, ppo, ilql, .*weighted_sft" || fail "--help does not list weighted_sft"
"$bin" --print-config-reference | grep -q '`weighted_sft.digit_weight`' || fail "reference lacks the section"
# Its section's keys are checked like built-in ones.
if out="$("$bin" --config examples/custom_objective/weighted_sft.yaml weighted_sft.digit_weight=-1 2>&1)"; then
  fail "a negative digit_weight was accepted"
fi
grep -q "weighted_sft.digit_weight: expected a positive number, got \"-1\"" <<<"$out" || fail "message: $out"
out="$("$bin" --config examples/custom_objective/weighted_sft.yaml weighted_sft.digit_wieght=1 2>&1)" && fail "typo accepted"
grep -q "weighted_sft.digit_wieght: unknown key; did you mean weighted_sft.digit_weight?" <<<"$out" || fail "message: $out"
# It lists the keys it reads: sft's own loss keys are refused, not ignored.
out="$("$bin" --config examples/custom_objective/weighted_sft.yaml train.loss_chunk_size=64 2>&1)" && fail "unread key accepted"
grep -q "train.loss_chunk_size: not read by algorithm weighted_sft (read by sft, pretrain); remove it" <<<"$out" ||
  fail "message: $out"

# Train 10 steps, then resume to 20 from the checkpoint.
common=(--config examples/custom_objective/weighted_sft.yaml output_dir="$TMP/run" train.save_every=10
        train.eval_every=20 eval.generate_samples=8 train.threads=1 logging.level=info)
"$bin" "${common[@]}" train.max_steps=10 >"$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; fail "first run"; }
"$bin" "${common[@]}" train.max_steps=20 >"$TMP/b.log" 2>&1 || { cat "$TMP/b.log"; fail "resumed run"; }
grep -q "resumed from $TMP/run/checkpoint-10 at step 10" "$TMP/b.log" || { cat "$TMP/b.log"; fail "no resume"; }
"$ROOT/.venv/bin/python" - "$TMP/run" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert [l["step"] for l in lines] == list(range(1, 21)), [l["step"] for l in lines]
assert all("loss/digits" in l for l in lines), lines[0]
assert "eval/exact_match" in lines[-1], lines[-1]
cfg = open(sys.argv[1] + "/config.yaml").read()
assert "weighted_sft:\n  digit_weight: 3" in cfg, cfg
print(f"example: 20 steps, loss {lines[0]['loss']:.3f} -> {lines[-1]['loss']:.3f}, "
      f"loss/digits {lines[0]['loss/digits']:.3f} -> {lines[-1]['loss/digits']:.3f}")
PY
