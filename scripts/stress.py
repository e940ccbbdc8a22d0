"""Stress xstage past what CI runs: frames into a live worker, calls with random
interrupts, concurrent opens across processes on one fresh home. Not in CI; the results and
the command are in docs/reliability.md.

    PYTHONPATH=src python3 scripts/stress.py                      # the full counts
    PYTHONPATH=src python3 scripts/stress.py --frames 2000 --calls 2000 --opens 8 --procs 2
    PYTHONPATH=src python3 scripts/stress.py --transport tcp --only frames --only calls

Five parts, on one fresh ``XSTAGE_HOME`` and ``TMPDIR`` (so leftovers are ours):

* ``frames``: a live ``ort-cpu`` worker (``WorkerClient``, inline frames) takes N frames:
  pings, runs checked against onnxruntime in this process, well-formed frames the worker must
  refuse with an ``error`` reply and stay up (unknown op, missing/extra/misnamed tensors, wrong
  dtype or shape, a missing graph), and ``--mutated`` byte-flipped frames, after each of which
  the worker must answer, close (fail closed), or wait for bytes it was promised (then the
  deadline kills it); a closed or killed worker is replaced. Hostile frames go through the
  client's socket: the one place this script reaches past the public API.
  With ``--transport tcp`` the worker connects back over TCP and every frame travels in
  authenticated records; a byte-flipped record must then never be answered.
* ``calls``: a stage from ``open_stage`` takes N calls with fresh random inputs, each output
  checked against onnxruntime in this process; about ``--interrupt-rate`` of them get a SIGINT
  at a random moment. A wrong output (a stale reply) is counted, never tolerated silently; a
  stage that closes itself (``StageClosed``, ``WorkerError``) is reopened and counted. With
  ``--transport tcp``, a ``WorkerClient`` over the TCP connect-back instead (no shared region).
* ``opens``: ``--procs`` processes, ``--opens`` threads in all, released together on a fresh
  home, each ``open_stage`` of the built-in stage (first use of every cached thing), one call,
  close. Each must end placed, refused (its cause), or a timeout or error naming its cause.
* ``fork``: ``--forks`` children forked from a process that keeps calling its stage; each must
  be refused the parent's stage (``ForkedStage``) and serve ``--fork-calls`` checked calls from
  a worker of its own, while the parent's checked calls go on.
* ``threads``: ``--threads`` threads share one stage at depth 4 for ``--thread-calls`` checked
  calls (sync, ``submit().result()``, and windows of futures filled from one reused buffer).

After all parts: no process left that this run started, no descriptor more than at the start,
no ``/dev/shm/xstage-*`` name from our processes, no ``xstage-profile-*`` folder in our TMPDIR,
and the caches whole (built-in graph, staged worker package, probes, every record valid).
Prints one JSON document; exit 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_children: list[int] = []
SRC = HERE.parent / "src"


def _tiny_graph(folder: Path) -> Path:
    from xstage import builtin_graphs

    return builtin_graphs.write(builtin_graphs.mlp(width=16, depth=2, batch=2, seed=3),
                                folder / "tiny.onnx")


def _reference(graph: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def _close_match(got, want) -> bool:
    return len(got) == len(want) and all(
        np.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want, strict=True))


# ---------------------------------------------------------------------------- frames


def _hostile(rng: random.Random, x: np.ndarray):
    """A well-formed frame the worker must refuse with an ``error`` reply: (kind, header, arrays).

    (A frame the wire itself rejects is refused by the client's own encoder before it leaves,
    so those reach the worker only as ``--mutated`` bytes: with binary call frames a tensor
    name the loaded stage lacks is one, counted as refused by the client, the client kept.)
    """
    kind = rng.choice(["misnamed", "extra", "dtype", "shape", "missing_graph"])
    if kind == "misnamed":
        return kind, {"op": "run"}, {"y": x}
    if kind == "extra":
        return kind, {"op": "run"}, {"x": x, "z": x}
    if kind == "dtype":
        return kind, {"op": "run"}, {"x": x.astype(np.float64)}
    if kind == "shape":
        return kind, {"op": "run"}, {"x": np.zeros((3, 16), np.float32)}
    return kind, {"op": "load", "runtime": "ort", "path": "/nonexistent/g.onnx", "options": {}}, None


class _Capture:
    """Stands in for the channel's socket while a frame is sealed: keeps the record bytes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data) -> None:  # type: ignore[no-untyped-def]
        self.data += bytes(data)

    def sendmsg(self, buffers) -> int:  # type: ignore[no-untyped-def]
        n = len(self.data)
        for b in buffers:
            self.data += bytes(b)
        return len(self.data) - n


