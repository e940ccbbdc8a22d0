"""torch-cuda stages called in process against the same programs behind xstage.

Run on a CUDA machine with the repository's ``src`` on ``PYTHONPATH``::

    PYTHONPATH=src python benchmarks/gpu_stage.py [--rounds 7] [--calls 30] [--tower PATH.pt2]

Stages (exported here on the GPU, each with its manifest): ``mlp-small`` (under 1 ms),
``conv-224`` (the conv 3→64→64 + GELU + linear at batch 8, 224², ~1 ms), ``mlp-large``
(8 x 4096², batch 4096: tens of ms), and the tiny Qwen3-VL vision tower when ``--tower``
names its ``.pt2`` (with its manifest beside it; launch-bound, ~70 small kernels). Arms,
interleaved round by round (each round runs ``--calls`` calls of every arm in turn), medians
over every call:

* ``inproc pageable``: host input → ``.cuda()`` → module → ``.cpu()`` (the issue's baseline);
* ``inproc pinned``: pinned host tensors, ``non_blocking=True`` both ways, one sync;
* ``xstage old``: ``--ep-option pinned_region=off cuda_graphs=off`` (pageable copies, eager);
* ``xstage eager``: the pinned region, eager (``cuda_graphs=off``);
* ``xstage graph``: the pinned region and the CUDA graph (the default);
* ``xstage graph 1cpu``: the same with the client's copies into and out of the region on the
  calling thread alone (``client/copies.py`` off; opened only where its helpers are on by
  default, from 4 CPUs, or ``XSTAGE_COPY_THREADS``): the A/B of the copy helpers;
* ``xstage graph no heads-up``: the same with the heads-up off (``shm.Doorbell.heads_up``: a
  caller whose input copy is long wakes the sleeping worker before it copies; on by default
  from 4 CPUs): the A/B of the worker's wake-up overlapping the copy;
* ``xstage graph unstreamed``: the same with the caller's copy of a large input in one piece
  (``Region.stream_fill`` off: the worker's DMA of it starts at the request, not during the
  copy; shm.py's "Streamed inputs");
* ``xstage graph chunk 1MiB``: the same with the streamed copy's chunks at 1 MiB instead of
  ``shm.STREAM_CHUNK_BYTES`` (fewer announcements, each DMA larger);
* ``xstage graph lead 0.3ms``: the same with the caller's near-end lead (waitpolicy rule 3) at
  0.3 ms instead of ``shm.NEAR_END_SECONDS``: a sleeping CPU here wakes 60-120 µs late;
* ``xstage graph slack 1us``: the same with this thread's timer slack at 1 µs during the call
  (``prctl(PR_SET_TIMERSLACK)``; Linux's default, 50 µs, lets a timed sleep end that late);
* ``xstage host in place``: the ``xstage graph`` stage called with its own host input slots
  (``Stage.input_slots()``, filled once: a producer writing there pays no copy) and its outputs
  read as views (``views=True``): the worker's DMA reads what the producer wrote;
* ``inproc device``: CUDA tensors in, the module, one sync (no host copy at all);
* ``xstage device``: ``--ep-option device_tensors=on``, CUDA tensors in, views of the worker's
  device slots out (the graph on; device-to-device copies only);
* ``xstage in place``: the same stage called with its own input slots (``Stage.device_inputs``,
  filled once): the caller's process does no GPU work per call.

``gpu`` is the stage's own device time (CUDA events around the module in process); ``device -
gpu`` is what the device-tensor path adds to it (target: within 50 µs). The ledger columns
are each xstage arm's budget/measured and its CUDA graph pool; the split columns say where
each xstage arm's round trip goes (``SPLIT``).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: fp32's noise tier (docs/external.md): the float64 tie-break of a 1 TFLOP stage on the host's
#: CPU would cost minutes per arm; the gate itself is what tests/gpu checks.
TOLERANCE = {"elem_a": 1e-5}
ARMS = ("inproc pageable", "inproc pinned", "xstage old", "xstage eager", "xstage graph",
        "xstage graph 1cpu", "xstage graph no heads-up", "xstage graph unstreamed",
        "xstage graph chunk 1MiB",
        "xstage graph lead 0.3ms",
        "xstage graph slack 1us", "xstage host in place", "inproc device",
        "xstage device", "xstage in place")
XS_OPTIONS = {"xstage old": {"pinned_region": "off", "cuda_graphs": "off"},
              "xstage eager": {"cuda_graphs": "off"}, "xstage graph": {},
              "xstage graph 1cpu": {}, "xstage graph no heads-up": {},
              "xstage graph unstreamed": {}, "xstage graph chunk 1MiB": {},
              "xstage graph lead 0.3ms": {},
              "xstage graph slack 1us": {},
              "xstage device": {"device_tensors": "on"}}


def _copies_on_one_thread(stage):
    """The stage's client copies on the calling thread alone (the A/B of ``client/copies.py``)."""
    from xstage.client import copies

    client = stage._client
    client._copies.close()
    client._copies = copies.CopyPool(0)
    if client.link.region is not None:
        client.link.region.use_copier(None)


