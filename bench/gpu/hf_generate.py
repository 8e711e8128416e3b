"""transformers.generate on the model folder Anvil's bench_generate reads, for
bench/gpu/run.sh. `make` writes a randomly initialised model folder and prompt
files; `run` times generate() the way its docs show: the default dynamic
cache, or a static cache, with which generate() compiles the forward itself
(mode="reduce-overhead", i.e. CUDA graphs). Same prompts, a fixed number of new
tokens (no stop token), greedy or sampled at temperature 1 with no top-k/top-p.
Prints one JSON line: the median over repeats after warm-up calls."""
import argparse
import json
import statistics
import time

import torch

p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd", required=True)
mk = sub.add_parser("make")
mk.add_argument("--model", required=True, help="an Anvil model config, configs/models/*.yaml")
mk.add_argument("--vocab", type=int, default=None)
mk.add_argument("--out", required=True)
mk.add_argument("--prompt-len", type=int, default=128)
mk.add_argument("--batches", default="1,32")
mk.add_argument("--groups", default="", help="GRPO-shaped prompt files: PxN = P prompts, each N times in a row")
mk.add_argument("--init-std", type=float, default=None, help="initializer_range (larger: peaked logits, no ties)")
rn = sub.add_parser("run")
rn.add_argument("--dir", required=True)
rn.add_argument("--prompts", required=True)
rn.add_argument("--new", type=int, default=128)
rn.add_argument("--mode", default="greedy", choices=["greedy", "sample"])
rn.add_argument("--impl", default="default", choices=["default", "static-compile"])
rn.add_argument("--device", default="cuda")
rn.add_argument("--dtype", default="bfloat16")
rn.add_argument("--repeats", type=int, default=3)
a = p.parse_args()

import transformers  # noqa: E402

if a.cmd == "make":
    from models import hf_config, read_model
    torch.manual_seed(0)
    m = read_model(a.model, a.vocab)
    cfg = hf_config(m)
    if a.init_std is not None:
        cfg.initializer_range = a.init_std
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(a.out)
    g = torch.Generator().manual_seed(1)
    for b in map(int, a.batches.split(",")):
        ids = torch.randint(m["vocab_size"], (b, a.prompt_len), generator=g).tolist()
        json.dump(ids, open(f"{a.out}/prompts_b{b}.json", "w"))
    for grp in filter(None, a.groups.split(",")):
        n_prompts, n_samples = map(int, grp.split("x"))
        ids = torch.randint(m["vocab_size"], (n_prompts, a.prompt_len), generator=g).tolist()
        json.dump([row for row in ids for _ in range(n_samples)], open(f"{a.out}/prompts_g{grp}.json", "w"))
    raise SystemExit(0)

cuda = a.device.startswith("cuda")
model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=getattr(torch, a.dtype),
                                                          attn_implementation="sdpa").to(a.device).eval()
ids = torch.tensor(json.load(open(a.prompts)), device=a.device)
kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=a.mode == "sample", temperature=1.0, top_k=0,
          top_p=1.0, pad_token_id=0, attention_mask=torch.ones_like(ids))
warmup = 1
if a.impl == "static-compile":
    # The documented path: a static cache makes generate() compile the forward itself (CompileConfig:
    # fullgraph, mode "reduce-overhead", i.e. CUDA graphs) and clone what the graphs return. Wrapping
    # model.forward in torch.compile by hand died with "accessing tensor output of CUDAGraphs that has
    # been overwritten" (2026-11-26, H200).
    kw["cache_implementation"] = "static"
    warmup = 3  # compilation, then CUDA-graph recording
sync = torch.cuda.synchronize if cuda else (lambda: None)
times = []
with torch.inference_mode():
    for i in range(warmup + a.repeats):
        sync()
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
new = out.shape[1] - ids.shape[1]
med = statistics.median(times)
print(json.dumps({"impl": f"transformers-{a.impl}", "family": model.config.model_type, "mode": a.mode,
                  "device": a.device, "dtype": a.dtype, "batch": ids.shape[0], "prompt_len": ids.shape[1],
                  "new_tokens": new, "median_s": med, "tokens_per_s": ids.shape[0] * new / med,
                  "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}), flush=True)
