"""The transformers + PyTorch training step a user writes, on the same shapes
as Anvil's trainer in bench/gpu/run.sh: random tokens, AdamW (fused), grad
clipping at 1.0, SDPA attention; eager under bf16 autocast, fp32 with TF32, or
torch.compile'd. Prints one JSON line: median step time over the timed steps,
tokens/s, peak allocated memory (torch.cuda.max_memory_allocated)."""
import argparse
import json
import statistics
import time

import torch

from models import flops_per_token, hf_config, read_model

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="an Anvil model config, configs/models/*.yaml")
p.add_argument("--vocab", type=int, default=None, help="vocab_size when the config leaves it to the tokenizer")
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--mode", default="autocast", choices=["autocast", "fp32"])  # fp32 runs with TF32 matmuls
p.add_argument("--compile", type=int, default=0)
p.add_argument("--device", default="cuda")
a = p.parse_args()

import transformers  # noqa: E402

cuda = a.device.startswith("cuda")
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
m = read_model(a.model, a.vocab)
cfg = hf_config(m)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg).to(a.device)
fpt, n_params = flops_per_token(m, a.seq)
assert n_params == sum(t.numel() for t in model.parameters()), "bench/gpu/models.py counts parameters wrongly"
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
fwd = torch.compile(model) if a.compile else model
sync = torch.cuda.synchronize if cuda else (lambda: None)
times = []
for i in range(a.warmup + a.steps):
    ids = torch.randint(cfg.vocab_size, (a.batch, a.seq), device=a.device)
    sync()
    t0 = time.perf_counter()
    with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.mode == "autocast"):
        loss = fwd(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss_value = loss.item()
    sync()
    if i >= a.warmup:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"impl": f"transformers-{'compile' if a.compile else 'eager'}", "precision":
                  "bf16" if a.mode == "autocast" else "tf32", "model": a.model, "family": m["family"],
                  "params": n_params, "batch": a.batch, "seq": a.seq, "device": a.device, "median_step_s": med,
                  "tokens_per_s": a.batch * a.seq / med, "flops_per_token": fpt, "loss": loss_value,
                  "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                  "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}), flush=True)
