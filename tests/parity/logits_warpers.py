"""Reference scores from transformers' own logits processors and warpers, for
Anvil's generation::warp and generation::apply_penalties.

Usage: logits_warpers.py OUT.json

Random float32 logits (torch.manual_seed(0)); each case runs transformers'
processors in the order generate() builds them: RepetitionPenaltyLogitsProcessor
(over the given ids), then TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper. Removed tokens come back as null.
Presence and frequency penalties are not in transformers; their reference is
the OpenAI / vLLM definition, written here: score -= presence * [count > 0] +
frequency * count over the tokens produced so far.
"""
import json
import sys

import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

torch.manual_seed(0)
B, V = 6, 64
logits = torch.randn(B, V) * 1.5
ids = torch.randint(0, V, (B, 10))
produced = torch.randint(0, V, (B, 7))

CASES = [
    dict(name="temperature", temperature=0.7),
    dict(name="top_k", top_k=5),
    dict(name="top_p", top_p=0.8),
    dict(name="top_p_small", top_p=0.05),
    dict(name="min_p", min_p=0.1),
    dict(name="all", temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
    dict(name="repetition", repetition_penalty=1.3),
    dict(name="repetition_then_top_p", repetition_penalty=0.8, top_p=0.7),
    dict(name="presence_frequency", presence_penalty=0.6, frequency_penalty=0.25),
]


def run(case):
    s = logits.clone()
    if "repetition_penalty" in case:
        s = RepetitionPenaltyLogitsProcessor(case["repetition_penalty"])(ids, s)
    if "presence_penalty" in case:
        counts = torch.zeros(B, V).scatter_add_(1, produced, torch.ones_like(produced, dtype=torch.float))
        s = s - case["presence_penalty"] * (counts > 0).float() - case["frequency_penalty"] * counts
    if "temperature" in case:
        s = TemperatureLogitsWarper(case["temperature"])(ids, s)
    if "top_k" in case:
        s = TopKLogitsWarper(case["top_k"])(ids, s)
    if "top_p" in case:
        s = TopPLogitsWarper(case["top_p"])(ids, s)
    if "min_p" in case:
        s = MinPLogitsWarper(case["min_p"])(ids, s)
    return [[None if v == float("-inf") else v for v in row] for row in s.tolist()]


out = dict(logits=logits.tolist(), ids=ids.tolist(), produced=produced.tolist(),
           cases=[dict(case, expected=run(case)) for case in CASES])
json.dump(out, open(sys.argv[1], "w"))