def _near_end_lead(stage, seconds):
    """The stage's caller-side near-end lead (waitpolicy rule 3) set to ``seconds``."""
    from xstage_remote import waitpolicy

    policy = stage._client.link.bell.policy
    policy.near_end = seconds
    policy._near_end = waitpolicy.Decision(round(min(3 * seconds, policy.spin_seconds), 9),
                                           "near_end")


def _with_chunk(fn, nbytes):
    """``fn`` run with the streamed copy's chunk at ``nbytes`` (restored after)."""
    from xstage_remote import region  # the module whose copies read it

    def call():
        default, region.STREAM_CHUNK_BYTES = region.STREAM_CHUNK_BYTES, nbytes
        try:
            return fn()
        finally:
            region.STREAM_CHUNK_BYTES = default

    return call


def _with_slack(fn, ns):
    """``fn`` run with this thread's timer slack at ``ns`` (restored after)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    set_slack, get_slack = 29, 30  # PR_SET_TIMERSLACK, PR_GET_TIMERSLACK
    default = libc.prctl(get_slack, 0, 0, 0, 0)

    def call():
        libc.prctl(set_slack, ns, 0, 0, 0)
        try:
            return fn()
        finally:
            libc.prctl(set_slack, default, 0, 0, 0)

    return call


#: Where an xstage call's time goes, in µs (one clock, CLOCK_MONOTONIC, in both processes; the
#: region's stamps, docs/wire.md): the caller until the request is published (checks, the input
#: copies, device-to-device for device tensors, and their sync), publish to the worker's start
#: (the ring and the worker's wake-up), the worker's call, and its end to the caller's return
#: (the answer's publish and ring, the caller's wake-up, the outputs).
SPLIT = ("caller", "to worker", "worker", "back")


def _split(m0, timing, m1):
    """One call's ``SPLIT`` in µs from the caller's clock readings and the region's stamps."""
    pub, start, end = timing["published_ns"], timing["start_ns"], timing["end_ns"]
    return ((pub - m0) / 1e3, (start - pub) / 1e3, (end - start) / 1e3, (m1 - end) / 1e3)


def _modules(torch):
    nn = torch.nn

    class Mlp(nn.Module):
        def __init__(self, width, depth):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

        def forward(self, x):
            for layer in self.layers:
                x = torch.nn.functional.gelu(layer(x))
            return x

    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 64, 3, padding=1)
            self.c2 = nn.Conv2d(64, 64, 3, padding=1)
            self.fc = nn.Linear(64, 256)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.c1(x))
            h = torch.nn.functional.gelu(self.c2(h))
            return self.fc(h.mean(dim=(2, 3)))

    return {"mlp-small": (lambda: Mlp(1024, 4), (64, 1024)),
            "conv-224": (Conv, (8, 3, 224, 224)),
            "mlp-large": (lambda: Mlp(4096, 8), (4096, 4096))}


