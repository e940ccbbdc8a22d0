"""The worker takes its transport knobs from the ``load`` its client sends, never from its own
environment (``xstage_remote.tuning``), and each object both ends build takes them as
``tuning=`` (docs/wire.md, "Transport tuning").

The worker here is the real one, a subprocess of this interpreter on a socketpair, driven
frame by frame; its environment sets every knob to a value the test would notice.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xstage_remote import shm, sockspin, wire
from xstage_remote.tuning import TransportTuning

REPO = Path(__file__).resolve().parents[2]
#: What the worker's own environment says; it must not listen.
HOSTILE_ENV = {"XSTAGE_ATTACH_FD_SECONDS": "3600", "XSTAGE_WORKER_SPIN_SECONDS": "3600",
               "XSTAGE_MAC_THREADS": "16", "XSTAGE_MAX_REGION_BYTES": "1",
               "XSTAGE_SPIN_SECONDS": "not a number"}


@pytest.fixture
def worker(tmp_path):  # type: ignore[no-untyped-def]
    """(control socket, graph path): a real worker started as a client starts one (secret on
    stdin, the control and doorbell sockets inherited), its hello read."""
    from xstage import builtin_graphs

    graph = builtin_graphs.write(builtin_graphs.slice_graph(4, 4), tmp_path / "s.onnx")
    ctl, ctl_peer = socket.socketpair()
    bell, bell_peer = socket.socketpair()
    env = dict(os.environ, **HOSTILE_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "xstage_remote", "worker", "--ctl-fd", str(ctl_peer.fileno()),
         "--bell-fd", str(bell_peer.fileno())],
        stdin=subprocess.PIPE, pass_fds=(ctl_peer.fileno(), bell_peer.fileno()), env=env)
    ctl_peer.close()
    bell_peer.close()
    assert proc.stdin is not None
    proc.stdin.write(b"s3cret\n")
    proc.stdin.flush()
    ctl.settimeout(120)
    try:
        assert wire.recv_frame(ctl).op == "hello"
        yield ctl, graph
        wire.send_frame(ctl, {"op": "shutdown", "id": 99, "gen": 1})
        assert wire.recv_frame(ctl).op == "bye"
    finally:
        proc.stdin.close()
        ctl.close()
        bell.close()
        proc.wait(timeout=120)


def _load(ctl, graph, tuning=None):  # type: ignore[no-untyped-def]
    header = {"op": "load", "id": 1, "gen": 1, "runtime": "ort", "path": str(graph)}
    if tuning is not None:
        header["tuning"] = tuning
    wire.send_frame(ctl, header)
    return wire.recv_frame(ctl)


def test_a_malformed_tuning_is_a_load_error_naming_the_field(worker) -> None:
    """A value the client sent that no knob takes fails the load, naming the field and a
    value that works; the worker stays up and a good load follows."""
    ctl, graph = worker
    reply = _load(ctl, graph, {"worker_spin_seconds": "fast"})
    assert reply.op == "error" and reply.header["kind"] == "ValueError"
    assert reply.header["message"] == (
        "load: the client's transport tuning is malformed: worker_spin_seconds='fast' is not "
        "a number >= 0 (e.g. 0.0003)")
    assert _load(ctl, graph, {"worker_spin_seconds": 0.0}).op == "loaded"


def test_the_worker_waits_by_the_tuning_it_was_sent_not_its_environment(worker) -> None:
    """``attach_fd_seconds`` from the load (its environment says an hour): an attach whose
    descriptor never comes is refused after the sent time, and the message names it."""
    ctl, graph = worker
    assert _load(ctl, graph, {"attach_fd_seconds": 0.25}).op == "loaded"
    slots, size = shm.plan_layout([("x", "float32", 16)], [("y", "float32", 16)])
    wire.send_frame(ctl, {"op": "attach", "id": 2, "gen": 1,
                          "region": {"kind": "memfd", "size": size, "slots": slots}})
    reply = wire.recv_frame(ctl)  # no descriptor sent: the worker gives up by its tuning
    assert reply.op == "error"
    assert reply.header["message"] == "attach: no region descriptor within 0.25s of the frame"


def test_an_older_clients_load_without_tuning_takes_the_defaults(worker) -> None:
    """No ``tuning`` in the load (an older client): the defaults, whatever the worker's
    environment says (its malformed ``XSTAGE_SPIN_SECONDS`` is not read at all)."""
    ctl, graph = worker
    reply = _load(ctl, graph)
    assert reply.op == "loaded"
    wire.send_frame(ctl, {"op": "run", "id": 3, "gen": 1}, {"x": np.ones(4, np.float32)})
    assert wire.recv_frame(ctl).op == "result"


def test_every_object_both_ends_build_takes_its_knobs_as_tuning() -> None:
    """The doorbell, the channel, the socket spin and the region's plan read the value they
    are given, once; None is the defaults."""
    tuning = TransportTuning(spin_seconds=0.5, worker_spin_seconds=0.25,
                             spin_yield_seconds=0.125, long_call_seconds=0.75,
                             preempted_seconds=0.0625, near_end_seconds=0.03125,
                             crowd_blocks=True, mac_threads=2, max_region_bytes=1 << 20,
                             doorbell="socket")
    a, b = socket.socketpair()
    slots, size = shm.plan_layout([("x", "float32", 16)], [("y", "float32", 16)])
    region = shm.Region.create(size, slots)
    try:
        bell = shm.Doorbell(a, tuning=tuning)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        p = bell.policy
        assert (p.spin_seconds, p.long_call, p.preempted, p.near_end, p.crowd_blocks, p.hold) \
            == (0.5, 0.75, 0.0625, 0.03125, True, 0.125)
        assert (bell.worker_spin_seconds, bell.spin_yield_seconds) == (0.25, 0.125)
        assert shm.Doorbell(b).spin_seconds == TransportTuning().spin_seconds
        assert shm.eventfd_pair(tuning) is None  # doorbell="socket": the socketpair stays
        channel = wire.Channel(a, "s", b"\0" * 32, "client", tuning=tuning)
        assert channel.mac_threads == 2
        assert channel.chunk_bytes == wire.record_bytes_default(2)
        assert wire.Channel(a, "s", b"\0" * 32, "client").mac_threads == wire.MAC_THREADS
        spin = sockspin.SocketSpin(0.001, lambda view: None, spinning=True, allowed_cpus=2,
                                   tuning=tuning)
        assert (spin.policy.long_call, spin.policy.preempted) == (0.75, 0.0625)
    finally:
        region.close()
        a.close()
        b.close()
    big = [("x", "float32", 1 << 20)]
    assert shm.plan_layout(big, big) != (None, 0)
    assert shm.plan_layout(big, big, max_bytes=tuning.max_region_bytes) == (None, 0)
    with pytest.raises(wire.ProtocolError, match=r"region size \d+ is outside \(0, 1048576\]"):
        shm.validate_layout(4 << 20, [], max_bytes=tuning.max_region_bytes)


def test_no_module_of_the_worker_reads_a_knob_from_its_environment() -> None:
    """The knobs' variables appear in ``tuning`` (the client's reader) and nowhere else in
    ``xstage_remote``: every other module takes a ``TransportTuning``."""
    from xstage_remote.tuning import KNOBS

    src = REPO / "src" / "xstage_remote"
    readers = {}
    for path in sorted(src.rglob("*.py")):
        if path.name == "tuning.py":
            continue
        text = path.read_text(encoding="utf-8")
        named = [v for v, *_ in KNOBS if f'"{v}"' in text]
        if named:
            readers[str(path.relative_to(src))] = named
    assert readers == {}
