#!/usr/bin/env bash
# Set up (idempotent), build, and train the quickstart: a small GPT-NeoX learns
# four string/arithmetic tasks on CPU, then reports held-out exact-match
# accuracy. Re-running resumes/finishes the same run in runs/quickstart.
# OUTPUT_DIR moves the run; extra arguments go to the trainer; SKIP_SETUP=1
# skips setup and build (the docs test runs it on a built tree).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${SKIP_SETUP:-0}" != 1 ]; then
  # Only what building and training need; scripts/test.sh adds the rest.
  bash scripts/setup.sh --quickstart
  # On a fresh machine (no build/ yet, an empty ccache) the library compiles
  # in batches (ANVIL_UNITY_BUILD, src/CMakeLists.txt): each batch loads the
  # precompiled LibTorch header once, which halves a cold build. Where ccache
  # holds objects, one per source reuses them. Should a batch not compile
  # (two sources defining one name), build/ goes back to one per source.
  cached=$(ccache --print-stats 2>/dev/null | awk '$1 == "files_in_cache" { print $2 }')
  if [ ! -f build/build.ninja ] && [ "$cached" = 0 ]; then
    CMAKE_ARGS="${CMAKE_ARGS:-} -DANVIL_UNITY_BUILD=ON" bash scripts/build.sh --target trainer anvil_cli || {
      echo "[quickstart] the batched build failed; building one source at a time" >&2
      cmake build -DANVIL_UNITY_BUILD=OFF >/dev/null
      bash scripts/build.sh --target trainer anvil_cli
    }
  else
    bash scripts/build.sh --target trainer anvil_cli
  fi
fi

OUT="${OUTPUT_DIR:-runs/quickstart}"
start=$(date +%s)
build/bin/trainer --config configs/quickstart.yaml output_dir="$OUT" "$@"
echo "[quickstart] training took $(( $(date +%s) - start )) s"

.venv/bin/python - "$OUT/metrics.jsonl" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
acc = last.get("eval/exact_match")
print(f"[quickstart] step {last['step']}: held-out exact-match accuracy {acc:.1%}, eval loss {last['eval/loss']:.4f}")
PY
ckpt=$(ls -d "$OUT"/checkpoint-* | sort -t- -k2 -n | tail -1)
echo "[quickstart] try it: build/bin/anvil generate --model $ckpt --prompt 'reverse: anvil\n' --prompt 'add: 19+23\n'"
build/bin/anvil generate --model "$ckpt" --prompt 'reverse: anvil\n' --prompt 'add: 19+23\n'
