"""The transformers peer's training step (bench/gpu/hf_train.py's model and
step: random tokens, fused AdamW, grad clipping at 1.0, SDPA, bf16 autocast,
torch.compile with --compile 1) under torch.profiler for --steps steps after
--warmup: writes OUT/trace.json, OUT/summary.json and OUT/summary.txt in the
format of Anvil's train.profile_steps (bench/gpu/profile_summary.py).

usage: profile_hf.py --model configs/models/gpt2-124m.yaml --batch 16 --seq 1024 --compile 1 --out DIR
       (--device cpu: a smoke test; no compile there unless asked)"""
import argparse
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from models import hf_config, read_model
from profile_summary import STEP, events_of, summarize, summary_text

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="an Anvil model config, configs/models/*.yaml")
p.add_argument("--vocab", type=int, default=None, help="vocab_size when the config leaves it to the tokenizer")
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--warmup", type=int, default=4, help="steps before the profiled ones (compilation happens here)")
p.add_argument("--steps", type=int, default=3, help="profiled steps")
p.add_argument("--compile", type=int, default=0)
p.add_argument("--device", default="cuda")
p.add_argument("--out", required=True, help="folder for trace.json, summary.json, summary.txt")
a = p.parse_args()

import transformers  # noqa: E402

cuda = a.device.startswith("cuda")
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
cfg = hf_config(read_model(a.model, a.vocab))
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg).to(a.device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
fwd = torch.compile(model) if a.compile else model
sync = torch.cuda.synchronize if cuda else (lambda: None)


def step():
    ids = torch.randint(cfg.vocab_size, (a.batch, a.seq), device=a.device)
    with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16):
        loss = fwd(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


for _ in range(a.warmup):
    step()
sync()
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
with profile(activities=activities) as prof:
    for i in range(a.steps):
        with record_function(f"{STEP}{a.warmup + i + 1}"):
            step()
    sync()  # the last step's kernels end inside the recording (after its annotation: not counted)
os.makedirs(a.out, exist_ok=True)
prof.export_chrome_trace(os.path.join(a.out, "trace.json"))
summary = summarize(events_of(prof), cuda, "transformers" + (" + torch.compile" if a.compile else " eager"))
with open(os.path.join(a.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
with open(os.path.join(a.out, "summary.txt"), "w") as f:
    f.write(summary_text(summary))
print(f"profile of steps {summary['first_step']}-{summary['last_step']}: {a.out} (trace.json, summary.txt)", flush=True)
