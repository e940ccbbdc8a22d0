"""Fault injection for issue 13's client side: request identity, byte order, deadlines.

* An interrupted call (SIGINT mid-call) on each transport and size is repaired — the next
  call discards the stale reply and answers its own request — or the stage is closed with
  ``StageClosed`` saying why; never the interrupted call's outputs.
* Big-endian inputs convert at the boundary; every dtype numpy can express converts or is
  refused by name.
* A stopped worker (SIGSTOP) cannot hold the caller past a deadline, sending included; a
  killed one (SIGKILL) is reported, at each phase.
* Malformed region descriptors and tables are ``ProtocolError``; a missing ``attach``
  descriptor does not hold the worker; ``close()`` from another thread ends a call in flight.

Everything that could hang runs in a subprocess or a thread with a hard timeout; nothing
asserts on wall-clock time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from tests.client.conftest import in_thread
from xstage import builtin_graphs, errors
from xstage.artifact import IOSpec
from xstage.client import Deadlines, WorkerClient, WorkerState
from xstage.inputs import synthesize
from xstage.signature import check_inputs
from xstage_remote import shm, wire

HARD_TIMEOUT = 120  # seconds a scenario may take before it counts as hung


def tagged_slow_graph(rows: int, n: int = 1024, depth: int = 60) -> onnx.ModelProto:
    """``y = x`` (rows x 1024 float32) and ``z``, about a second of MatMul seeded by ``x`` (60
    MatMuls of 1024 x 1024: ~1 s of CPU on this 2-core VM, ten times the 0.1 s after which the
    interrupt lands; a call too short to interrupt fails the test, it does not pass it).

    The slow branch depends on ``x`` (so nothing is folded away) while ``x`` keeps the size
    under test: 256 rows are 1 MiB, 4 rows 16 KiB.
    """
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array((rng.standard_normal((n, n)) / n).astype(np.float32), "w")
    zero = onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero")
    one = onnx.numpy_helper.from_array(np.ones((), np.float32), "one")
    size = onnx.numpy_helper.from_array(np.array([n, n], np.int64), "size")
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "zero"], ["s0"]),
        helper.make_node("Add", ["s0", "one"], ["s1"]),
        helper.make_node("Expand", ["s1", "size"], ["m"]),
    ]
    prev = "m"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"]))
        prev = f"m{i}"
    nodes.append(helper.make_node("ReduceSum", [prev], ["z"], keepdims=0))
    graph = helper.make_graph(
        nodes, "tagged_slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 1024]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])],
        [w, zero, one, size])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


_INTERRUPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import numpy as np
    import psutil
    from xstage import errors
    from xstage.client import WorkerClient
    path, shm_mode, rows, then = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    def idle(pid):
        # The interrupted call has finished when the worker stops using CPU.
        proc, last = psutil.Process(pid), -1.0
        for _ in range(200):
            used = sum(proc.cpu_times()[:2])
            if used - last < 0.01:
                return
            last = used
            time.sleep(0.3)

    a = np.full((rows, 1024), 1.0, np.float32)
    b = np.full((rows, 1024), 2.0, np.float32)
    w = WorkerClient(sys.executable, shm_mode=shm_mode)
    w.start()
    w.load(path)
    w.run({"x": b})  # warm: the interrupt lands in a real call, not in a first-run compile
    idle(w.pid)
    proc = psutil.Process(w.pid)
    base = sum(proc.cpu_times()[:2])

    def interrupt():
        # SIGINT once the worker is computing call A (the call lasts ~1 s of CPU), like Ctrl-C.
        while sum(proc.cpu_times()[:2]) - base < 0.1:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        w.run({"x": a})
        outcome = {"outcome": "not-interrupted"}
    except KeyboardInterrupt:
        if then == "when-idle":
            idle(w.pid)
        try:
            y = w.run({"x": b})["y"]
            if np.array_equal(y, b):
                outcome = {"outcome": "repaired"}
            elif np.array_equal(y, a):
                outcome = {"outcome": "stale"}
            else:
                outcome = {"outcome": "wrong"}
        except errors.StageClosed as exc:
            outcome = {"outcome": "closed", "message": str(exc)}
        except Exception as exc:
            outcome = {"outcome": "error", "message": "%s: %s" % (type(exc).__name__, exc)}
    print(json.dumps(outcome), flush=True)
    w.close()
    """
)


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("tagged")
    return {rows: builtin_graphs.write(tagged_slow_graph(rows), root / f"tagged{rows}.onnx")
            for rows in (4, 256)}