def export_stages(torch, folder):
    """Each built stage as a ``.pt2`` with its manifest, exported on the GPU."""
    from xstage.manifest import write_manifest

    out = {}
    for name, (make, shape) in _modules(torch).items():
        torch.manual_seed(0)
        module = make().cuda().eval()
        x = torch.randn(*shape, device="cuda")
        with torch.no_grad():
            y = module(x)
        program = torch.export.export(module, (x,), strict=False)
        path = Path(folder) / f"{name}.pt2"
        torch.export.save(program, str(path))
        write_manifest(path, component=name, fmt="pt:fp32", files=[path],
                       source={"kind": "script", "what": f"benchmarks/gpu_stage.py {name}"},
                       exporter={"torch": torch.__version__},
                       inputs=[{"name": "x", "dtype": "float32", "shape": list(shape)}],
                       outputs=[{"name": "y", "dtype": "float32", "shape": list(y.shape)}])
        out[name] = path
    return out


def _inproc(torch, path, feeds, names):
    """The two in-process arms and the stage's device time, over the program itself."""
    program = torch.export.load(str(path))
    try:
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, torch.device("cuda:0"))
    except ImportError:
        pass
    module = program.module()
    host = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names]
    pinned = [t.pin_memory() for t in host]
    with torch.no_grad():
        sample = module(*[t.cuda() for t in host])
    sample = list(sample) if isinstance(sample, (list, tuple)) else [sample]
    outs = [torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for v in sample]

    def pageable():
        with torch.no_grad():
            r = module(*[t.cuda() for t in host])
        return [v.cpu() for v in (r if isinstance(r, (list, tuple)) else [r])]

    def pinned_call():
        with torch.no_grad():
            r = module(*[t.cuda(non_blocking=True) for t in pinned])
        for o, v in zip(outs, r if isinstance(r, (list, tuple)) else [r], strict=True):
            o.copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        return outs

    dev = [t.cuda() for t in host]

    def device_call():
        with torch.no_grad():
            r = module(*dev)
        torch.cuda.synchronize()
        return r

    def gpu_ms():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        with torch.no_grad():
            module(*dev)
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    return pageable, pinned_call, gpu_ms, device_call


