"""Runs the commands the docs show, so the docs cannot go stale.

Usage: run_doc_commands.py SOURCE_DIR BUILD_DIR QUICKSTART_RUN WORKDIR

Executes every command of the ```sh and ```python blocks of
docs/getting-started.md and of the README's two command blocks (the first
lines, and "Quickstart, step by step"), in order, from WORKDIR: a sandbox
whose build/, configs/, data/, scripts/, examples/ and .venv/ point into the source and
build trees, and whose runs/quickstart is a copy of QUICKSTART_RUN (the
test-suite's trained quickstart run), so that runs/quickstart/checkpoint-1000
and -1500 exist as after `scripts/quickstart.sh`. Every command must exit 0.

What it changes, so that the whole set runs in a couple of minutes:
- scripts/setup.sh, scripts/build.sh and scripts/test.sh are not run (the
  test suite is what they build and run); scripts/quickstart.sh runs with
  SKIP_SETUP=1.
- Each document runs in a fresh sandbox (the README repeats an export of
  getting-started's, which a second time is refused, as it should be).
- A training command that starts a new run gets `train.max_steps=8
  train.save_every=8 schedule.warmup_steps=2 eval.generate_samples=16`
  appended (without the last for reward and pretrain, which generate nothing
  and so refuse the key; the quickstart's own
  command resumes the copied, finished run instead), and a later command's
  runs/<run>/checkpoint-<N> that such a shortened run did not reach names the
  run's newest checkpoint.
- Files a command reads that a user brings (ids.json, lines.txt) are written
  first.
- The output shown after the `--dry-run` command must appear in its output
  (the plan's lines; the resume line depends on the folder).
Prints one line per command, with the seconds it took; exits 1 listing the
failures.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import time

# 8 steps: two rollouts of the PPO-family configs (4 optimizer steps each), where saves must fall. Alone on a
# 2-core Zen 4 (2026-11-28) the whole test took 27 s with it and 38 s with the 20 steps it had before.
CAP = "train.max_steps=8 train.save_every=8 schedule.warmup_steps=2"
CAP_GENERATION = "eval.generate_samples=16"


def blocks(path):
    """(language, text) of each fenced block, in order."""
    out, lang, buf = [], None, []
    for line in open(path, encoding="utf-8"):
        s = line.rstrip("\n")
        if lang is None and s.startswith("```"):
            lang, buf = s[3:].strip(), []
        elif lang is not None and s.startswith("```"):
            out.append((lang, "\n".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(s)
    return out


def strip_comment(line):
    """The line without a trailing shell comment (a # outside quotes, after a blank)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def commands(text):
    cmds, cur = [], ""
    for raw in text.split("\n"):
        line = strip_comment(raw)
        if line.endswith("\\"):
            cur += line[:-1].rstrip() + " "
            continue
        cur += line.strip()
        if cur.strip():
            cmds.append(cur.strip())
        cur = ""
    return cmds


def newest_checkpoint(run):
    ckpts = sorted(glob.glob(os.path.join(run, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    return ckpts[-1] if ckpts else None


def algorithm_of(configs, work):
    """The `algorithm:` the last of the config files that sets one sets (sft by default)."""
    algorithm = "sft"
    for config in configs:
        path = os.path.join(work, config)
        if not os.path.exists(path):
            path = os.path.join(work, "configs", config)  # a bare name is looked up in configs/
        if os.path.exists(path):
            for line in open(path, encoding="utf-8"):
                m = re.match(r"^algorithm:\s*(\w+)", line)
                if m:
                    algorithm = m.group(1)
    return algorithm


def adapt(cmd, work):
    """The command as the sandbox runs it, or None to skip it."""
    if re.match(r"^(bash )?scripts/(setup|build|test)\.sh\b", cmd):
        return None
    if re.match(r"^scripts/quickstart\.sh\b", cmd):
        return "SKIP_SETUP=1 " + cmd
    training = "build/bin/trainer" in cmd and "--dry-run" not in cmd and "--eval-only" not in cmd
    configs = re.findall(r"--config (\S+)", cmd)
    resumes_quickstart = configs == ["configs/quickstart.yaml"] and "output_dir=" not in cmd
    if training and not resumes_quickstart:
        cmd += " " + CAP
        if algorithm_of(configs, work) not in ("reward", "pretrain"):
            cmd += " " + CAP_GENERATION

    def point(m):
        path = m.group(0)
        if os.path.exists(os.path.join(work, path)):
            return path
        newest = newest_checkpoint(os.path.join(work, m.group(1)))
        return os.path.relpath(newest, work) if newest else path

    return re.sub(r"(runs/[\w.-]+)/checkpoint-\d+", point, cmd)


def sandbox(src, build, quickstart_run, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "runs"))
    for name, target in [("build", build), ("configs", os.path.join(src, "configs")),
                         ("data", os.path.join(src, "data")), ("scripts", os.path.join(src, "scripts")),
                         ("examples", os.path.join(src, "examples")),
                         (".venv", os.path.join(src, ".venv"))]:
        os.symlink(target, os.path.join(work, name))
    shutil.copytree(quickstart_run, os.path.join(work, "runs", "quickstart"))
    with open(os.path.join(work, "ids.json"), "w") as f:
        f.write("[[266, 270, 261, 271], [268, 265, 265, 262]]\n")
    with open(os.path.join(work, "lines.txt"), "w") as f:
        f.write("reverse: hello\nadd: 12+30\n")


def doc_commands(src, doc, which):
    """(language, command, expected output or None) of a document's blocks."""
    todo = []
    bs = blocks(os.path.join(src, doc))
    shell = [i for i, (lang, _) in enumerate(bs) if lang in ("sh", "python")]
    if which is not None:
        shell = [i for i in shell if bs[i][0] == "sh"]
        shell = [shell[k] for k in which]
    for i in shell:
        lang, text = bs[i]
        if lang == "python":
            todo.append((lang, text, None))
            continue
        for c in commands(text):
            expected = None
            if "--dry-run" in c and i + 1 < len(bs) and bs[i + 1][0] == "":
                expected = bs[i + 1][1]
            todo.append((lang, c, expected))
    return todo


def main():
    src, build, quickstart_run, root = sys.argv[1:5]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
    failures, total = [], 0
    for k, (doc, which) in enumerate([("docs/getting-started.md", None), ("README.md", (0, 1))]):
        work = os.path.join(root, f"sandbox-{k}")
        sandbox(src, build, quickstart_run, work)
        for lang, cmd, expected in doc_commands(src, doc, which):
            total += 1
            if lang == "python":
                argv = [os.path.join(src, ".venv", "bin", "python"), "-c", cmd]
                shown = "python: " + cmd.splitlines()[-1]
            else:
                run = adapt(cmd, work)
                if run is None:
                    print(f"[docs] skip  {cmd}", flush=True)
                    continue
                argv = ["bash", "-o", "pipefail", "-c", run]
                shown = run
            start = time.monotonic()
            p = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            seconds = time.monotonic() - start
            ok = p.returncode == 0
            if ok and expected is not None:
                for line in expected.splitlines():
                    if line.strip() and not line.startswith("  resume:") and line not in p.stdout:
                        ok = False
                        print(f"[docs] {doc}: the output shown for `{cmd}` has a line it does not print: {line!r}")
            print(f"[docs] {'ok   ' if ok else 'FAIL '} {seconds:5.1f} s  {shown}", flush=True)
            if not ok:
                failures.append((doc, shown, p.returncode, p.stdout[-3000:]))
    for doc, shown, rc, out in failures:
        print(f"\n[docs] {doc}: `{shown}` exited {rc}:\n{out}")
    print(f"[docs] {total} commands, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