@pytest.mark.parametrize("then", ["at-once", "when-idle"])
@pytest.mark.parametrize("rows", [256, 4], ids=["1MiB", "16KiB"])
@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_an_interrupted_call_never_poisons_the_next(tagged, shm_mode, rows, then):
    """Defect 1: SIGINT mid-call, then a call with new inputs (at once, or once the worker
    has finished the interrupted one): its own outputs or StageClosed, never the old ones."""
    try:
        done = subprocess.run([sys.executable, "-c", _INTERRUPT, str(tagged[rows]), shm_mode,
                               str(rows), then], capture_output=True, text=True,
                              timeout=HARD_TIMEOUT, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the call after the interrupt hung for {HARD_TIMEOUT}s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    result = json.loads(lines[-1])
    assert result["outcome"] in ("repaired", "closed"), result
    if result["outcome"] == "closed":
        assert "interrupted" in result["message"], result


# ------------------------------------------------------------------ request identity

def test_a_reply_of_another_generation_is_refused(graphs):
    """The client accepts a reply only from its worker's generation."""
    with WorkerClient(sys.executable, shm_mode="off", generation=3) as w:
        assert w.hello is not None and w.hello["gen"] == 3
        w.load(graphs["mlp"])
        rid = w._take_id()
        w._send({"op": "ping", "id": rid})
        w.generation = 4  # the reply now comes from what is, to this client, another generation
        with pytest.raises(errors.RemoteProtocolError, match="carries gen 3"):
            w._expect(w._recv("call", 60), "pong", rid)
        assert w.state is WorkerState.DEAD


def test_a_request_of_another_generation_ends_the_worker(graphs):
    """The worker refuses a request meant for another generation (fail closed)."""
    with WorkerClient(sys.executable, shm_mode="off") as w:
        w.load(graphs["mlp"])
        assert w._ctl is not None
        wire.send_frame(w._ctl, {"op": "ping", "id": 999, "gen": 2})
        with pytest.raises(errors.WorkerDied, match="status 65"):
            w.ping()


def test_a_region_of_another_generation_is_refused():
    slots, size = shm.plan_layout([("x", "float32", 64)], [("y", "float32", 64)])
    region = shm.Region.create(size, slots, "memfd", generation=1)
    try:
        fd = os.dup(region.fd)
        with pytest.raises(wire.ProtocolError, match="generation 1, this worker is generation 2"):
            shm.Region.attach(fd, size, slots, generation=2)
    finally:
        region.close()


def test_request_ids_never_repeat_across_transports(graphs):
    """Ids come from one counter per stage: inline calls, region calls and control frames."""
    with WorkerClient(sys.executable) as w:
        w.load(graphs["mlp"])
        x = {"x": np.ones((8, 256), np.float32)}
        seen = []
        for _ in range(3):
            w.run(x)
            assert w._region is not None
            seen.append(w._region.resp_id())
            w.ping()
        assert len(set(seen)) == 3 and seen == sorted(seen)


def test_gen_field_is_checked_by_the_wire():
    for bad in (0, -1, 1 << 32, "1", True, 1.0):
        with pytest.raises(wire.ProtocolError, match="gen"):
            wire.validate_header({"op": "ping", "id": 1, "gen": bad})
    assert wire.validate_header({"op": "ping", "id": 1, "gen": (1 << 32) - 1}) == "ping"


# ------------------------------------------------------------------ byte order

@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_big_endian_inputs_compute_right(graphs, shm_mode):
    """Defect 3: a ``>f4`` input gives the same outputs as its little-endian twin."""
    from tests.client.conftest import IDENTITY_IO, identity_inputs

    feeds = identity_inputs(1)
    swapped = {n: a.astype(a.dtype.newbyteorder(">")) if a.dtype.itemsize > 1 else a
               for n, a in feeds.items()}
    assert any(a.dtype.byteorder == ">" for a in swapped.values())
    with WorkerClient(sys.executable, shm_mode=shm_mode) as w:
        w.load(graphs["identity"])
        want = w.run(feeds)
        got = w.run(swapped)
    assert len(IDENTITY_IO) == len(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name])