def bench_stage(torch, name, path, rounds, calls, say, arms=None):
    import xstage
    from xstage.client import copies

    stages = {}
    for arm, opts in XS_OPTIONS.items():
        if arms and arm not in arms and arm != "xstage graph":  # the graph arm is the reference
            continue
        if arm == "xstage graph 1cpu" and not copies.COPY_THREADS:
            continue  # the same as "xstage graph" here: no helpers to turn off
        t0 = time.perf_counter()
        stages[arm] = xstage.open_stage(path, route="torch-cuda", ep_options=opts or None,
                                        record_on_close=False, depth=1, tolerance=TOLERANCE)
        say(f"  {name}: {arm} opened in {time.perf_counter() - t0:.1f} s")
        if arm == "xstage graph 1cpu":
            _copies_on_one_thread(stages[arm])
        if arm == "xstage graph no heads-up":
            stages[arm]._client._pipe.heads_up_ns = 0
        if arm == "xstage graph unstreamed" and stages[arm]._client.link.region is not None:
            stages[arm]._client.link.region.stream_fill = False
        if arm == "xstage graph lead 0.3ms":
            _near_end_lead(stages[arm], 0.0003)
    feeds = dict(stages["xstage graph"].inputs)
    names = [i.name for i in stages["xstage graph"].artifact.inputs]
    pageable, pinned_call, gpu_ms, device_call = _inproc(torch, path, feeds, names)
    dev_feeds = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in feeds.items()}
    fns = {"inproc pageable": pageable, "inproc pinned": pinned_call, "inproc device": device_call,
           **{arm: (lambda s=s: s(feeds)) for arm, s in stages.items()}}
    if "xstage graph chunk 1MiB" in stages:
        fns["xstage graph chunk 1MiB"] = _with_chunk(fns["xstage graph chunk 1MiB"], 1 << 20)
    if "xstage graph slack 1us" in stages:
        fns["xstage graph slack 1us"] = _with_slack(fns["xstage graph slack 1us"], 1000)
    ref = {k: np.asarray(v) for k, v in stages["xstage graph"](feeds).items()}
    host_slots = stages["xstage graph"].input_slots()  # depth 1: one set, the same slots
    for k, v in feeds.items():
        np.copyto(host_slots[k], np.asarray(v))
    fns["xstage host in place"] = lambda s=stages["xstage graph"]: s(host_slots, views=True)
    for k, v in fns["xstage host in place"]().items():
        if not np.array_equal(np.asarray(v), ref[k]):
            say(f"  {name}: host in place output {k} differs from the graph's")
    if "xstage device" in stages:
        fns["xstage device"] = lambda s=stages["xstage device"]: s(dev_feeds)
        in_place = stages["xstage device"].device_inputs()  # depth 1: one set, the same slots
        for k, v in dev_feeds.items():
            in_place[k].copy_(v)
        torch.cuda.synchronize()
        fns["xstage in place"] = lambda s=stages["xstage device"]: s(in_place)
        got = {k: v.cpu().numpy() for k, v in fns["xstage device"]().items()}
        for k, v in ref.items():
            if not np.array_equal(got[k], v):
                say(f"  {name}: xstage device output {k} differs from the graph's by "
                    f"{float(np.max(np.abs(got[k] - v))):.3g}")
    for arm in [a for a in ("xstage old", "xstage eager", "xstage graph 1cpu",
                            "xstage graph no heads-up", "xstage graph unstreamed",
                            "xstage graph chunk 1MiB",
                            "xstage graph lead 0.3ms",
                            "xstage graph slack 1us") if a in stages]:
        got = stages[arm](feeds)
        for k, v in ref.items():
            if not np.array_equal(np.asarray(got[k]), v):
                say(f"  {name}: {arm} output {k} differs from the graph's by "
                    f"{float(np.max(np.abs(np.asarray(got[k]) - v))):.3g}")
    for fn in fns.values():  # warm every arm once more
        for _ in range(3):
            fn()
    times = {arm: [] for arm in ARMS if arm in fns}
    in_stage = [*stages, "xstage host in place",
                *(["xstage in place"] if "xstage device" in stages else [])]
    worker = {arm: [] for arm in in_stage}
    split = {arm: [] for arm in in_stage}
    gpu = []
    for _ in range(rounds):
        for arm in times:
            fn = fns[arm]
            for _ in range(calls):
                m0 = time.monotonic_ns()
                t0 = time.perf_counter_ns()
                fn()
                times[arm].append((time.perf_counter_ns() - t0) / 1e6)
                m1 = time.monotonic_ns()
                stage = stages.get(arm) or {
                    "xstage in place": stages.get("xstage device"),
                    "xstage host in place": stages["xstage graph"]}.get(arm)
                if stage is not None:
                    t = stage.last_timing
                    worker[arm].append(t.get("worker_ns", 0) / 1e6)
                    if t.get("published_ns") and t.get("start_ns") and t.get("end_ns"):
                        split[arm].append(_split(m0, t, m1))
        gpu.extend(gpu_ms() for _ in range(calls))
    row = {"stage": name, "gpu_ms": statistics.median(gpu), "calls": rounds * calls}
    for arm in ARMS:
        row[arm] = statistics.median(times[arm]) if arm in times else float("nan")
    for arm in [*XS_OPTIONS, "xstage host in place", "xstage in place"]:
        row[f"{arm} worker"] = statistics.median(worker[arm]) if worker.get(arm) else float("nan")
        if split.get(arm):
            row[f"{arm} split"] = {k: statistics.median(c[i] for c in split[arm])
                                   for i, k in enumerate(SPLIT)}
    for arm, s in stages.items():
        row[f"{arm} copies split"] = getattr(getattr(s._client, "_copies", None), "split", None)
        waits = s.waits()  # the doorbell's decisions on both sides, in words
        row[f"{arm} waits"] = {side: w.get("line") for side, w in waits.items()}
        rec = s.record()
        acc = rec["worker"].get("accelerator") or {}
        row[f"{arm} ledger"] = {
            "budget_over_measured": rec["ledger"].get("budget_over_measured"),
            "budget_bytes": rec["ledger"].get("budget_bytes"),
            "measured_peak_bytes": rec["ledger"].get("measured_peak_bytes"),
            "graph": (acc.get("cuda_graph") or {}).get("state"),
            "graph_pool_bytes": (acc.get("cuda_graph") or {}).get("pool_bytes"),
            "pinned": (acc.get("pinned_region") or {}).get("state"),
            "pinned_via": (acc.get("pinned_region") or {}).get("via"),
            "pinned_bytes": (acc.get("pinned_region") or {}).get("bytes"),
            "device_tensors": acc.get("device_tensors"),
            "eager_vs_replay_max_abs": (acc.get("cuda_graph") or {}).get("eager_vs_replay_max_abs"),
            "notes": rec["worker"].get("notes")}
        s.close()
    return row


