"""Pass/fail checks of bench/gpu/run.sh's `check` section: Anvil on the GPU
against itself on the CPU, against transformers on the GPU, and its own
numerics under bf16, background saves and resume. Each prints one line,
PASS or FAIL, with what it measured; the exit code is 1 on FAIL."""
import argparse
import filecmp
import json
import os
import sys


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "step" in r}


def report(ok, name, detail):
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return 0 if ok else 1


def cmd_losses(a):
    x, y = losses(a.a), losses(a.b)
    steps = sorted(set(x) & set(y))
    if not steps or len(steps) != len(x):
        return report(False, a.name, f"steps differ: {sorted(x)} vs {sorted(y)}")
    worst = max(abs(x[s] - y[s]) - a.rtol * abs(y[s]) for s in steps)
    diff = max(abs(x[s] - y[s]) for s in steps)
    return report(worst <= a.atol, a.name, f"{len(steps)} steps, max |loss difference| {diff:.3g} "
                  f"(allowed {a.atol:g} + {a.rtol:g} x loss)")


def cmd_same_files(a):
    bad = []
    n = 0
    for root, _, files in os.walk(a.a):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), a.a)
            if rel.endswith("config.yaml"):  # the run's own config: its output_dir differs
                continue
            n += 1
            other = os.path.join(a.b, rel)
            if not os.path.exists(other) or not filecmp.cmp(os.path.join(root, f), other, shallow=False):
                bad.append(rel)
    return report(n > 0 and not bad, a.name, f"{n} files compared" + (f", differing: {bad[:5]}" if bad else ""))


def cmd_same_json(a):
    x, y = json.load(open(a.a)), json.load(open(a.b))
    flat = lambda v: [t for row in v for t in row]
    fx, fy = flat(x), flat(y)
    same = sum(p == q for p, q in zip(fx, fy))
    return report(x == y, a.name, f"{same} of {len(fy)} tokens equal")


def cmd_logits(a):
    import torch
    import transformers
    from safetensors.torch import load_file
    ids = torch.tensor(json.load(open(a.ids)), device=a.device)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32).to(a.device).eval()
    with torch.no_grad():
        ref = model(input_ids=ids).logits.float().cpu()
    ours = load_file(a.ours)["logits"]
    diff = (ours - ref).abs().max().item()
    return report(diff <= a.atol, a.name, f"max |logit difference| {diff:.3g} against transformers on {a.device} "
                  f"(allowed {a.atol:g})")


p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd", required=True)
for name, fn in [("losses", cmd_losses), ("same-files", cmd_same_files), ("same-json", cmd_same_json)]:
    s = sub.add_parser(name)
    s.add_argument("name")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--atol", type=float, default=0.0)
    s.add_argument("--rtol", type=float, default=0.0)
    s.set_defaults(fn=fn)
s = sub.add_parser("logits")
s.add_argument("name")
s.add_argument("--dir", required=True)
s.add_argument("--ids", required=True)
s.add_argument("--ours", required=True)
s.add_argument("--device", default="cuda")
s.add_argument("--atol", type=float, default=1e-4)
s.set_defaults(fn=cmd_logits)
a = p.parse_args()
sys.exit(a.fn(a))