def test_big_endian_inputs_reach_both_arms_converted(graphs):
    """The API: open_stage's gate and calls see the same values as little-endian inputs."""
    from xstage import open_stage

    x = np.random.default_rng(0).standard_normal((8, 256)).astype(">f4")
    with open_stage(graphs["mlp"], route="ort-cpu", inputs={"x": x}) as stage:
        got = stage({"x": x})
        want = stage({"x": x.astype("<f4")})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_every_numpy_dtype_converts_or_is_refused_by_name():
    declared = [IOSpec(name="x", dtype="float32", shape=[2])]
    for dtype in sorted({np.dtype(t) for t in np.sctypeDict.values()}, key=str):
        for order in ("<", ">"):
            try:
                dt = dtype.newbyteorder(order)
            except (TypeError, ValueError):
                dt = dtype
            arr = np.zeros(2, dt)
            try:
                out = check_inputs({"x": arr}, declared)
            except errors.InputError as exc:
                assert "'x'" in str(exc) and "float32" in str(exc)
                continue
            assert out["x"].dtype == np.dtype("<f4"), dt


# ------------------------------------------------------------------ deadlines

def _in_thread(fn):
    return in_thread(fn, HARD_TIMEOUT)


@pytest.mark.parametrize("shm_mode", ["auto", "off", "tcp"], ids=["region", "socket", "tcp"])
def test_a_stopped_worker_cannot_hold_a_large_send(graphs, shm_mode):
    """Defect 4: SIGSTOP, then an input far larger than the socket buffer: CallTimeout."""
    transport = "tcp" if shm_mode == "tcp" else "local"
    w = WorkerClient(sys.executable, shm_mode="off" if shm_mode == "tcp" else shm_mode,
                     transport=transport, deadlines=Deadlines(call=2))
    w.start()
    w.load(graphs["slow"])
    pid = w.pid
    os.kill(pid, signal.SIGSTOP)
    exc = _in_thread(lambda: w.run({"x": np.ones((1536, 1536), np.float32)}))
    assert isinstance(exc, errors.CallTimeout), exc
    assert w.state is WorkerState.DEAD
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    w.close()


@pytest.mark.parametrize("phase", ["load", "call", "warmup", "ping", "shutdown"])
def test_sigstop_at_each_phase_ends_in_its_timeout(graphs, phase):
    w = WorkerClient(sys.executable, deadlines=Deadlines(load=2, call=2, warmup=2, shutdown=2))
    w.start()
    if phase != "load":
        w.load(graphs["mlp"])
    assert w.loaded is not None or phase == "load"
    pid = w.pid
    os.kill(pid, signal.SIGSTOP)
    x = {"x": np.ones((8, 256), np.float32)}
    action = {
        "load": lambda: w.load(graphs["mlp"]),
        "call": lambda: w.run(x),
        "warmup": lambda: w.run(x, phase="warmup"),
        "ping": w.ping,
        "shutdown": w.close,
    }[phase]
    exc = _in_thread(action)
    expected = {"load": errors.LoadTimeout, "call": errors.CallTimeout,
                "warmup": errors.WarmupTimeout, "ping": errors.CallTimeout, "shutdown": None}
    if expected[phase] is None:
        assert exc is None and w.state is WorkerState.CLOSED
    else:
        assert isinstance(exc, expected[phase]), exc
        assert w.state is WorkerState.DEAD
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    w.close()