_RESIDUE = r"""
import statistics, sys, time
import torch
mode = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(20)]).cuda()
x = torch.randn(64, 256, device="cuda")
def median_us():
    ts = []
    for _ in range(400):
        t0 = time.perf_counter()
        with torch.no_grad():
            m(x)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
before = median_us()
if mode.startswith("profiler"):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([] if mode == "profiler-cpu" else [ProfilerActivity.CUDA])
    with profile(activities=acts):
        with torch.no_grad():
            m(x)
        torch.cuda.synchronize()
elif mode == "dispatch-mode":
    from torch.utils._python_dispatch import TorchDispatchMode
    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Mode(), torch.no_grad():
        m(x)
after = median_us()
print("%-22s before %8.1f us   after %8.1f us   x%.2f" % (mode, before, after, after / before))
"""


def residue(say):
    """Does a profiled warm-up leave the process's later eager calls slower? 20 small Linears
    timed before and after one session, each mode in a fresh process."""
    import subprocess

    lines = []
    for mode, env in (("plain", {}), ("profiler-cuda", {}), ("profiler-cpu", {}),
                      ("profiler-cuda", {"TEARDOWN_CUPTI": "1"}), ("dispatch-mode", {})):
        done = subprocess.run([sys.executable, "-c", _RESIDUE, mode], capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=300)
        line = (done.stdout.strip() or done.stderr.strip()[-300:]) + (
            f"   ({' '.join(f'{k}={v}' for k, v in env.items())})" if env else "")
        say("  residue: " + line)
        lines.append(line)
    return lines


