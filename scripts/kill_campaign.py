#!/usr/bin/env python3
"""kill -9 campaign: SIGKILL a training run at random moments, resume it each
time, and check that it ends with the losses of an uninterrupted run and that
no checkpoint folder was ever half-written or unreadable.

    .venv/bin/python scripts/kill_campaign.py [--kills 20] [--ranks 0|2] [--seed 1]

--ranks 0 runs one plain process; --ranks 2 runs two full_shard MPI ranks
(mpirun; the whole job is killed). The run saves every 5 steps, keeps 2
checkpoints (so it prunes) and evaluates every 7. Kills cycle between a
random moment and the moment a checkpoint write, pruning or an eval step is
seen under way, so they land in each. After each kill every complete
checkpoint (one with trainer_state.json) is opened: its JSON parsed and
every safetensors file read in full. Prints the figures docs/reliability.md
records, and exits non-zero on any mismatch.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ROOT / "build" / "bin" / "trainer"
CONFIG = """
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.1}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}]}
optimizer: {lr: 1.0e-3, weight_decay: 0.01}
schedule: {warmup_steps: 5, decay: cosine}
train: {max_steps: STEPS, micro_batch_size: 8, global_batch_size: 16, save_every: 5, eval_every: 7,
        keep_checkpoints: 2, log_every: 1000, threads: 1}
eval: {batch_size: 16, max_batches: 2, generate_samples: 4, max_new_tokens: 6, table_rows: 0}
"""


def command(cfg, out, ranks):
    cmd = [str(TRAINER), "--config", str(cfg), f"output_dir={out}"]
    if ranks:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
        cmd.append("dist.sharding=full_shard")
    return cmd


def losses(out):
    rows = [json.loads(l) for l in open(out / "metrics.jsonl") if l.strip()]
    return {r["step"]: r["loss"] for r in rows}


def check_checkpoints(out):
    """Opens every complete checkpoint; returns (count, problems)."""
    n, problems = 0, []
    for d in sorted(out.glob("checkpoint-*")):
        if not (d / "trainer_state.json").exists():
            problems.append(f"{d.name}: published without trainer_state.json")
            continue
        n += 1
        try:
            for j in d.rglob("*.json"):
                json.loads(j.read_text())
            for s in d.rglob("*.safetensors"):
                load_file(str(s))
        except Exception as e:  # noqa: BLE001 - any failure to read is the finding
            problems.append(f"{d.name}: {e}")
    return n, problems


def phase(out, before):
    """What the run was doing when it died, from what it left behind: temp
    folders (a checkpoint being written or replaced), more complete
    checkpoints than kept (pruning), or the metrics' last step (the next step
    evaluates, or is an ordinary step)."""
    names = [p.name for p in out.iterdir()] if out.exists() else []
    fresh = [n for n in names if n not in before]  # an earlier kill's leftovers do not count
    if any(".tmp-" in n for n in fresh):
        return "checkpoint write"
    if any(".old-" in n for n in fresh):
        return "checkpoint replace"
    if any(".pruned-" in n for n in fresh) or (
            any(n.startswith("checkpoint-") for n in fresh) and len([n for n in names if n.startswith("checkpoint-")]) > 2):
        return "pruning"
    metrics = out / "metrics.jsonl"
    if not metrics.exists() or not metrics.read_text().strip():
        return "start-up or first step"
    return "eval step" if (max(losses(out)) + 1) % 7 == 0 else "step"


# Kills cycle through these aims: a random moment, and the moment one of the
# short phases is seen under way (polled every millisecond).
TARGETS = ["random", "checkpoint write", "pruning", "eval step"]


def wait_for(target, out, before, proc, rng, run_s, steps):
    deadline = time.time() + run_s
    if target == "random":  # once it trains: start-up is not what this is about
        while time.time() < deadline and proc.poll() is None and not (out / "metrics.jsonl").exists():
            time.sleep(0.005)
        time.sleep(rng.uniform(0, max(0.5, run_s / 4)))
        return
    while time.time() < deadline and proc.poll() is None:
        names = [p.name for p in out.iterdir()] if out.exists() else []
        if target == "checkpoint write" and any(".tmp-" in n for n in names):
            return
        if target == "pruning" and phase(out, before) == "pruning":
            return
        if target == "eval step" and (out / "metrics.jsonl").exists():
            try:
                if (max(losses(out)) + 1) % 7 == 0:
                    time.sleep(rng.uniform(0, run_s / steps))  # somewhere in that step or its eval
                    return
            except (ValueError, json.JSONDecodeError):
                pass
        time.sleep(0.001)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="anvil-kill-"))
    try:
        cfg = work / "run.yaml"
        cfg.write_text(CONFIG.replace("STEPS", str(args.steps)))
        t0 = time.time()
        ref = work / "reference"
        subprocess.run(command(cfg, ref, args.ranks), cwd=ROOT, check=True, capture_output=True)
        run_s = time.time() - t0
        want = losses(ref)

        out = work / "killed"
        log = work / "killed.log"
        kills, resumes, phases, problems, opened = 0, 0, {}, [], 0
        while True:
            before = set(p.name for p in out.iterdir()) if out.exists() else set()
            with open(log, "a") as lf:
                p = subprocess.Popen(command(cfg, out, args.ranks), cwd=ROOT, stdout=lf, stderr=lf,
                                     start_new_session=True)
            resumes += kills > 0
            if kills < args.kills:
                wait_for(TARGETS[kills % len(TARGETS)], out, before, p, rng, run_s, args.steps)
            if kills < args.kills and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                while True:  # every rank gone, not only mpirun
                    try:
                        os.killpg(p.pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.01)
                kills += 1
                ph = phase(out, before)
                phases[ph] = phases.get(ph, 0) + 1
                n, bad = check_checkpoints(out)
                opened += n
                problems += [f"after kill {kills}: {b}" for b in bad]
                continue
            if p.wait() != 0:
                problems.append(f"run exited {p.returncode}; see {log}")
                break
            if max(losses(out)) >= args.steps:
                break
        got = losses(out)
        same = sum(1 for s, v in want.items() if got.get(s) == v)
        n, bad = check_checkpoints(out)
        problems += bad
        what = f"{args.ranks} full_shard ranks" if args.ranks else "one process"
        print(f"[kill campaign] {what}: {kills} kills, {resumes} resumes, {opened} checkpoint opens after kills, "
              f"{same}/{len(want)} steps with bit-identical losses, {len(problems)} problems")
        print(f"[kill campaign] where the kills landed: {json.dumps(phases, sort_keys=True)}")
        for p_ in problems:
            print(f"[kill campaign] PROBLEM: {p_}")
        return 0 if not problems and same == len(want) and kills >= args.kills else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
