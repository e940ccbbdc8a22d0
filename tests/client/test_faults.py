"""Fault injection for the client side: request identity (docs/wire.md, "Request identity"), byte
order, deadlines.

* An interrupted call (SIGINT mid-call) never poisons the next: on the shared region the next
  call discards the stale answer and answers its own request; on the socket, where the
  interrupt lands inside an inline read, the stage is closed at the interrupt and the next
  call raises ``StageClosed`` saying why (never ``RemoteProtocolError``, never the old
  outputs). The order is arranged, not raced: the worker stops itself as it takes the call
  (``fault_worker.py``, "stop-on-run"), so the interrupt always lands before any answer exists.
* Big-endian inputs convert at the boundary; every dtype numpy can express converts or is
  refused by name.
* A stopped worker (SIGSTOP) cannot hold the caller past a deadline, sending included; a
  killed one (SIGKILL) is reported, at each phase.
* Malformed region descriptors and tables are ``ProtocolError``; a missing ``attach``
  descriptor does not hold the worker; ``close()`` from another thread ends a call in flight.

Everything that could hang runs in a subprocess or a thread with a hard timeout; nothing
asserts on wall-clock time, and no call is raced against a timer: a kill, an interrupt or a
close lands while the worker is stopped in the call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from tests.client.conftest import Background, in_thread, stop_on_run_env, wait_stopped
from xstage import builtin_graphs, errors
from xstage.artifact import IOSpec
from xstage.client import Deadlines, WorkerClient, WorkerState
from xstage.inputs import synthesize
from xstage.signature import check_inputs
from xstage_remote import shm, wire

HARD_TIMEOUT = 420  # seconds a scenario may take before it counts as hung


def tagged_graph(rows: int) -> onnx.ModelProto:
    """``y = x`` (rows x 1024 float32): 256 rows are 1 MiB, 4 rows 16 KiB. The call needs no
    length of its own: the worker stops itself as it takes it (``stop-on-run``), so the
    interrupt lands before any answer can exist."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "tagged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 1024])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


_INTERRUPT = textwrap.dedent(
    """
    import faulthandler, json, os, signal, sys, threading, time
    import numpy as np
    import psutil
    from xstage import errors
    from xstage.client import WorkerClient, WorkerState
    python, path, shm_mode, rows, then, stamps = sys.argv[1:7]
    rows = int(rows)
    LIMIT = 120.0  # a liveness bound on each awaited event, never a speed one
    faulthandler.dump_traceback_later(3 * LIMIT, exit=True)  # a hang shows where it hangs

    def until(check, what):
        end = time.monotonic() + LIMIT
        while not check():
            if time.monotonic() > end:
                print(json.dumps({"outcome": "hung", "message": what}), flush=True)
                os._exit(1)
            time.sleep(0.002)

    def resume(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # the client ended it (an interrupt inside a frame)
            pass

    a = np.full((rows, 1024), 1.0, np.float32)
    b = np.full((rows, 1024), 2.0, np.float32)

    def call_b():
        try:
            y = w.run({"x": b})["y"]
            if np.array_equal(y, b):
                return {"outcome": "repaired"}
            return {"outcome": "stale" if np.array_equal(y, a) else "wrong"}
        except errors.StageClosed as exc:
            return {"outcome": "closed", "message": str(exc)}
        except Exception as exc:
            return {"outcome": "error", "message": "%s: %s" % (type(exc).__name__, exc)}

    # The worker stops itself as it takes its second run, call A (fault_worker.py).
    w = WorkerClient(python, shm_mode=shm_mode)
    w.start()
    w.load(path)
    w.run({"x": b})  # run 1: answered
    pid = w.pid
    proc = psutil.Process(pid)
    main = threading.main_thread().ident
    fired = threading.Event()

    def ctrl_c(signum, frame):  # Python's own handler, raising once however often it comes
        if not fired.is_set():
            fired.set()
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, ctrl_c)

    def interrupt():
        # 1. the worker took call A and stopped: A's answer cannot exist before SIGCONT;
        # 2. Ctrl-C to the caller, which is waiting for it (or still finishing the send).
        # Python runs a handler between bytecodes: a signal that lands just before the
        # caller enters its blocking poll is seen only when the poll returns, so the Ctrl-C
        # is repeated until it was raised, as a user presses it again.
        until(lambda: proc.status() == psutil.STATUS_STOPPED, "the worker never took call A")
        while not fired.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            fired.wait(0.5)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        w.run({"x": a})
        outcome = {"outcome": "not-interrupted"}
    except KeyboardInterrupt:
        if then == "when-idle":
            # 3. resume; 4. the worker stamps A answered (or the client ended it); 5. call B.
            resume(pid)
            # (A socket reply larger than the buffer is sent only as the caller reads it:
            # there the worker's stamp is "computed", A's compute done, its reply under way.)
            done = os.path.join(stamps, ("computed-2" if shm_mode == "off" else "answered-2"))
            until(lambda: os.path.exists(done) or w.state is not WorkerState.READY,
                  "call A was never answered")
            outcome = call_b()
        else:
            # 3. call B starts (it holds the client) while A is unanswered; 4. resume.
            box = {}
            t = threading.Thread(target=lambda: box.update(call_b()), daemon=True)
            t.start()

            def b_holds_the_client():
                if not t.is_alive():
                    return True
                if w.lock.acquire(blocking=False):
                    w.lock.release()
                    return False
                return True

            until(b_holds_the_client, "call B never started")
            resume(pid)
            t.join(LIMIT)
            outcome = box or {"outcome": "hung", "message": "call B never returned"}
    print(json.dumps(outcome), flush=True)
    w.close()
    """
)


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("tagged")
    return {rows: builtin_graphs.write(tagged_graph(rows), root / f"tagged{rows}.onnx")
            for rows in (4, 256)}


