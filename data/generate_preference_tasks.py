#!/usr/bin/env python3
"""Generate Anvil's bundled synthetic preference dataset.

Uses the four tasks of generate_sft_tasks.py (reverse, upper, add, sort). The
preferred reply is the correct response; the others are wrong answers made by
corrupting the correct one (CORRUPTIONS below: a letter or digit dropped or
doubled, a letter left in lower case), mistakes a tiny reward model can learn
to spot. The DPO pairs come from the SFT model's own mistakes instead
(generate_dpo_pairs.py).

A corruption is picked at random; one that gives an empty string or the same
string is retried with another. Writes to <out-dir>:

  pref_train.jsonl         {"prompt", "chosen", "rejected"}
  pref_ranked_train.jsonl  {"prompt", "ranked": [best, ..., worst]}, 3 or 4
                           distinct replies: the correct one, then one, two
                           (and three) corruptions applied in turn, each
                           further from the correct reply than the last
  pref_eval.jsonl          {"prompt", "chosen", "rejected"} for exactly the
                           prompts of sft_eval.jsonl, in the same order

Train prompts are fresh samples from the SFT task distribution, minus every
sft_eval.jsonl prompt. Deterministic for a given --seed. Standard library only.
"""
import argparse
import json
import os
import random
import string
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # keep data/ free of __pycache__

from generate_sft_tasks import TASKS, sample  # noqa: E402

# --- the correct answer, recomputed from a prompt ---------------------------

SOLVERS = {
    "reverse": lambda x: x[::-1],
    "upper": lambda x: x.upper(),
    "add": lambda x: str(sum(int(t) for t in x.split("+"))),
    "sort": lambda x: "".join(sorted(x)),
}
assert sorted(SOLVERS) == sorted(t.__name__[len("task_"):] for t in TASKS)


def parse(prompt):
    """(task name, input) of a task prompt such as "add: 37+45\\n"."""
    assert prompt.endswith("\n"), prompt
    name, _, arg = prompt[:-1].partition(": ")
    assert name in SOLVERS and arg, prompt
    return name, arg


def solve(prompt):
    name, arg = parse(prompt)
    return SOLVERS[name](arg)


# --- corruptions: (text, task input, rng) -> wrong text, or None --------------


def drop_one(s, _arg, rng):
    if len(s) < 2:
        return None
    i = rng.randrange(len(s))
    return s[:i] + s[i + 1:]


def duplicate_one(s, _arg, rng):
    i = rng.randrange(len(s))
    return s[:i] + s[i] + s[i:]


def foreign_letter(s, arg, rng):
    # One letter replaced by a letter that is not in the task's input, the
    # small SFT model's most common mistake ("ribsqcv" -> "rpbsqcv").
    i = rng.randrange(len(s))
    pool = [c for c in string.ascii_lowercase if c not in arg.lower()]
    c = rng.choice(pool)
    return s[:i] + (c.upper() if s[i].isupper() else c) + s[i + 1:]


def neighbour_copy(s, _arg, rng):
    # One letter overwritten by its neighbour ("OBNIV" -> "OBBIV").
    if len(s) < 2:
        return None
    i = rng.randrange(len(s))
    j = i - 1 if i > 0 and (i == len(s) - 1 or rng.random() < 0.5) else i + 1
    return s[:i] + s[j] + s[i + 1:]


def last_digit(s, _arg, rng):
    # The sum's last digit wrong ("161" -> "163"), the SFT model's usual error.
    d = rng.choice([c for c in string.digits if c != s[-1]])
    t = s[:-1] + d
    return t if not (len(t) > 1 and t[0] == "0") else None


def _shift(delta):
    def f(s, _arg, _rng):
        n = int(s) + delta
        return str(n) if n >= 0 else None
    f.__name__ = f"off_by_{delta:+d}"
    return f


def one_lowercase(s, _arg, rng):
    # A letter left in lower case ("ABCDE" -> "ABcDE").
    upper = [i for i, c in enumerate(s) if c.isupper()]
    if not upper:
        return None
    i = rng.choice(upper)
    return s[:i] + s[i].lower() + s[i + 1:]


def digit_dropped(s, arg, rng):
    t = drop_one(s, arg, rng)
    return t if t and not (len(t) > 1 and t[0] == "0") else None


# The reward-model data's mistakes: a letter or digit dropped or doubled, a
# letter left in lower case. A 0.8 M-parameter model learns to spot these in a
# few hundred steps; one wrong letter of the right length (foreign_letter,
# neighbour_copy, last_digit: what the SFT model itself gets wrong, used by
# generate_dpo_pairs.py) stays near chance at that size (docs/algorithms.md).
CORRUPTIONS = {
    "reverse": (drop_one, duplicate_one),
    "upper": (one_lowercase, drop_one, duplicate_one),
    "add": (digit_dropped, duplicate_one),
    "sort": (drop_one, duplicate_one),
}

