"""bench/gpu/run.sh's bookkeeping. `anvil` turns an Anvil run's metrics.jsonl
into one result line (median tokens/s over the steps after warm-up, peak GPU
memory, checkpoint stalls); `table` prints every result of a run as Markdown
tables with ratios and MFU (docs/benchmarks.md quotes them)."""
import argparse
import json
import statistics
import sys
from collections import defaultdict

p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd", required=True)
an = sub.add_parser("anvil")
an.add_argument("--metrics", required=True)
an.add_argument("--tag", required=True)
an.add_argument("--model", required=True)
an.add_argument("--vocab", type=int, default=None)
an.add_argument("--batch", type=int, required=True)
an.add_argument("--seq", type=int, required=True)
an.add_argument("--precision", default="bf16")
an.add_argument("--warmup", type=int, default=4)
an.add_argument("--device", default="cuda")
tb = sub.add_parser("table")
tb.add_argument("results")
a = p.parse_args()


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


if a.cmd == "anvil":
    from models import flops_per_token, read_model
    rows = [json.loads(line) for line in open(a.metrics)]
    steps = [r for r in rows if "tokens_per_s" in r and r.get("step", 0) > a.warmup]
    if not steps:
        sys.exit(f"{a.metrics}: no step after warm-up step {a.warmup}")
    m = read_model(a.model, a.vocab)
    fpt, n = flops_per_token(m, a.seq)
    peaks = [r["memory/gpu_peak_bytes"] for r in rows if "memory/gpu_peak_bytes" in r]
    stalls = [r["time/checkpoint_stall_s"] for r in rows if "time/checkpoint_stall_s" in r]
    writes = [r["time/checkpoint_write_s"] for r in rows if "time/checkpoint_write_s" in r]
    print(json.dumps({"impl": a.tag, "precision": a.precision, "model": a.model, "family": m["family"], "params": n,
                      "batch": a.batch, "seq": a.seq, "device": a.device,
                      "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps),
                      "median_step_s": statistics.median(a.batch * a.seq / r["tokens_per_s"] for r in steps),
                      "flops_per_token": fpt, "loss": rows[-1].get("loss"),
                      "peak_bytes": max(peaks) if peaks else None,
                      "checkpoint_stall_s": stalls, "checkpoint_write_s": writes}))
    sys.exit(0)

from models import PEAK_FLOPS  # noqa: E402

res = [json.loads(line) for line in open(a.results) if line.startswith("{")]
train = [r for r in res if "flops_per_token" in r]
gen = [r for r in res if "new_tokens" in r]


def mfu(r):
    if not r["device"].startswith("cuda"):
        return None
    return 100 * r["tokens_per_s"] * r["flops_per_token"] / PEAK_FLOPS[r["precision"]]


def med(rs, key="tokens_per_s"):
    v = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(v) if v else None


def ratio(x, y):
    return f"{x / y:.2f}x" if x and y else "-"


def grouped(rows, key):
    """{key(row): {impl: [rows]}}, in the order rows come."""
    out = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[key(r)][r["impl"]].append(r)
    return out


groups = grouped(train, lambda r: (r["model"].split("/")[-1].removesuffix(".yaml"), r["batch"], r["seq"],
                                    r["precision"]))
if groups:
    print("| model, batch x seq, precision | impl | tokens/s (median) | MFU % | peak GiB | vs transformers eager "
          "| vs transformers + compile | vs anvil |")
    print("|---|---|---|---|---|---|---|---|")
for key, by in groups.items():
    eager, comp = med(by.get("transformers-eager", [])), med(by.get("transformers-compile", []))
    plain = med(by.get("anvil", []))
    for impl, runs in by.items():
        t = med(runs)
        u = [mfu(r) for r in runs]
        peak = med(runs, "peak_bytes")
        print(f"| {key[0]}, {key[1]} x {key[2]}, {key[3]} | {impl} (n={len(runs)}) | {fmt(t)} | "
              f"{fmt(statistics.median(u), 1) if None not in u else '-'} | {fmt(peak / 2**30 if peak else None, 2)} "
              f"| {ratio(t, eager)} | {ratio(t, comp)} | {ratio(t, plain)} |")

stall = [r for r in train if r.get("checkpoint_stall_s")]
for r in stall:
    writes = ", ".join(f"{s:.2f} s" for s in r["checkpoint_write_s"]) or "none (written at once)"
    print(f"\ncheckpoint stall, {r['impl']}: per save {', '.join(f'{s:.3f}' for s in r['checkpoint_stall_s'])} s; "
          f"background write {writes}")

ggroups = grouped(gen, lambda r: (r["family"], r["batch"], r["prompt_len"], r["new_tokens"], r["mode"], r["dtype"]))
if ggroups:
    print("\n| generation: family, batch, prompt + new, mode, dtype | impl | new tokens/s (median) "
          "| vs transformers default | vs transformers static + compile |")
    print("|---|---|---|---|---|")
for key, by in ggroups.items():
    d, s = med(by.get("transformers-default", [])), med(by.get("transformers-static-compile", []))
    for impl, runs in by.items():
        t = med(runs)
        print(f"| {key[0]}, {key[1]}, {key[2]} + {key[3]}, {key[4]}, {key[5]} | {impl} (n={len(runs)}) | {fmt(t)} "
              f"| {ratio(t, d)} | {ratio(t, s)} |")