@pytest.mark.parametrize("then", ["at-once", "when-idle"])
@pytest.mark.parametrize("rows", [256, 4], ids=["1MiB", "16KiB"])
@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_an_interrupted_call_never_poisons_the_next(tagged, fault_python, stamps, shm_mode, rows,
                                                    then):
    """Defect 1: SIGINT mid-call, then a call with new inputs (at once, while the interrupted
    one is still unanswered, or once the worker has answered it): on the region its own
    outputs; on the socket (an inline read) StageClosed saying why; never the old ones.

    Ordered, not raced: the worker stops itself (SIGSTOP) as it takes call A, the interrupt
    is sent only once it has, and the worker resumes only after the interrupt was raised and,
    "at-once", after call B holds the client; "when-idle" calls B after the worker's stamp
    says A is answered (or the client ended it: the stage closed at the interrupt).
    """
    env = stop_on_run_env(2, stamps=stamps)
    try:
        done = subprocess.run([sys.executable, "-c", _INTERRUPT, fault_python, str(tagged[rows]),
                               shm_mode, str(rows), then, str(stamps)], capture_output=True,
                              text=True, timeout=HARD_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the call after the interrupt hung for {HARD_TIMEOUT}s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-4000:]
    result = json.loads(lines[-1])
    expected = "closed" if shm_mode == "off" else "repaired"
    assert result["outcome"] == expected, (result, done.stderr[-4000:])
    if result["outcome"] == "closed":
        assert "interrupted" in result["message"], result


# ------------------------------------------------------------------ request identity

def test_a_reply_of_another_generation_is_refused(graphs):
    """The client accepts a reply only from its worker's generation."""
    with WorkerClient(sys.executable, shm_mode="off", generation=3) as w:
        assert w.hello is not None and w.hello["gen"] == 3
        w.load(graphs["mlp"])
        rid = w.take_id()
        w._send({"op": "ping", "id": rid})
        w.generation = 4  # the reply now comes from what is, to this client, another generation
        with pytest.raises(errors.RemoteProtocolError, match="carries gen 3"):
            w.expect(w.recv("call", 60), "pong", rid)
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
            assert w.link.region is not None
            seen.append(w.link.region.resp_id())
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


def test_cli_call_timeout_kills_a_hung_warmup(tmp_path, fault_python, stamps):
    """``--timeout warmup=S``: a warm-up past it ends in a WarmupTimeout, not 30 minutes.

    The route's worker stops itself as it starts its first run (the warm-up): the deadline
    passes by order, however fast the machine."""
    path = builtin_graphs.write(tagged_graph(4), tmp_path / "tagged.onnx")
    env = stop_on_run_env(1, stamps=stamps)
    env["XSTAGE_PYTHON_ORT_CPU"] = fault_python
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(path),
                           "--route", "ort-cpu", "--timeout", "warmup=1", "--runs", "1",
                           "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=HARD_TIMEOUT, env=env)
    assert done.returncode in (1, 2), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "warmup" in (done.stdout + done.stderr).lower()


# ------------------------------------------------------------------ point 6

def test_close_from_another_thread_ends_a_call_in_flight(graphs, fault_python):
    """The worker stops itself as it starts the call: close() from this thread lands while
    the call is in flight by order, not by a race with the compute."""
    w = WorkerClient(fault_python, env=stop_on_run_env(1))
    w.start()
    w.load(graphs["mlp"])
    pid = w.pid
    call = Background(lambda: w.run({"x": np.ones((8, 256), np.float32)}))
    wait_stopped(pid)
    w.close()
    exc = call.raised(HARD_TIMEOUT)
    assert isinstance(exc, errors.StageClosed), exc
    assert "close() was called from another thread" in str(exc)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_attach_without_its_descriptor_does_not_hold_the_worker(graphs, monkeypatch):
    monkeypatch.setenv("XSTAGE_ATTACH_FD_SECONDS", "1")
    with WorkerClient(sys.executable, shm_mode="off") as w:
        w.load(graphs["mlp"])
        slots, size = shm.plan_layout([("x", "float32", 256)], [])
        rid = w.take_id()
        w._send({"op": "attach", "id": rid, "region": {"kind": "memfd", "size": size,
                                                       "slots": slots}})
        exc = _in_thread(lambda: w.expect(w.recv("load", 60), "attached", rid))
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