MAX_TRIES = 64


def valid(t):
    return bool(t) and t == t.strip()


def corrupt(name, arg, s, rng, ok=lambda t: True):
    """A random corruption of s that differs from s and passes ok(), or None."""
    for _ in range(MAX_TRIES):
        t = rng.choice(CORRUPTIONS[name])(s, arg, rng)
        if t is not None and valid(t) and t != s and ok(t):
            return t
    return None


# --- how far a wrong reply is from the correct one ---------------------------


def edit_distance(a, b):
    """Levenshtein distance with adjacent transpositions counted as one edit."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def damage(name, correct, t):
    if name == "add":
        return abs(int(t) - int(correct))
    return edit_distance(correct, t)


# --- rows --------------------------------------------------------------------


def pair_row(prompt, rng):
    name, arg = parse(prompt)
    chosen = SOLVERS[name](arg)
    rejected = corrupt(name, arg, chosen, rng)
    assert rejected is not None, prompt
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def ranked_row(prompt, rng):
    """Correct reply, then 2 or 3 replies each one corruption further along,
    each strictly more damaged than the previous; None if that cannot be met."""
    name, arg = parse(prompt)
    correct = SOLVERS[name](arg)
    want = rng.choice((3, 4))
    for _ in range(MAX_TRIES):
        ranked = [correct]
        while len(ranked) < want:
            last = ranked[-1]
            floor = damage(name, correct, last)
            t = corrupt(name, arg, last, rng,
                        lambda t: t not in ranked and damage(name, correct, t) > floor)
            if t is None:
                break
            ranked.append(t)
        if len(ranked) == want:
            return {"prompt": prompt, "ranked": ranked}
    return None


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-pairs", type=int, default=8000)
    ap.add_argument("--train-ranked", type=int, default=2000)
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()

    # The SFT files are always read from this folder: eval prompts are held out
    # and every character used must be one the bundled tokenizer was trained on.
    sft_eval = read_jsonl(os.path.join(HERE, "sft_eval.jsonl"))
    sft_train = read_jsonl(os.path.join(HERE, "sft_train.jsonl"))
    eval_prompts = {r["prompt"] for r in sft_eval}
    charset = {c for r in sft_train + sft_eval for c in r["prompt"] + r["response"]}

    # Separate streams per file, seeded apart from the SFT generator's
    # random.Random(seed): with the same seed that one would replay the SFT
    # train prompts in order instead of drawing fresh ones.
    pairs_rng = random.Random(f"anvil-pref-pairs-{args.seed}")
    ranked_rng = random.Random(f"anvil-pref-ranked-{args.seed}")
    eval_rng = random.Random(f"anvil-pref-eval-{args.seed}")

    def fresh_prompt(rng):
        while True:
            p, _ = sample(rng)
            if p not in eval_prompts:
                return p

    pairs = [pair_row(fresh_prompt(pairs_rng), pairs_rng) for _ in range(args.train_pairs)]

    ranked = []
    while len(ranked) < args.train_ranked:
        row = ranked_row(fresh_prompt(ranked_rng), ranked_rng)
        if row is not None:
            ranked.append(row)

    evals = []
    for r in sft_eval:
        assert solve(r["prompt"]) == r["response"], r
        evals.append(pair_row(r["prompt"], eval_rng))

    # Checks.
    assert [r["prompt"] for r in evals] == [r["prompt"] for r in sft_eval]
    train_prompts = {r["prompt"] for r in pairs + ranked}
    assert not (train_prompts & eval_prompts), "train/eval prompt overlap"
    for r in pairs + evals:
        assert r["chosen"] == solve(r["prompt"]) and r["rejected"] != r["chosen"]
        assert valid(r["rejected"])
    for r in ranked:
        ans = r["ranked"]
        name, _ = parse(r["prompt"])
        assert len(ans) in (3, 4) and len(set(ans)) == len(ans)
        assert ans[0] == solve(r["prompt"]) and all(valid(a) for a in ans)
        dmg = [damage(name, ans[0], a) for a in ans]
        assert all(x < y for x, y in zip(dmg, dmg[1:])), r
    for r in pairs + evals + ranked:
        assert r["prompt"].endswith("\n")
        text = r["prompt"] + "".join(r.get("ranked", [])) + r.get("chosen", "") + r.get("rejected", "")
        assert set(text) <= charset, r

    os.makedirs(args.out_dir, exist_ok=True)
    for fname, rows in (("pref_train.jsonl", pairs),
                        ("pref_ranked_train.jsonl", ranked),
                        ("pref_eval.jsonl", evals)):
        path = os.path.join(args.out_dir, fname)
        write_jsonl(path, rows)
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
