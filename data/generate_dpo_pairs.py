#!/usr/bin/env python3
"""On-policy DPO pairs for the quickstart tasks.

chosen = the correct answer; rejected = the quickstart SFT model's own wrong
answer: its greedy answer when that is wrong, else the first wrong answer among
a few samples at temperature 1, else (the model is sure and right) a
model-like corruption of the correct answer (one foreign letter, one letter
overwritten by its neighbour, a wrong last digit). DPO on such pairs pushes
down exactly the answers the model would give, which is what moves its greedy
accuracy; off-policy corruptions it would never produce barely do.

Writes <out-dir>/dpo_train.jsonl (--train-pairs fresh prompts, none of them an
SFT eval prompt) and <out-dir>/dpo_eval.jsonl (the 400 SFT eval prompts, in
order). Needs the SFT checkpoint (scripts/quickstart.sh) and build/bin/anvil;
deterministic for a given model, --seed and anvil build.

usage: generate_dpo_pairs.py --model runs/quickstart/checkpoint-1500 [--out-dir data]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sentencepiece as spm  # noqa: E402

from generate_preference_tasks import (SOLVERS, foreign_letter, last_digit,  # noqa: E402
                                       neighbour_copy, parse, read_jsonl, sample, valid, write_jsonl)


def generate(anvil, model, prompts, sp, extra):
    """The model's answers to `prompts` (decoded, EOS stripped)."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = os.path.join(tmp, "ids.json"), os.path.join(tmp, "out.json")
        with open(ids_path, "w") as f:
            json.dump([sp.encode(p) for p in prompts], f)
        subprocess.run([anvil, "generate", "--model", model, "--input", ids_path, "--output", out_path,
                        "--max-new-tokens", "12", "--eos-id", str(sp.eos_id()), "--batch-size", "500"] + extra,
                       check=True)
        with open(out_path) as f:
            outs = json.load(f)
    return [sp.decode([t for t in o if t != sp.eos_id()]) for o in outs]


def fallback(prompt, correct, rng):
    name, arg = parse(prompt)
    fns = (last_digit,) if name == "add" else (foreign_letter, neighbour_copy)
    for _ in range(64):
        t = rng.choice(fns)(correct, arg, rng)
        if t is not None and valid(t) and t != correct:
            return t
    raise AssertionError(prompt)


def pairs_for(prompts, anvil, model, sp, rng, samples, use_fallback=True, negatives=1):
    """One pair per distinct wrong answer of the model, up to `negatives` per prompt: its greedy
    answer first, then samples; a corruption where it made none (unless not use_fallback)."""
    correct = [SOLVERS[parse(p)[0]](parse(p)[1]) for p in prompts]
    wrong = [[] for _ in prompts]
    greedy = generate(anvil, model, prompts, sp, ["--greedy"])
    for i, g in enumerate(greedy):
        if g != correct[i] and valid(g):
            wrong[i].append(g)
    for s in range(samples):
        todo = [i for i, w in enumerate(wrong) if len(w) < negatives]
        if not todo:
            break
        outs = generate(anvil, model, [prompts[i] for i in todo], sp, ["--temperature", "1.0", "--seed", str(s + 1)])
        for i, o in zip(todo, outs):
            if o != correct[i] and valid(o) and o not in wrong[i]:
                wrong[i].append(o)
    kinds = {"greedy": 0, "sampled": 0, "corruption": 0}
    rows = []
    for i, p in enumerate(prompts):
        if not wrong[i] and not use_fallback:
            continue
        if not wrong[i]:
            wrong[i].append(fallback(p, correct[i], rng))
            kinds["corruption"] += 1
        else:
            for w in wrong[i]:
                kinds["greedy" if w == greedy[i] else "sampled"] += 1
        rows.extend({"prompt": p, "chosen": correct[i], "rejected": w} for w in wrong[i])
    return rows, kinds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the quickstart SFT checkpoint folder")
    ap.add_argument("--anvil", default=os.path.join(HERE, "..", "build", "bin", "anvil"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-pairs", type=int, default=8000)
    ap.add_argument("--samples", type=int, default=4, help="sampling rounds looking for wrong answers")
    ap.add_argument("--negatives", type=int, default=1,
                    help="train pairs per prompt: up to this many distinct wrong answers of the model")
    ap.add_argument("--no-fallback", action="store_true",
                    help="train pairs only where the model made a mistake (no corruptions)")
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model, "tokenizer.model"))

    sft_eval = read_jsonl(os.path.join(HERE, "sft_eval.jsonl"))
    eval_prompts = [r["prompt"] for r in sft_eval]
    rng = random.Random(args.seed * 7919 + 17)
    held = set(eval_prompts)
    train_prompts = []
    while len(train_prompts) < args.train_pairs:
        p, _ = sample(rng)
        if p not in held:
            train_prompts.append(p)

    os.makedirs(args.out_dir, exist_ok=True)
    for name, prompts in (("dpo_train.jsonl", train_prompts), ("dpo_eval.jsonl", eval_prompts)):
        rows, kinds = pairs_for(prompts, args.anvil, args.model, sp, rng, args.samples,
                                use_fallback=not (args.no_fallback and name == "dpo_train.jsonl"),
                                negatives=args.negatives if name == "dpo_train.jsonl" else 1)
        path = os.path.join(args.out_dir, name)
        write_jsonl(path, rows)
        print(f"wrote {len(rows)} pairs to {path}; rejected = greedy mistake {kinds['greedy']}, "
              f"sampled mistake {kinds['sampled']}, corruption {kinds['corruption']}")


if __name__ == "__main__":
    main()
