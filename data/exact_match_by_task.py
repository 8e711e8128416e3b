#!/usr/bin/env python3
"""Greedy held-out exact match of a checkpoint, per task, with Anvil's own
`anvil generate` (the trainer's eval/exact_match, split by task).

usage: .venv/bin/python data/exact_match_by_task.py runs/quickstart/checkpoint-1500 [--eval data/sft_eval.jsonl]
"""
import argparse
import collections
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--eval", default=str(ROOT / "data" / "sft_eval.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    rows = [json.loads(l) for l in open(args.eval, encoding="utf-8") if l.strip()]
    cmd = [str(ROOT / "build" / "bin" / "anvil"), "generate", "--model", args.checkpoint,
           "--max-new-tokens", str(args.max_new_tokens)]
    for r in rows:
        cmd += ["--prompt", r["prompt"].replace("\n", "\\n")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    generated = [json.loads(l)["generated"] for l in out.splitlines() if l.startswith("{")]
    assert len(generated) == len(rows), (len(generated), len(rows))
    total, right = collections.Counter(), collections.Counter()
    for r, g in zip(rows, generated):
        task = r["prompt"].split(":")[0]
        total[task] += 1
        right[task] += g.strip() == r["response"]
    per_task = ", ".join(f"{t} {right[t]}/{total[t]}" for t in sorted(total))
    print(f"{args.checkpoint}: {per_task}; exact match {sum(right.values()) / len(rows):.4f}")


if __name__ == "__main__":
    main()
