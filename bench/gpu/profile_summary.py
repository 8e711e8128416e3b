"""The summary of a profiled window of training steps, as Anvil's trainer
writes it for train.profile_steps (src/train/step_profiler.cpp: same keys, same
text): steps are host annotations named ProfilerStep#N; the window runs from
the first step's start to the end of the last step or of the last device work,
whichever is later.

summarize(events, gpu, source) takes (name, on_device, start_ns, duration_ns,
thread) tuples; events_of(prof) makes them from a torch.profiler.profile."""

STEP = "ProfilerStep#"
TOP, NAME_CHARS = 15, 100
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def events_of(prof):
    """The events of a finished torch.profiler.profile, annotations dropped but
    the host's step markers (the device's copies would count as busy time)."""
    out = []
    for e in prof.profiler.kineto_results.events():
        on_device = str(e.device_type()).endswith("CUDA")
        name = e.name()
        if e.is_user_annotation() and (on_device or not name.startswith(STEP)):
            continue
        out.append((name, on_device, e.start_ns(), e.duration_ns(), e.start_thread_id()))
    return out


def runtime_name(name):
    """A CUDA runtime call's name without its version suffix (cudaLaunchKernelExC_v11060)."""
    head, sep, tail = name.rpartition("_v")
    return head if sep and tail.isdigit() else name


def self_times(host):
    """Each host event's time less that of the events nested in it on its thread."""
    self = [e[3] for e in host]
    by_thread = {}
    for i, e in enumerate(host):
        by_thread.setdefault(e[4], []).append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (host[i][2], -host[i][3]))
        open_ = []
        for i in idx:
            start, end = host[i][2], host[i][2] + host[i][3]
            while open_ and host[open_[-1]][2] + host[open_[-1]][3] <= start:
                open_.pop()
            if open_:
                p = host[open_[-1]]
                self[open_[-1]] -= min(end, p[2] + p[3]) - start
            open_.append(i)
    return [max(s, 0) for s in self]


def union_ns(spans):
    total, cur_start, cur_end = 0, 0, None
    for s, e in sorted(spans):
        if cur_end is None or s > cur_end:
            if cur_end is not None and cur_end > cur_start:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None and cur_end > cur_start:
        total += cur_end - cur_start
    return total


def summarize(events, gpu, source):
    steps = sorted((e for e in events if not e[1] and e[0].startswith(STEP)), key=lambda e: e[2])
    host = [e for e in events if not e[1] and not e[0].startswith(STEP)]
    marks = steps or host
    w0 = min(e[2] for e in marks)
    host_end = max(e[2] + e[3] for e in marks)
    w1, busy = host_end, []
    for e in events:
        if e[1] and e[2] + e[3] > w0:
            busy.append((max(e[2], w0), e[2] + e[3]))
            w1 = max(w1, e[2] + e[3])
    window_ns = max(w1 - w0, 0)
    n = max(len(steps), 1)
    launches = syncs = 0
    for e in host:
        if not w0 <= e[2] <= host_end:
            continue
        name = runtime_name(e[0])
        if name in ("cudaLaunchKernel", "cudaLaunchKernelExC") or name.startswith("cuLaunchKernel"):
            launches += 1
        elif name in SYNCS:
            syncs += 1
    by_name = {}
    if gpu:
        timed = [(e[0], e[3]) for e in events if e[1]]
    else:
        timed = [(e[0], t) for e, t in zip(host, self_times(host))]
    for name, t in timed:
        ns, calls = by_name.get(name, (0, 0))
        by_name[name] = (ns + t, calls + 1)
    all_ns = sum(ns for ns, _ in by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {
        "source": source,
        "device": "cuda" if gpu else "cpu",
        "steps": len(steps),
        "first_step": int(steps[0][0][len(STEP):]) if steps else 0,
        "last_step": int(steps[-1][0][len(STEP):]) if steps else 0,
        "window_ms": window_ns / 1e6,
        "wall_ms_per_step": window_ns / 1e6 / n,
        "step_ms": [e[3] / 1e6 for e in steps],
        "gpu_busy_fraction": min(1.0, union_ns(busy) / window_ns) if gpu and window_ns > 0 else None,
        "kernel_launches_per_step": launches / n,
        "host_syncs_per_step": syncs / n,
        "ranked_by": "gpu_time" if gpu else "self_cpu_time",
        "top": [{"name": name[:NAME_CHARS], "total_ms": ns / 1e6, "calls": calls,
                 "percent": 100.0 * ns / all_ns if all_ns else 0.0} for name, (ns, calls) in ranked],
    }


def summary_text(s):
    steps_ms = ", ".join(f"{ms:.2f}" for ms in s["step_ms"])
    lines = [f"profile ({s['source']}): steps {s['first_step']}-{s['last_step']} ({s['steps']}) on {s['device']}",
             f"wall time per step: {s['wall_ms_per_step']:.2f} ms (window {s['window_ms']:.2f} ms; "
             f"steps on the host: {steps_ms} ms)",
             "GPU busy: - (no GPU)" if s["gpu_busy_fraction"] is None
             else f"GPU busy: {100 * s['gpu_busy_fraction']:.1f}% of the window",
             f"kernel launches per step: {s['kernel_launches_per_step']:.1f}",
             f"host syncs per step: {s['host_syncs_per_step']:.1f}",
             f"top {len(s['top'])} " + ("kernels by GPU time:" if s["ranked_by"] == "gpu_time"
                                        else "ops by self CPU time:"),
             "  total ms    calls       %  name"]
    lines += [f"{t['total_ms']:10.3f} {t['calls']:8d} {t['percent']:6.1f}%  {t['name']}" for t in s["top"]]
    return "\n".join(lines) + "\n"
