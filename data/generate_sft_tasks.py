#!/usr/bin/env python3
"""Generate Anvil's bundled synthetic instruction-tuning dataset.

Writes <out-dir>/sft_train.jsonl and <out-dir>/sft_eval.jsonl, one JSON object
per line: {"prompt": "...", "response": "..."}. Four tasks, mixed uniformly:

  reverse: "reverse: abcde\n" -> "edcba"   (lowercase letters, length 3..7)
  upper:   "upper: abcde\n"   -> "ABCDE"   (lowercase letters, length 3..7)
  add:     "add: 37+45\n"     -> "82"      (operands 0..99)
  sort:    "sort: dbca\n"     -> "abcd"    (distinct lowercase letters, length 3..6)

Also writes <out-dir>/sft_add_train.jsonl: --add-train-size extra "add"
examples from a stream of their own (seed + 1), so the quickstart can mix in
more of the one task a small model learns slowly without changing the two
files above.

Deterministic for a given --seed. Eval prompts are unique, and no eval prompt
appears in train. Standard library only.
"""
import argparse
import json
import os
import random
import string

LETTERS = string.ascii_lowercase


def _word(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))


def task_reverse(rng):
    w = _word(rng, 3, 7)
    return f"reverse: {w}\n", w[::-1]


def task_upper(rng):
    w = _word(rng, 3, 7)
    return f"upper: {w}\n", w.upper()


def task_add(rng):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"add: {a}+{b}\n", str(a + b)


def task_sort(rng):
    w = "".join(rng.sample(LETTERS, rng.randint(3, 6)))
    return f"sort: {w}\n", "".join(sorted(w))


TASKS = (task_reverse, task_upper, task_add, task_sort)


def sample(rng: random.Random):
    return rng.choice(TASKS)(rng)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for prompt, response in rows:
            f.write(json.dumps({"prompt": prompt, "response": response},
                               ensure_ascii=False) + "\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-size", type=int, default=20000)
    ap.add_argument("--eval-size", type=int, default=400)
    ap.add_argument("--add-train-size", type=int, default=20000)
    ap.add_argument("--out-dir", default=here)
    args = ap.parse_args()

    rng = random.Random(args.seed)

    # Eval first: unique prompts.
    eval_rows, eval_prompts = [], set()
    while len(eval_rows) < args.eval_size:
        p, r = sample(rng)
        if p in eval_prompts:
            continue
        eval_prompts.add(p)
        eval_rows.append((p, r))

    # Train: anything whose prompt is not an eval prompt (train may repeat
    # itself, e.g. the small "add" space, which is fine).
    train_rows = []
    while len(train_rows) < args.train_size:
        p, r = sample(rng)
        if p in eval_prompts:
            continue
        train_rows.append((p, r))

    assert not (eval_prompts & {p for p, _ in train_rows}), "eval/train prompt overlap"
    for p, r in eval_rows + train_rows:
        assert p.endswith("\n") and r == r.strip() and r

    add_rng = random.Random(args.seed + 1)
    add_rows = []
    while len(add_rows) < args.add_train_size:
        p, r = task_add(add_rng)
        if p not in eval_prompts:
            add_rows.append((p, r))

    os.makedirs(args.out_dir, exist_ok=True)
    train_path = os.path.join(args.out_dir, "sft_train.jsonl")
    eval_path = os.path.join(args.out_dir, "sft_eval.jsonl")
    write_jsonl(train_path, train_rows)
    write_jsonl(eval_path, eval_rows)
    add_path = os.path.join(args.out_dir, "sft_add_train.jsonl")
    write_jsonl(add_path, add_rows)
    print(f"wrote {len(train_rows)} rows to {train_path}")
    print(f"wrote {len(eval_rows)} rows to {eval_path}")
    print(f"wrote {len(add_rows)} rows to {add_path}")


if __name__ == "__main__":
    main()
