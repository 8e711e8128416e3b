"""Where the time of the transformers peer's training step goes
(bench/train_step_hf.py's model and step, torch.profiler, 2 steps after 2
warm-up steps). Prints the ops by self CPU time.

usage: profile_hf_step.py [--threads 2] [--batch 8] [--seq 256]
"""
import argparse

import torch
from torch.profiler import profile
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(threads=2, batch=8, seq=256).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=288, intermediate_size=768, num_hidden_layers=6,
                      num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=a.seq,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    with profile() as p:
        for _ in range(2):
            step()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
