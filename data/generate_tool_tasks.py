#!/usr/bin/env python3
"""Writes the tool-use task files: three-digit additions, which the
quickstart model cannot do in its head, with a calculator to call
(examples/environments/calculator.py, configs/sft_tool_tiny.yaml,
configs/grpo_tool_tiny.yaml).

  tool_add_train.jsonl     {"prompt": "add: 123+456\n", "response": "579"}:
                           the prompts of GRPO, with the right sums
  tool_calls_train.jsonl   the task as a conversation that calls the
                           calculator: user, assistant "123+456", tool "579",
                           assistant "579"
  tool_guess_train.jsonl   the task answered in one's head, and wrongly: the
                           sum with its last digit changed (a model that
                           prefers guessing, for GRPO to cure)
  tool_add_eval.jsonl      held-out prompts (in no train file)

Operands are in 100..499, so every sum has three digits and every episode
fits the quickstart model's 32 positions. Standard library only; the output
depends only on --seed.
"""
import argparse
import json
import os
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-size", type=int, default=3000)
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    seen = set()

    def fresh():
        while True:
            x, y = rng.randint(100, 499), rng.randint(100, 499)
            if (x, y) not in seen:
                seen.add((x, y))
                return x, y

    evals = [fresh() for _ in range(a.eval_size)]
    train = [fresh() for _ in range(a.train_size)]
    calls = [fresh() for _ in range(a.train_size)]
    guesses = [fresh() for _ in range(a.train_size)]

    def wrong(x, y):
        s = x + y
        return s - s % 10 + (s % 10 + rng.randint(1, 9)) % 10

    def write(name, rows):
        with open(os.path.join(a.out_dir, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    write("tool_add_eval.jsonl", [{"prompt": f"add: {x}+{y}\n", "response": str(x + y)} for x, y in evals])
    write("tool_add_train.jsonl", [{"prompt": f"add: {x}+{y}\n", "response": str(x + y)} for x, y in train])
    write("tool_guess_train.jsonl", [{"prompt": f"add: {x}+{y}\n", "response": str(wrong(x, y))} for x, y in guesses])
    write("tool_calls_train.jsonl", [{"messages": [
        {"role": "user", "content": f"add: {x}+{y}\n"},
        {"role": "assistant", "content": f"{x}+{y}"},
        {"role": "tool", "content": str(x + y)},
        {"role": "assistant", "content": str(x + y)}]} for x, y in calls])


if __name__ == "__main__":
    main()
