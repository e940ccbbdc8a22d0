"""The client's transport: one of three, chosen once at spawn, kept for the worker's life."""

from __future__ import annotations

import socket
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.client.conftest import identity_inputs
from xstage.client import WorkerClient
from xstage.client.deadlines import DeadlineSocket
from xstage.client.region import SharedRegion
from xstage.client.transport import InlineFrames, SocketChannel


@pytest.mark.parametrize(("kwargs", "kind", "cls"), [
    ({}, "region", SharedRegion),
    ({"shm_mode": "off"}, "inline", InlineFrames),
    ({"transport": "tcp"}, "channel", SocketChannel),
])
def test_the_transport_is_chosen_once_and_kept(graphs, kwargs, kind, cls) -> None:
    w = WorkerClient(sys.executable, **kwargs)
    assert w.link is None  # nothing to attach to before the worker starts
    with w:
        link = w.link
        assert type(link) is cls and link.kind == kind
        for _ in range(2):  # a second load keeps the transport, forgets the signature's frame
            w.load(graphs["identity"])
            assert w.link is link and link.lane is None
            out = w.run(identity_inputs())
            assert set(out) == {d["name"] for d in link.outputs}
        assert (link.region is not None) == (kind == "region")
        assert (link.channel is not None) == (kind == "channel")
        if kind != "region":
            assert link.cancel(1, 0) is False  # no slot sets: nothing sent can be withdrawn
        waits = w.waits()["caller"]
        assert (waits != {}) == (kind == "region") and waits == link.stats()
    assert w.link is link  # closed, not replaced


def test_the_region_transport_sends_frames_for_a_call_without_slots(graphs) -> None:
    """A call too large for its slots goes inline on the region's own transport."""
    with WorkerClient(sys.executable) as w:
        w.load(graphs["symbolic"])  # a symbolic dimension: no region until fit_region
        link = w.link
        assert isinstance(link, SharedRegion) and link.region is None
        small = {"x": np.ones((2, 2), np.float32)}
        assert w.fit_region({**small, "y": small["x"]}) and link.region is not None
        np.testing.assert_array_equal(w.run(small)["y"], -small["x"])
        assert "copy_in_ns" in w.last_timing  # through the region
        large = {"x": np.ones((64, 2), np.float32)}
        np.testing.assert_array_equal(w.run(large)["y"], -large["x"])
        assert "copy_in_ns" not in w.last_timing  # no slot it fits: a frame each way
        assert w.link is link


class _ShortSends(DeadlineSocket):
    """A real socket whose ``send`` takes at most 1000 bytes at a time (the fault: a kernel
    that takes a frame in part, as under a full send buffer)."""

    __slots__ = ()

    def send(self, data) -> int:  # type: ignore[no-untyped-def]
        return super().send(memoryview(data).cast("B")[:1000])


def test_a_lean_frame_the_kernel_takes_in_part_arrives_whole() -> None:
    """The lean call's kept frame (``InlineFrames.send_lane``, one ``send`` for a small frame)
    goes out whole where the kernel takes only part of it."""
    a, b = socket.socketpair()
    with a, b:
        link = InlineFrames(a)
        link.io = _ShortSends(a)
        frame = bytes(range(256)) * 40  # 10,240 bytes: one send takes 1000 of them
        link.io.start(30.0)
        link.send_lane(SimpleNamespace(frame=memoryview(frame)))
        got = bytearray()
        b.settimeout(60.0)  # a frame cut short fails here instead of hanging
        while len(got) < len(frame):
            got += b.recv(len(frame) - len(got))
        assert bytes(got) == frame