def _mutated_bytes(client, x: np.ndarray, rid: int) -> bytearray:  # type: ignore[no-untyped-def]
    """A run frame as this client would send it: plain, or sealed records on the TCP channel
    (the channel's counter advances, as for a frame really sent)."""
    from xstage_remote import wire

    parts = wire.encode_frame(wire.with_generation({"op": "run", "id": rid}, client.generation),
                              {"x": x})
    channel = client._channel
    if channel is None:
        return bytearray(b"".join(bytes(p) for p in parts))
    real, tap = channel.sock, _Capture()
    channel.sock = tap
    try:
        channel.send_parts(parts)
    finally:
        channel.sock = real
    return tap.data


def _frames(n: int, mutated: int, graph: Path, seed: int, transport: str = "local") -> dict:
    from xstage import Deadlines, WorkerClient, errors

    rng = random.Random(seed)
    ref = _reference(graph)
    counts: collections.Counter[str] = collections.Counter()
    wrong = 0
    mutate_at = set(rng.sample(range(n), min(mutated, n)))

    def fresh() -> WorkerClient:
        client = WorkerClient(sys.executable, route="ort-cpu", shm_mode="off", transport=transport,
                              deadlines=Deadlines(call=5.0, load=60.0))
        client.start()
        client.load(graph)
        return client

    client = fresh()
    restarts = 0
    for i in range(n):
        x = np.asarray(rng.random() * np.ones((2, 16)), np.float32) + np.float32(i % 7)
        try:
            if i in mutate_at:
                data = _mutated_bytes(client, x, 10**9 + i)
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                client._ctl.sendall(bytes(data))
                try:
                    client._recv("call", 2.0)
                    client.ping()  # still in step?
                    counts["mutated: answered"] += 1
                except errors.CallTimeout:
                    counts["mutated: worker waited for promised bytes (killed at the deadline)"] += 1
                except errors.WorkerDied as exc:
                    check = next((c for c in ("mac", "replay", "reorder") if f"({c})" in exc.log_tail),
                                 None)
                    counts["mutated: worker closed (fail closed)"
                           + (f", its log names the check ({check})" if check else "")] += 1
                except errors.ProtocolError as exc:
                    counts[f"mutated: protocol error ({str(exc).split(':')[-1].strip()[:40]})"] += 1
                except errors.WorkerRaised:
                    counts["mutated: answered with an error"] += 1
                if client.state.value != "ready":
                    client.close()
                    client = fresh()
                    restarts += 1
                continue
            r = rng.random()
            if r < 0.3:
                client.ping()
                counts["ping"] += 1
            elif r < 0.6:
                got = client.run({"x": x})
                counts["run"] += 1
                if not _close_match(list(got.values()), ref({"x": x})):
                    wrong += 1
            else:
                kind, header, arrays = _hostile(rng, x)
                rid = client._take_id()
                try:
                    client._send(dict(header, id=rid), arrays)
                except errors.LocalProtocolError:  # the client's encoder refused it: not sent
                    counts[f"hostile {kind}: refused by the client, never sent"] += 1
                    continue
                frame = client._recv("call", 5.0)
                counts[f"hostile {kind}: {frame.op}"] += 1
                if kind == "missing_graph":  # the failed load must not unload the good one
                    client.load(graph)
        except errors.XstageError as exc:
            counts[f"unexpected {type(exc).__name__}: {exc.message[:80]}"] += 1
            client.close()
            client = fresh()
            restarts += 1
    client.close()
    return {"frames": n, "mutated": len(mutate_at), "transport": transport,
            "outcomes": dict(sorted(counts.items())), "wrong_outputs": wrong,
            "worker_restarts": restarts}


