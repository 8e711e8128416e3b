"""Writes data/ilql_train.jsonl and data/ilql_eval.jsonl: offline RL data for
configs/ilql_tiny.yaml and the ILQL tests.

ilql_train.jsonl: the `upper` prompts of data/sft_train.jsonl (the first 1,500
distinct ones), each with one logged response: with probability 1/3 the right
answer (reward 1), otherwise the answer in lower case (reward 0). Right answers
are the minority, so imitating the data (AWAC, or beta = 0) answers right about
a third of the time; advantage-shaped sampling should do better.

ilql_eval.jsonl: the `upper` prompts of data/sft_eval.jsonl as prompts records
whose "response" field is the right answer (ilql.reward.exact_match: response).

Standard library only; the output depends only on --seed (default 1234).
Usage (from the repository root): python3 data/generate_ilql_data.py
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--count", type=int, default=1500)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seen, train = set(), []
    with open("data/sft_train.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if not r["prompt"].startswith("upper:") or r["prompt"] in seen:
                continue
            seen.add(r["prompt"])
            right = rng.random() < 1.0 / 3.0
            response = r["response"] if right else r["response"].lower()
            train.append({"prompt": r["prompt"], "response": response, "reward": 1.0 if right else 0.0})
            if len(train) == args.count:
                break
    with open("data/ilql_train.jsonl", "w") as f:
        for r in train:
            f.write(json.dumps(r) + "\n")
    n_eval = 0
    with open("data/sft_eval.jsonl") as f, open("data/ilql_eval.jsonl", "w") as out:
        for line in f:
            r = json.loads(line)
            if r["prompt"].startswith("upper:"):
                out.write(json.dumps({"prompt": r["prompt"], "response": r["response"]}) + "\n")
                n_eval += 1
    mean = sum(r["reward"] for r in train) / len(train)
    print(f"ilql_train.jsonl: {len(train)} records, mean reward {mean:.4f}; ilql_eval.jsonl: {n_eval} prompts")


if __name__ == "__main__":
    main()