@pytest.mark.parametrize("phase", ["load", "call", "ping", "shutdown"])
def test_sigkill_at_each_phase_is_reported(graphs, phase):
    w = WorkerClient(sys.executable)
    w.start()
    if phase != "load":
        w.load(graphs["mlp"])
    os.kill(w.pid, signal.SIGKILL)
    x = {"x": np.ones((8, 256), np.float32)}
    action = {"load": lambda: w.load(graphs["mlp"]), "call": lambda: w.run(x),
              "ping": w.ping, "shutdown": w.close}[phase]
    exc = _in_thread(action)
    if phase == "shutdown":
        assert exc is None and w.state is WorkerState.CLOSED
    else:
        assert isinstance(exc, errors.WorkerDied), exc
        assert "SIGKILL" in str(exc)
    w.close()


def test_timeout_flag_parses_into_deadlines():
    from xstage.client.deadlines import parse_timeouts

    d = parse_timeouts(["call=3", "warmup=0.5"])
    assert d is not None and d.call == 3 and d.warmup == 0.5 and d.load == Deadlines().load
    assert parse_timeouts([]) is None
    for bad, message in [("call", "PHASE=SECONDS"), ("compile=3", "unknown phase"),
                         ("call=0", "> 0"), ("call=nan", "> 0"), ("call=x", "> 0"),
                         ("call=inf", "> 0")]:
        with pytest.raises(errors.UsageError, match=message):
            parse_timeouts([bad])
    with pytest.raises(errors.UsageError, match="twice"):
        parse_timeouts(["call=1", "call=2"])


def test_cli_timeout_is_a_usage_error_when_malformed():
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--timeout", "call=-1"],
                          capture_output=True, text=True, timeout=HARD_TIMEOUT,
                          env=dict(os.environ))
    assert done.returncode == 64, done.stderr
    assert "Traceback" not in done.stderr and "--timeout call" in done.stderr


def test_cli_call_timeout_kills_a_hung_warmup(tmp_path):
    """``--timeout warmup=S``: a warm-up past it ends in a WarmupTimeout, not 30 minutes."""
    path = builtin_graphs.write(tagged_slow_graph(4, depth=400), tmp_path / "slow.onnx")
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(path),
                           "--route", "ort-cpu", "--timeout", "warmup=1", "--runs", "1",
                           "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=HARD_TIMEOUT,
                          env=dict(os.environ))
    assert done.returncode in (1, 2), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "warmup" in (done.stdout + done.stderr).lower()


# ------------------------------------------------------------------ point 6

def test_close_from_another_thread_ends_a_call_in_flight(graphs):
    w = WorkerClient(sys.executable)
    w.start()
    w.load(graphs["slow"])
    pid = w.pid
    started = threading.Event()

    def call():
        started.set()
        w.run({"x": np.ones((1536, 1536), np.float32)})

    threading.Timer(0.5, w.close).start()
    exc = _in_thread(call)
    assert started.is_set()
    assert isinstance(exc, errors.StageClosed), exc
    assert "close() was called from another thread" in str(exc)
    _in_thread(lambda: None)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_attach_without_its_descriptor_does_not_hold_the_worker(graphs, monkeypatch):
    monkeypatch.setenv("XSTAGE_ATTACH_FD_SECONDS", "1")
    with WorkerClient(sys.executable, shm_mode="off") as w:
        w.load(graphs["mlp"])
        slots, size = shm.plan_layout([("x", "float32", 256)], [])
        rid = w._take_id()
        w._send({"op": "attach", "id": rid, "region": {"kind": "memfd", "size": size,
                                                       "slots": slots}})
        exc = _in_thread(lambda: w._expect(w._recv("load", 60), "attached", rid))
        assert isinstance(exc, errors.WorkerRaised), exc
        assert "no region descriptor" in str(exc)
        assert w.ping() is not None  # the worker still serves