# ---------------------------------------------------------------------------- calls


class _TcpStage:
    """A worker over the TCP connect-back (authenticated records), called like a Stage."""

    def __init__(self, graph: Path, deadlines) -> None:  # type: ignore[no-untyped-def]
        from xstage import WorkerClient

        self.client = WorkerClient(sys.executable, route="ort-cpu", shm_mode="off",
                                   transport="tcp", deadlines=deadlines)
        self.client.start()
        self.client.load(graph)

    def __call__(self, feeds):  # type: ignore[no-untyped-def]
        return self.client.run(feeds)

    def close(self) -> None:
        self.client.close()


def _calls(n: int, rate: float, graph: Path, seed: int, transport: str = "local") -> dict:
    from xstage import Deadlines, errors, open_stage

    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    ref = _reference(graph)
    counts: collections.Counter[str] = collections.Counter()
    deadlines = Deadlines(call=10.0)

    def open_():  # type: ignore[no-untyped-def]
        if transport == "tcp":
            return _TcpStage(graph, deadlines)
        return open_stage(graph, route="ort-cpu", deadlines=deadlines)

    stage = open_()
    main = threading.get_ident()
    timer: threading.Timer | None = None
    reopened = 0

    def settle() -> None:
        """The call's timer has fired or never will; a SIGINT it sent late is taken here."""
        nonlocal timer
        while timer is not None:
            try:
                timer.join()
                timer = None
            except KeyboardInterrupt:
                pass
    for _ in range(n):
        checked = False
        try:
            x = nrng.standard_normal((2, 16)).astype(np.float32)
            if rng.random() < rate:
                timer = threading.Timer(rng.uniform(0, 300e-6),
                                        lambda: signal.pthread_kill(main, signal.SIGINT))
                timer.start()
            got = stage({"x": x})
            if _close_match(list(got.values()), ref({"x": x})):
                counts["right"] += 1
            else:
                counts["WRONG (a stale or altered output)"] += 1
            checked = True
            if timer is not None:
                timer.join()
                timer = None
        except KeyboardInterrupt:  # after the check: that call was counted above
            counts["interrupted after the call returned" if checked else "interrupted in the call"] += 1
            if timer is not None:
                timer.join()
                timer = None
        except (errors.StageClosed, errors.WorkerError) as exc:
            counts[f"stage closed itself: {type(exc).__name__}"] += 1
            settle()  # not into the reopening: an interrupt there is not a call's
            stage.close()
            stage = open_()
            reopened += 1
        except errors.XstageError as exc:
            counts[f"error {type(exc).__name__}: {exc.message[:80]}"] += 1
    try:
        stage.close()
    except KeyboardInterrupt:
        stage.close()
    return {"calls": n, "interrupt_rate": rate, "transport": transport,
            "outcomes": dict(sorted(counts.items())), "reopened": reopened}


# ---------------------------------------------------------------------------- fork


