"""Fixtures for the client tests: built-in graphs on disk and a fault-injecting interpreter."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from xstage import builtin_graphs

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graphs")
    return {
        "mlp": builtin_graphs.write(builtin_graphs.mlp(), root / "mlp.onnx"),
        "slice": builtin_graphs.write(builtin_graphs.slice_graph(4096, 1024), root / "slice.onnx"),
        "identity": builtin_graphs.write(identity_graph(), root / "identity.onnx"),
        "slow": builtin_graphs.write(slow_graph(), root / "slow.onnx"),
        "dynamic": builtin_graphs.write(dynamic_graph(), root / "dynamic.onnx"),
        "symbolic": builtin_graphs.write(symbolic_graph(), root / "symbolic.onnx"),
    }


def dynamic_graph() -> onnx.ModelProto:
    """Fixed input, one fixed output and one whose size depends on the data (NonZero)."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Identity", ["x"], ["same"])],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("nz", TensorProto.INT64, [2, "k"]),
         helper.make_tensor_value_info("same", TensorProto.FLOAT, [4, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def symbolic_graph() -> onnx.ModelProto:
    """An input with a symbolic dimension: no slot can be sized at load."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


#: (name, onnx type, numpy dtype, declared shape) — every shape class the wire promises.
IDENTITY_IO = [
    ("b", TensorProto.BOOL, np.bool_, [3, 2]),
    ("i8", TensorProto.INT8, np.int8, [5]),
    ("i16", TensorProto.INT16, np.int16, [2, 2]),
    ("i32", TensorProto.INT32, np.int32, [4, 3]),
    ("i64", TensorProto.INT64, np.int64, []),
    ("u8", TensorProto.UINT8, np.uint8, [2, 3, 4]),
    ("u16", TensorProto.UINT16, np.uint16, [7]),
    ("u32", TensorProto.UINT32, np.uint32, [1]),
    ("u64", TensorProto.UINT64, np.uint64, [2, 1]),
    ("f16", TensorProto.FLOAT16, np.float16, [3, 5]),
    ("f32", TensorProto.FLOAT, np.float32, [6, 4]),
    ("f64", TensorProto.DOUBLE, np.float64, [0, 3]),
]


def identity_graph() -> onnx.ModelProto:
    nodes, ins, outs = [], [], []
    for name, typ, _, shape in IDENTITY_IO:
        nodes.append(helper.make_node("Identity", [name], [f"{name}_out"]))
        ins.append(helper.make_tensor_value_info(name, typ, shape))
        outs.append(helper.make_tensor_value_info(f"{name}_out", typ, shape))
    graph = helper.make_graph(nodes, "identity_all", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def ranks_graph() -> onnx.ModelProto:
    """Inputs and outputs of several ranks and dtypes: ``y = x * s`` (``s`` 0-d), ``total``
    (0-d) the sum of ``x``, ``twice = k + k`` (int64)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"]),
         helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Add", ["k", "k"], ["twice"])],
        "ranks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("k", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("twice", TensorProto.INT64, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def slow_graph(n: int = 1536, depth: int = 160) -> onnx.ModelProto:
    """Seconds of MatMul on two cores: a call that is reliably still running when killed."""
    return builtin_graphs.matmul_chain(depth, n, name="slow")

def identity_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, _, dtype, shape in IDENTITY_IO:
        shape = [4 if d == "n" else d for d in shape]
        if dtype is np.bool_:
            out[name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            out[name] = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


@pytest.fixture
def fault_python(tmp_path: Path) -> str:
    """An executable that stands in for an interpreter and runs fault_worker.py."""
    script = tmp_path / "fakepy"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "fault_worker.py"}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def fault_env(fault: str) -> dict[str, str]:
    env = dict(os.environ)
    env["XSTAGE_FAULT"] = fault
    return env


def stop_on_run_env(at: int = 1, *, every: bool = False, stop: bool = True,
                    stamps: Path | None = None) -> dict[str, str]:
    """The environment of a ``fault_python`` worker that stops itself (SIGSTOP) as it starts
    computing run number ``at`` (and each later one with ``every``; never with ``stop=False``)
    and, with ``stamps`` (a folder), writes ``started-<n>``, ``computed-<n>`` and
    ``answered-<n>`` there (fault_worker.py, "stop-on-run")."""
    env = fault_env("stop-on-run")
    env["XSTAGE_FAULT_AT"] = str(at)
    env["XSTAGE_FAULT_EVERY"] = "1" if every else "0"
    env["XSTAGE_FAULT_STOP"] = "1" if stop else "0"
    if stamps is not None:
        stamps.mkdir(parents=True, exist_ok=True)
        env["XSTAGE_FAULT_STAMPS"] = str(stamps)
    return env


@pytest.fixture
def stamps(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A stamps folder for ``stop_on_run_env``; at teardown, every ``stop-on-run`` worker that
    wrote its pid there and still lives is killed: a worker stopped in a call cannot notice its
    client's end (a scenario subprocess the test gave up on), so nothing else would end it."""
    folder = tmp_path / "stamps"
    folder.mkdir()
    yield folder
    for pid_file in folder.glob("pid-*"):
        try:
            proc = psutil.Process(int(pid_file.name.split("-", 1)[1]))
            if any("fault_worker.py" in part for part in proc.cmdline()):
                proc.kill()
        except (psutil.Error, ValueError):
            pass


#: A liveness bound for waiting on an event (a process stopping, a file appearing): the
#: event is certain to come, so only a bug reaches it; never a speed bound.
EVENT_TIMEOUT = 120.0


def wait_until(check, what: str, timeout: float = EVENT_TIMEOUT) -> None:  # type: ignore[no-untyped-def]
    """Poll ``check()`` until it holds; fail naming ``what`` if it never does."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not seen within {timeout:.0f}s")
        time.sleep(0.002)


def wait_stopped(pid: int, stamps: Path | None = None, run: int | None = None,
                 timeout: float = EVENT_TIMEOUT) -> None:
    """Wait until process ``pid`` is stopped: a ``stop-on-run`` worker took its run (with
    ``stamps`` and ``run``: run number ``run``, whose ``started`` stamp comes before the stop)."""
    proc = psutil.Process(pid)

    def stopped() -> bool:
        if stamps is not None and run is not None and not (stamps / f"started-{run}").exists():
            return False
        return proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)

    wait_until(stopped, f"worker {pid} stopping itself at run {run or 'its stop'}", timeout)


class Background:
    """``fn()`` in a daemon thread, for a call the test unblocks from its own thread (a kill,
    a resume); ``raised(timeout)`` joins it and returns what it raised (None)."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.box: dict[str, BaseException | None] = {"exc": None}

        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.box["exc"] = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def raised(self, timeout: float = EVENT_TIMEOUT) -> BaseException | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            pytest.fail(f"the call was still blocked after {timeout:.0f}s")
        return self.box["exc"]


@pytest.fixture(autouse=True)
def _xstage_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Client tests share one state root per session (the staged worker copy is reused)."""
    if "XSTAGE_HOME" not in os.environ or not os.environ["XSTAGE_HOME"].startswith(
        str(tmp_path_factory.getbasetemp())
    ):
        monkeypatch.setenv("XSTAGE_HOME", str(tmp_path_factory.getbasetemp() / "xstage-home"))


def in_thread(fn, timeout: float):  # type: ignore[no-untyped-def]
    """Run ``fn`` in a thread the test abandons if it hangs; return what it raised (None).

    A deadline test must fail, not hang, when the deadline does not hold.
    """
    box: dict[str, BaseException | None] = {"exc": None}

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"still blocked after {timeout}s: the deadline did not hold")
    return box["exc"]


class SteppingClock:
    """A stand-in for the ``time`` module of the wait policy's modules (``shm``, ``sockspin``).

    ``monotonic()`` starts at the real clock's reading and moves ``step`` seconds at each read,
    so a spin's budget is a number of checks, never a share of the scheduler's time; a
    preemption is a jump the test makes (``advance``). Everything else is the real ``time``.
    """

    def __init__(self, step: float = 1e-6) -> None:
        self.now = time.monotonic()
        self.step = step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def monotonic_ns(self) -> int:
        return int(self.monotonic() * 1e9)

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(time, name)


def stepping_clock(monkeypatch: pytest.MonkeyPatch, *modules, step: float = 1e-6) -> SteppingClock:  # type: ignore[no-untyped-def]
    """Give each of ``modules`` one ``SteppingClock`` as its ``time`` for this test."""
    clock = SteppingClock(step)
    for module in modules:
        monkeypatch.setattr(module, "time", clock)
    return clock
