#!/usr/bin/env python3
"""Where a DPO policy's held-out rewards/accuracies comes from, pair by pair.

For every pair of a preference file, scores chosen and rejected (reply tokens
plus EOS, as Anvil's DPO does) under the policy and the reference with
transformers, and counts the pairs whose implicit reward margin
h = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected) is positive: the
`rewards/accuracies` the trainer logs. Counts are split by quickstart task and
by whether the reference already preferred the chosen reply. --task prints the
pairs of that task that the policy gets wrong. It also prints each model's
greedy exact match per task (the chosen reply is the correct answer).

usage: dpo_pair_report.py --policy runs/dpo_tiny/checkpoint-600 \\
           --reference runs/quickstart/checkpoint-1500 [--pairs data/dpo_eval.jsonl] [--task sort]
"""
import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from generate_preference_tasks import parse, read_jsonl  # noqa: E402


def reply_logps(model_dir, rows, sp):
    """[(logp chosen, logp rejected)] per row, summed over reply tokens and EOS."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            pair = []
            for key in ("chosen", "rejected"):
                prompt = sp.encode(r["prompt"])
                ids = torch.tensor([prompt + sp.encode(r[key]) + [sp.eos_id()]])
                logp = torch.log_softmax(model(ids).logits[0, :-1], -1)
                token_logps = logp.gather(1, ids[0, 1:, None])[:, 0]
                pair.append(token_logps[len(prompt) - 1:].sum().item())
            out.append(pair)
    return out


def greedy_exact_match(model_dir, rows, sp):
    """{task: (right, n)}: greedy answers (12 new tokens at most) equal to the chosen reply."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    counts = collections.defaultdict(lambda: [0, 0])
    with torch.no_grad():
        for r in rows:
            prompt = sp.encode(r["prompt"])
            out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=sp.eos_id(), pad_token_id=sp.eos_id())[0, len(prompt):].tolist()
            answer = sp.decode([t for t in out if t != sp.eos_id()])
            task = counts[parse(r["prompt"])[0]]
            task[0] += answer == r["chosen"]
            task[1] += 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True, help="the DPO checkpoint folder")
    ap.add_argument("--reference", required=True, help="the reference (SFT) checkpoint folder")
    ap.add_argument("--pairs", default=os.path.join(HERE, "dpo_eval.jsonl"))
    ap.add_argument("--task", help="also list this task's pairs with h <= 0")
    args = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.reference, "tokenizer.model"))
    rows = read_jsonl(args.pairs)
    policy, ref = reply_logps(args.policy, rows, sp), reply_logps(args.reference, rows, sp)

    groups = collections.defaultdict(lambda: [0, 0])
    wrong = []
    for r, (pc, pr), (rc, rr) in zip(rows, policy, ref):
        task = parse(r["prompt"])[0]
        h = (pc - pr) - (rc - rr)
        key = (task, "reference prefers chosen" if rc > rr else "reference prefers rejected")
        groups[key][0] += h > 0
        groups[key][1] += 1
        if h <= 0 and task == args.task:
            wrong.append(f"{r['prompt']!r} chosen {r['chosen']} rejected {r['rejected']}: reference "
                         f"{rc:.2f} / {rr:.2f}, policy {pc:.2f} / {pr:.2f}, h {h:.3f}")
    right = sum(g[0] for g in groups.values())
    print(f"rewards/accuracies {right / len(rows):.4f} ({right}/{len(rows)})")
    for (task, kind), (n_right, n) in sorted(groups.items()):
        print(f"  {task:8s} {kind:27s} {n_right:4d}/{n}")
    for line in wrong:
        print(line)
    for name, path in (("reference", args.reference), ("policy", args.policy)):
        counts = greedy_exact_match(path, rows, sp)
        right = sum(c[0] for c in counts.values())
        print(f"{name} greedy exact match {right / len(rows):.4f}: " +
              ", ".join(f"{task} {c[0]}/{c[1]}" for task, c in sorted(counts.items())))


if __name__ == "__main__":
    main()