def table(rows):
    head = ("stage", "gpu ms", *[f"{a} ms" for a in ARMS], "graph/pageable", "graph/pinned",
            "eager/pageable", "graph 1cpu/pageable", "no heads-up/pageable",
            "host in place/pageable")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        base, pin = r["inproc pageable"], r["inproc pinned"]
        lines.append(" | ".join([r["stage"], f"{r['gpu_ms']:.3f}",
                                 *[f"{r[a]:.3f}" for a in ARMS],
                                 f"{r['xstage graph'] / base:.3f}", f"{r['xstage graph'] / pin:.3f}",
                                 f"{r['xstage eager'] / base:.3f}",
                                 f"{r['xstage graph 1cpu'] / base:.3f}",
                                 f"{r['xstage graph no heads-up'] / base:.3f}",
                                 f"{r['xstage host in place'] / base:.3f}"]))
    lines.append("")
    lines.append("stage | gpu ms | inproc device ms | arm | round trip ms | - gpu µs | "
                 "- inproc device µs | worker ms")
    lines.append("--- | --- | --- | --- | --- | --- | --- | ---")
    for r in rows:
        for arm in ("xstage device", "xstage in place"):
            lines.append(" | ".join([
                r["stage"], f"{r['gpu_ms']:.3f}", f"{r['inproc device']:.3f}", arm,
                f"{r[arm]:.3f}", f"{(r[arm] - r['gpu_ms']) * 1e3:.1f}",
                f"{(r[arm] - r['inproc device']) * 1e3:.1f}", f"{r[f'{arm} worker']:.3f}"]))
    lines.append("")
    lines.append("stage | " + " | ".join(f"{a} worker ms" for a in XS_OPTIONS)
                 + " | graph round trip - worker ms")
    lines.append(" | ".join("---" for _ in range(len(XS_OPTIONS) + 2)))
    for r in rows:
        lines.append(" | ".join([r["stage"], *[f"{r[f'{a} worker']:.3f}" for a in XS_OPTIONS],
                                 f"{r['xstage graph'] - r['xstage graph worker']:.3f}"]))
    lines.append("")
    lines.append("stage | arm | " + " | ".join(f"{k} µs" for k in SPLIT) + "  (medians)")
    lines.append(" | ".join("---" for _ in range(len(SPLIT) + 2)))
    for r in rows:
        for arm in [a for a in (*XS_OPTIONS, "xstage host in place", "xstage in place")
                    if f"{a} split" in r]:
            d = r[f"{arm} split"]
            lines.append(" | ".join([r["stage"], arm, *[f"{d[k]:.1f}" for k in SPLIT]]))
    lines.append("")
    lines.append("stage | arm | budget/measured | budget | measured | graph | pool | pinned (via)")
    lines.append("--- | --- | --- | --- | --- | --- | --- | ---")
    for r in rows:
        for arm in [a for a in XS_OPTIONS if f"{a} ledger" in r]:
            d = r[f"{arm} ledger"]
            ratio = d["budget_over_measured"]
            lines.append(" | ".join(str(x) for x in (
                r["stage"], arm, f"{ratio:.2f}" if ratio else "-",
                d["budget_bytes"], d["measured_peak_bytes"], d["graph"], d["graph_pool_bytes"],
                f"{d['pinned']} ({d['pinned_via']})")))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--tower", help="the tiny vision tower's .pt2 (manifest beside it)")
    parser.add_argument("--only", help="comma-separated stage names")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--arms", help="comma-separated xstage arms to open (default: all; "
                        "'xstage graph' always, as the reference)")
    parser.add_argument("--residue", action="store_true",
                        help="first: does a profiled warm-up slow the process's eager calls?")
    args = parser.parse_args(argv)
    import torch

    # The in-process arms compute as the worker does for an fp32 artifact (TF32 off: the
    # torch-cuda route's fp32_strict_note), so both sides run the same kernels.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on a GPU host", file=sys.stderr)
        return 1

    def say(text):
        print(text, file=sys.stderr, flush=True)

    say(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                    "gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count()}))
    rows = []
    found = residue(say) if args.residue else []
    with tempfile.TemporaryDirectory(prefix="xs-gpu-bench-") as tmp:
        paths = export_stages(torch, tmp)
        if args.tower:
            paths["tower-tiny"] = Path(args.tower)
        only = set(args.only.split(",")) if args.only else None
        for name, path in paths.items():
            if only and name not in only:
                continue
            try:
                rows.append(bench_stage(torch, name, path, args.rounds, args.calls, say,
                                        set(args.arms.split(",")) if args.arms else None))
                say(json.dumps(rows[-1], default=str))
            except Exception as exc:  # one stage's failure is reported, the others still run
                say(f"  {name}: {type(exc).__name__}: {exc}")
            say(f"  {name}: done")
    print(table(rows))
    if found:
        print("\nprofiler residue (eager call of 20 Linears, median of 400):")
        print("\n".join(found))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
