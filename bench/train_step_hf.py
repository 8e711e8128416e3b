"""The peer of bench/train_step.cpp: the same ~10.7 M parameter LLaMA, batch
and training step in Python transformers + torch eager, as a user would write
it (LlamaForCausalLM with its default SDPA attention, torch.optim.AdamW with
its defaults, clip_grad_norm_). Prints one JSON line.

usage: train_step_hf.py [--threads 2] [--batch 8] [--seq 256] [--steps 10] [--warmup 3]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(threads=2, batch=8, seq=256, steps=10, warmup=3, vocab=8192, hidden=288, layers=6, heads=6,
                     intermediate=768).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                      max_position_embeddings=a.seq, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times, loss = [], None
    for i in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        loss = loss.item()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"impl": "transformers", "params": n_params, "batch": a.batch, "seq": a.seq,
                      "threads": a.threads, "median_step_s": med, "tokens_per_s": a.batch * a.seq / med,
                      "final_loss": loss}))


if __name__ == "__main__":
    main()
