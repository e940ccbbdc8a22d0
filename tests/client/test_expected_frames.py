"""A lean call's reply and the worker's next request read against their signature's expected
bytes (``wire._Expect``), between a real client and a real worker in one
thread over TCP: same numbers, and every frame that is not the expected one fails as before,
by name (another id, another generation, tampered, replayed, reordered).
"""

from __future__ import annotations

import hashlib
import re
import socket
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from xstage import builtin_graphs, errors
from xstage.client import WorkerClient
from xstage.client.transport import SocketChannel
from xstage.client.worker import WorkerState
from xstage_remote import wire
from xstage_remote import worker as remote

SECRET = "5e" * 16
DIGEST = hashlib.sha256(b"tests/client/test_expected_frames.py").digest()


def _wired(graph: Path) -> tuple[WorkerClient, remote.Worker]:
    """A client and an in-process worker over a TCP pair; the worker serves one frame
    (``Worker.turn``) whenever the client reads with nothing buffered."""
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    w = remote.Worker(b, None, 1, wire.Channel(b, SECRET, DIGEST, "worker"))
    c = WorkerClient(sys.executable, shm_mode="off", transport="tcp")
    channel = wire.Channel(a, SECRET, DIGEST, "client")
    c.link = SocketChannel(a, channel)  # bounds the channel's records by the call's deadline
    c._ctl = a
    c.state = WorkerState.READY
    c.hello = {"features": remote.FEATURES}
    real_recv = channel.recv

    def recv(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not channel._end - channel._start:
            assert w.turn() is None
        return real_recv(*args, **kwargs)

    channel.recv = recv  # type: ignore[method-assign]
    c.load(graph)
    return c, w


@pytest.fixture()
def pair(tmp_path: Path):  # type: ignore[no-untyped-def]
    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 8), tmp_path / "s.onnx")
    c, w = _wired(graph)
    yield c, w, ort.InferenceSession(str(graph))
    c.abort()
    w.sock.close()