_SLOT = {"name": "x", "role": "in", "dtype": "float32", "capacity": 64, "offset": 4096, "set": 0}


@pytest.mark.parametrize("change", [
    {"dtype": ["float32"]}, {"dtype": {"a": 1}}, {"name": ["x"]}, {"role": ["in"]},
    {"name": {"x": 1}}, {"capacity": 1.5}, {"offset": "4096"}, {"set": 1}, {"set": None},
    {"capacity": -1}, {"offset": 4097},
], ids=lambda c: "-".join(f"{k}={type(v).__name__}" for k, v in c.items()))
def test_malformed_slot_tables_are_protocol_errors(change):
    with pytest.raises(wire.ProtocolError):
        shm.validate_layout(8192, [dict(_SLOT, **change)])


@pytest.mark.parametrize("dims", [
    (0, 1 << 62, 1 << 62), (0,) + (1 << 40,) * 31, (1 << 41,), (0, 1 << 63),
])
def test_malformed_descriptors_are_protocol_errors(dims):
    slots, size = shm.plan_layout([("x", "float32", 64)], [])
    region = shm.Region.create(size, slots, "memfd")
    try:
        raw = shm.DESC.pack(wire.DTYPE_CODES["float32"], len(dims), 0, 0, 0,
                            *(list(dims) + [0] * (32 - len(dims))))
        region.mm[shm.DESC_OFF:shm.DESC_OFF + shm.DESC.size] = raw
        with pytest.raises(wire.ProtocolError):
            dtype, shape = region.read_desc("in", "x")
            region.view("in", "x", dtype, shape)
    finally:
        region.close()


def test_a_huge_declared_dimension_is_refused_before_allocating():
    spec = IOSpec(name="x", dtype="float32", shape=[1 << 40, 1 << 20])
    with pytest.raises(errors.UsageError, match="more than half this machine's memory"):
        synthesize([spec])


def _profile_dirs(root: Path) -> set[str]:
    return {p.name for p in root.glob("xstage-profile-*")}


def test_profile_folders_do_not_leak(graphs, tmp_path, monkeypatch):
    """A failed profiled load leaves no folder; one of a worker killed before its first
    run is swept by the next profiled load."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with WorkerClient(sys.executable) as w:
        with pytest.raises(errors.WorkerRaised):
            w.load(tmp_path / "missing.onnx", options={"profile": True})
    assert not _profile_dirs(tmp_path)
    w = WorkerClient(sys.executable)
    w.start()
    w.load(graphs["mlp"], options={"profile": True})
    assert len(_profile_dirs(tmp_path)) == 1
    os.kill(w.pid, signal.SIGKILL)
    w.close()
    with WorkerClient(sys.executable) as w2:
        w2.load(graphs["mlp"], options={"profile": True})
        left = _profile_dirs(tmp_path)
        assert len(left) == 1 and all(f"-{w2.pid}-" in name for name in left), left
    assert all(f"-{w2.pid}-" in name for name in _profile_dirs(tmp_path))


def test_a_named_region_of_a_dead_client_is_swept():
    """XSTAGE_SHM=named: a client that dies during the hand-over leaves its name; the next
    named region sweeps it."""
    script = ("import os; from xstage_remote import shm\n"
              "r = shm.Region.create(8192, [], 'named')\n"
              "print(r.name, flush=True); os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=HARD_TIMEOUT, env=dict(os.environ))
    name = done.stdout.strip()
    assert name.startswith("/dev/shm/xstage-") and os.path.exists(name), done.stderr
    slots, size = shm.plan_layout([("x", "float32", 64)], [])
    region = shm.Region.create(size, slots, "named")
    region.close()
    assert not os.path.exists(name)