def _forks(n: int, calls: int, graph: Path, seed: int) -> dict:
    """``n`` children forked from a process that keeps calling its stage (depth 2) meanwhile.

    Each child must be refused the parent's stage (``ForkedStage``: a call, a ``submit``; its
    ``close()`` a no-op), then serve ``calls`` checked calls from a ``WorkerClient`` of its own
    (docs/serving.md, "Processes"). The parent's calls while the children run, and after, are
    checked too; a child reports through its exit status (0: all as expected).
    """
    from xstage import Deadlines, WorkerClient, errors, open_stage

    ref = _reference(graph)
    nrng = np.random.default_rng(seed)
    counts: collections.Counter[str] = collections.Counter()
    stage = open_stage(graph, route="ort-cpu", depth=2, deadlines=Deadlines(call=60.0))

    def parent_call(i: int) -> None:
        x = nrng.standard_normal((2, 16)).astype(np.float32)
        got = stage({"x": x}) if i % 2 else stage.submit({"x": x}).result(timeout=120)
        counts["parent right" if _close_match(list(got.values()), ref({"x": x}))
               else "WRONG in the parent"] += 1

    for round_ in range(n):
        parent_call(0)
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's stage may work or be touched
            code = 0
            try:
                try:
                    stage({"x": np.zeros((2, 16), np.float32)})
                    code |= 2  # the parent's stage answered a child
                except errors.ForkedStage:
                    pass
                try:
                    stage.submit({"x": np.zeros((2, 16), np.float32)})
                    code |= 2
                except errors.ForkedStage:
                    pass
                stage.close()  # a no-op here: the parent's worker serves on
                crng = np.random.default_rng(seed * 1000 + round_)
                with WorkerClient(sys.executable, route="ort-cpu") as own:
                    own.load(graph)
                    for _ in range(calls):
                        x = crng.standard_normal((2, 16)).astype(np.float32)
                        if not _close_match(list(own.run({"x": x}).values()), ref({"x": x})):
                            code |= 4
            except BaseException:  # noqa: BLE001 - the exit status says it
                code |= 8
            os._exit(code)
        _children.append(pid)
        for i in range(calls):  # the parent calls while the child runs
            parent_call(i)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        counts["child as expected" if code == 0 else f"CHILD FAILED (status {code})"] += 1
    for i in range(calls):
        parent_call(i)
    stage.close()
    return {"forks": n, "calls_each": calls, "outcomes": dict(sorted(counts.items()))}


# ---------------------------------------------------------------------------- threads


def _threads(n: int, threads: int, graph: Path, seed: int) -> dict:
    """``threads`` threads share one stage at depth 4, ``n`` calls in all, each checked.

    Each thread mixes synchronous calls, ``submit().result()``, and a window of futures
    collected in order; a buffer each thread reuses is refilled as soon as ``submit`` returns
    (a request reads its inputs before ``submit`` returns: docs/serving.md).
    """
    from xstage import Deadlines, open_stage

    ref = _reference(graph)
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stage = open_stage(graph, route="ort-cpu", depth=4, deadlines=Deadlines(call=60.0))

    def worker(k: int) -> None:
        try:
            serve(k)
        except Exception as exc:  # noqa: BLE001 - counted: the verdict fails on it
            with lock:
                counts[f"THREAD FAILED: {type(exc).__name__}: {str(exc)[:80]}"] += 1

    def serve(k: int) -> None:
        rng = np.random.default_rng(seed * 100 + k)
        buf = np.empty((2, 16), np.float32)
        local: collections.Counter[str] = collections.Counter()
        done = 0
        while done < n // threads:
            way = done % 3
            if way == 2:  # a window of four futures from one reused buffer
                sent = []
                for _ in range(4):
                    buf[...] = rng.standard_normal((2, 16))
                    sent.append((buf.copy(), stage.submit({"x": buf})))
                pairs = [(x, f.result(timeout=120)) for x, f in sent]
                done += 4
            else:
                x = rng.standard_normal((2, 16)).astype(np.float32)
                got = stage({"x": x}) if way == 0 else stage.submit({"x": x}).result(timeout=120)
                pairs = [(x, got)]
                done += 1
            for x, got in pairs:
                local["right" if _close_match(list(got.values()), ref({"x": x}))
                      else "WRONG (another request's output)"] += 1
        with lock:
            counts.update(local)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stage.close()
    return {"calls": n, "threads": threads, "outcomes": dict(sorted(counts.items()))}


# ---------------------------------------------------------------------------- opens