def _x(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(16).astype(np.float32)


def _warm(c: WorkerClient, w: remote.Worker, sess: ort.InferenceSession) -> None:
    """Calls until both ends expect the signature's next frame."""
    for i in range(3):
        np.testing.assert_array_equal(c.run({"x": _x(i)})["y"], sess.run(None, {"x": _x(i)})[0])
    assert c.link.reply is not None and w._expect is not None


def test_expected_frames_carry_the_calls_with_the_same_numbers(pair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    c, w, sess = pair
    _warm(c, w, sess)
    long_way: list[int] = []
    real = wire.Channel._recv_small
    monkeypatch.setattr(wire.Channel, "_recv_small",
                        lambda self, *a: long_way.append(1) or real(self, *a))
    for i in range(3, 10):
        out = c.run({"x": _x(i)})
        np.testing.assert_array_equal(out["y"], sess.run(None, {"x": _x(i)})[0])
        assert out["y"].flags.writeable and out["y"].flags.c_contiguous
        assert set(c.last_timing) == {"worker_ns", "rss", "peak"}
        assert c.last_timing["worker_ns"] > 0
    assert long_way == []  # neither end read a frame the long way
    assert c._pending is None and c._next_id == w._expect.fields[0] + 1


def _attacked(ch: wire.Channel, lane, attack: str, rid: int = 0) -> bytearray:  # type: ignore[no-untyped-def]
    """``lane``'s record as ``attack`` alters it: another id (``rid`` + 1), another
    generation, an id past 2^63, a counter ahead (reorder) before sealing; a flipped bit of
    the id or the payload after (tamper). Any other attack: the record as sealed."""
    if attack == "another id":
        wire._U64_AT.pack_into(lane.buf, wire.PREFIX.size + 8, rid + 1)
    elif attack == "another generation":
        lane.buf[20:24] = (2).to_bytes(4, "little")
    elif attack == "id past 2^63":
        wire._U64_AT.pack_into(lane.buf, wire.PREFIX.size + 8, 1 << 63)
    elif attack == "reorder":
        ch.sent += 1
    data = _sealed(ch, lane)
    if attack == "tamper id":
        data[wire.PREFIX.size + 8] ^= 1
    elif attack == "tamper payload":
        data[-wire.TRAILER_BYTES - 1] ^= 1
    return data


def _sealed(ch: wire.Channel, lane) -> bytearray:  # type: ignore[no-untyped-def]
    """The record ``Channel.send_sealed`` makes of ``lane`` (its counter taken), not sent."""
    real = ch.sock
    got = bytearray()

    class Keep:
        def sendall(self, data) -> None:  # type: ignore[no-untyped-def]
            got.extend(data)

    ch.sock = Keep()
    try:
        wire.Channel.send_sealed(ch, lane)
    finally:
        ch.sock = real
    return got


ATTACKS = ["another id", "another generation", "tamper id", "tamper payload", "replay", "reorder"]


@pytest.mark.parametrize("expecting", [True, False], ids=["expected", "long way"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_reply_off_the_expectation_fails_as_before(pair, attack: str, expecting: bool) -> None:  # type: ignore[no-untyped-def]
    """The client's expected reply: any other reply takes the long way, whose checks name it
    (``_expect``, the channel's mac / replay / reorder), as without an expectation, and the
    stage is closed."""
    c, w, sess = pair
    _warm(c, w, sess)
    ch = w.stream.channel
    last: list[bytes] = []

    def keep(lane):  # type: ignore[no-untyped-def]
        last[:] = [bytes(_sealed(ch, lane))]
        ch.sock.sendall(last[0])

    w.stream.send_lane = keep  # the worker's hook for a lane (``ChannelStream.send_lane``)
    c.run({"x": _x(5)})
    rid = c._next_id
    message = {
        "another id": f"expected result #{rid}, the worker sent result #{rid + 1}",
        "another generation": f"the worker's result #{rid} carries gen 2, this stage's worker "
                              "is generation 1",
        "tamper id": "frame integrity check failed (mac)",
        "tamper payload": "frame integrity check failed (mac)",
        "replay": "frame sequence check failed (replay)",
        "reorder": "frame sequence check failed (reorder)",
    }[attack]

    def answer(lane):  # type: ignore[no-untyped-def]
        data = _attacked(ch, lane, attack, rid)
        ch.sock.sendall(last[0] if attack == "replay" else data)

    w.stream.send_lane = answer
    if not expecting:
        c.link.reply = None
    with pytest.raises(errors.RemoteProtocolError, match=re.escape(message)):
        c.run({"x": _x(6)})
    assert c._ctl is None  # the stage is closed
    with pytest.raises(errors.StageClosed):
        c.run({"x": _x(6)})


@pytest.mark.parametrize("expecting", [True, False], ids=["expected", "long way"])
@pytest.mark.parametrize("attack", ["another generation", "id past 2^63"] + ATTACKS[2:])
def test_a_request_off_the_expectation_fails_as_before(pair, attack: str, expecting: bool) -> None:  # type: ignore[no-untyped-def]
    """The worker's expected request: any other takes the long way, whose checks name it
    (the generation, the binary header's id range, the channel's mac / replay / reorder), as
    without an expectation."""
    c, w, sess = pair
    _warm(c, w, sess)
    if not expecting:
        w._expect = None
    ch = c.link.channel
    lane = c.link.lane
    lane.fill(20, {"x": _x(9)})
    message = {
        "another generation": "request run #20 carries gen 2, this worker is generation 1",
        "id past 2^63": "binary run frame: id 9223372036854775808 is not in [0, 2^63)",
        "tamper id": "frame integrity check failed (mac)",
        "tamper payload": "frame integrity check failed (mac)",
        "replay": "frame sequence check failed (replay)",
        "reorder": "frame sequence check failed (reorder)",
    }[attack]
    if attack == "replay":
        ch.sent -= 1
    c._ctl.sendall(_attacked(ch, lane, attack))
    with pytest.raises(wire.ProtocolError, match=re.escape(message)):
        w.turn()