def _opener(barrier: Path, threads: int) -> None:
    """One of the ``opens`` processes: ``threads`` opens of the built-in stage, released together."""
    from xstage import Deadlines, Refused, errors, open_stage
    from xstage.builtin_graphs import builtin_stage

    gate = threading.Barrier(threads)
    lines: list[str] = []

    def one() -> None:
        gate.wait()
        while not (barrier / "go").exists():
            time.sleep(0.001)
        try:
            with open_stage(builtin_stage(), route="ort-cpu", deadlines=Deadlines(
                    spawn=120, hello=120, load=300, warmup=300, call=120, shutdown=10)) as stage:
                stage(stage.inputs)
            lines.append("placed")
        except Refused as exc:
            lines.append("refused: " + ", ".join(sorted({f"{r.code.value}/{r.cause}" for r in exc.refusals})))
        except errors.WorkerTimeout as exc:
            lines.append(f"timeout: {type(exc).__name__}")
        except errors.XstageError as exc:
            lines.append(f"error: {type(exc).__name__}: {exc.message[:100]}")
        except Exception as exc:  # counted as a failure of the run: a bug, not a named cause
            lines.append(f"UNNAMED {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=one) for _ in range(threads)]
    (barrier / f"ready-{os.getpid()}").write_text("")
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print(json.dumps(lines))


def _opens(total: int, procs: int, timeout: float) -> dict:
    barrier = Path(tempfile.mkdtemp(prefix="barrier-"))
    shares = [total // procs + (1 if i < total % procs else 0) for i in range(procs)]
    children = [subprocess.Popen([sys.executable, __file__, "--_opener", str(barrier), str(k)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for k in shares if k]
    _children.extend(c.pid for c in children)
    until = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < len(children) and time.monotonic() < until:
        time.sleep(0.01)
    time.sleep(0.5)  # every thread at its gate
    started = time.monotonic()
    (barrier / "go").write_text("")
    outcomes: collections.Counter[str] = collections.Counter()
    tracebacks = 0
    for child in children:
        try:
            out, err = child.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
            outcomes.update(json.loads(out.strip().splitlines()[-1]) if out.strip() else [
                f"process ended {child.returncode} without a result"])
            tracebacks += err.count("Traceback")
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            outcomes["process killed at the script's timeout"] += 1
    return {"opens": total, "processes": len(children), "outcomes": dict(sorted(outcomes.items())),
            "tracebacks": tracebacks, "seconds": round(time.monotonic() - started, 1)}


# ---------------------------------------------------------------------------- leaks and caches


def _ours(home: Path) -> list[int]:
    """Processes alive now whose environment names this run's home (workers, openers)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get("XSTAGE_HOME", "").startswith(str(home)):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _fds() -> dict[str, str]:
    """This process's open descriptors and what each points at."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return out


def _caches(home: Path) -> dict:
    import onnx

    import xstage_remote
    from xstage.record import read_record

    problems = []
    for graph in (home / "cache" / "builtin").glob("*.onnx"):
        try:
            onnx.checker.check_model(onnx.load(str(graph)))
        except Exception as exc:
            problems.append(f"{graph.name}: {exc}")
    src = Path(xstage_remote.__file__).parent
    for root in (home / "cache" / "remote").glob("[!.]*"):
        for f in src.rglob("*.py"):
            if (root / "xstage_remote" / f.relative_to(src)).read_bytes() != f.read_bytes():
                problems.append(f"staged {f.name} differs")
    for probe in (home / "cache" / "probes").glob("*.json"):
        try:
            json.loads(probe.read_text())
        except ValueError as exc:
            problems.append(f"probe {probe.name}: {exc}")
    records = list((home / "records").glob("*.json"))
    for rec in records:
        try:
            read_record(rec)
        except Exception as exc:
            problems.append(f"record {rec.name}: {exc}")
    temps = [p.name for p in home.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".stage-")]
    return {"problems": problems + [f"temp file left: {t}" for t in temps], "records": len(records)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--mutated", type=int, default=200, help="byte-flipped frames among them")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--interrupt-rate", type=float, default=0.01)
    parser.add_argument("--opens", type=int, default=100)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--opens-timeout", type=float, default=1200.0)
    parser.add_argument("--forks", type=int, default=20, help="children forked (fork round)")
    parser.add_argument("--fork-calls", type=int, default=200,
                        help="calls by each child, and by the parent while each one runs")
    parser.add_argument("--thread-calls", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--only", choices=["frames", "calls", "opens", "fork", "threads"],
                        action="append")
    parser.add_argument("--transport", choices=["local", "tcp"], default="local",
                        help="frames and calls over the socketpair (local: calls through the "
                             "shared region) or the TCP connect-back's authenticated records")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's scratch folder (home, TMPDIR) and print its path")
    parser.add_argument("--_opener", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._opener:
        _opener(Path(args._opener[0]), int(args._opener[1]))
        return 0
    parts = args.only or ["frames", "calls", "opens", "fork", "threads"]
    scratch = Path(tempfile.mkdtemp(prefix="xstage-stress-"))
    home, tmp = scratch / "home", scratch / "tmp"
    tmp.mkdir()
    os.environ.update(XSTAGE_HOME=str(home), TMPDIR=str(tmp))
    tempfile.tempdir = None
    graph = _tiny_graph(scratch)
    _reference(graph)({"x": np.zeros((2, 16), np.float32)})  # onnxruntime's own files, opened once
    from xstage_remote import shm

    shm.read_load()  # the wait policy's /proc/loadavg: one descriptor kept for the process's life
    fds0 = _fds()
    report: dict = {"command": " ".join(["scripts/stress.py", *(argv or sys.argv[1:])]),
                    "cpus": os.cpu_count()}
    pids_seen = {os.getpid()}  # and the openers, once started (_children)
    for part in parts:
        started = time.monotonic()
        if part == "frames":
            report["frames"] = _frames(args.frames, args.mutated, graph, args.seed, args.transport)
        elif part == "calls":
            report["calls"] = _calls(args.calls, args.interrupt_rate, graph, args.seed,
                                     args.transport)
        elif part == "fork":
            report["fork"] = _forks(args.forks, args.fork_calls, graph, args.seed)
        elif part == "threads":
            report["threads"] = _threads(args.thread_calls, args.threads, graph, args.seed)
        else:
            report["opens"] = _opens(args.opens, args.procs, args.opens_timeout)
        report[part]["seconds"] = round(time.monotonic() - started, 1)
    time.sleep(1.0)  # workers told to leave are given their shutdown deadline
    ours = pids_seen | set(_children)
    shm_left = [p.name for p in Path("/dev/shm").glob("xstage-*") if int(p.name.split("-")[1]) in ours]
    report["leaks"] = {
        "processes": _ours(scratch),
        "descriptors": sorted(set(_fds().items()) - set(fds0.items())),
        "dev_shm_names": shm_left,
        "profile_temp_folders": sorted(p.name for p in tmp.glob("xstage-profile-*")),
    }
    report["caches"] = _caches(home)
    bad = (report["leaks"]["processes"] or report["leaks"]["descriptors"]
           or report["leaks"]["dev_shm_names"] or report["leaks"]["profile_temp_folders"]
           or report["caches"]["problems"]
           or report.get("frames", {}).get("wrong_outputs")
           or (args.transport == "tcp" and any(  # a changed record must never be acted on
               k.startswith("mutated: answered") for k in report.get("frames", {}).get("outcomes", {})))
           or any("WRONG" in k for k in report.get("calls", {}).get("outcomes", {}))
           or any(("WRONG" in k or "FAILED" in k) for part in ("fork", "threads")
                  for k in report.get(part, {}).get("outcomes", {}))
           or any(k.startswith(("UNNAMED", "process")) for k in report.get("opens", {}).get("outcomes", {}))
           or report.get("opens", {}).get("tracebacks"))
    report["verdict"] = "fail" if bad else "pass"
    if args.keep:
        report["scratch"] = str(scratch)
    else:  # its own folder: home, TMPDIR, graph (what leaked into it was counted above)
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
