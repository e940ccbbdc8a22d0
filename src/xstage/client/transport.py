"""How a call's inputs reach the worker and its outputs come back: one interface, three ways.

``WorkerClient`` keeps the worker's lifecycle (spawn, hello, load, close, liveness) and owns one
transport, chosen once when it attaches to the worker (``choose``, at spawn):

* ``InlineFrames``: one frame each way on the inherited control socket (one kernel), the
  tensors inline: binary ``run``/``result`` frames for the loaded signature where the worker
  has ``fast-frames`` (docs/wire.md), JSON frames otherwise.
* ``SharedRegion`` (``client/region.py``): the shared region's slot sets and the doorbell; it
  is an ``InlineFrames`` too, which is how it owns the inline way for a call or an output that
  has no slot (or does not fit one) and every frame that is not a call.
* ``SocketChannel``: the same frames as authenticated records (``xstage_remote.wire.Channel``)
  on the connect-back TCP socket (a worker on another kernel), inline tensors only, with the
  socket spin before a blocking receive (``xstage_remote.sockspin``).

A transport moves bytes and keeps what repeated calls of one signature reuse (the lean call's
kept frame, its reply's reading plan); it raises the lower layer's errors
(``wire.PeerClosed``, ``ConnectionError``, ``TimeoutError``, ``wire.ProtocolError``), which the
client translates (``WorkerClient._translate``). The call path reads a transport's attributes
into locals once per call: no call pays more than one method dispatch for the interface.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from xstage.client.deadlines import DeadlineSocket
from xstage.client.outputs import Outputs, fill
from xstage_remote import shm, sockspin, wire

__all__ = ["InlineFrames", "SocketChannel", "Transport"]


class Transport(Protocol):
    """What the client's call path needs of the way bytes travel to its worker.

    ``kind`` names the implementation (``inline``, ``region``, ``channel``); ``region`` and
    ``bell`` are None but on the shared region's; ``channel`` and ``spin`` are None but on the
    socket channel's. ``expected`` is the worker's last compute time per call (seconds), the
    hint a channel's spin and a region's doorbell wait by.
    """

    kind: str
    ctl: socket.socket
    io: DeadlineSocket
    codec: wire.FastCodec | None
    region: shm.Region | None
    bell: shm.Doorbell | None
    channel: wire.Channel | None
    spin: Any
    expected: float
    lane: Any
    reply: Any
    send_lane: Callable[[Any], None]

    def encode(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None,
               generation: int) -> list[Any]:
        """A frame's buffers: the binary call frame where the codec has one, else JSON."""

    def send(self, parts: list[Any], run: bool) -> None:
        """Send one encoded frame (``run``: a call's request, whose reply may be spun for)."""

    def recv(self, expect: Any = None) -> wire.Frame:
        """Read one frame within the deadline ``io.start`` set."""

    def cancel(self, rid: int, s: int) -> bool:
        """Withdraw request ``rid`` of slot set ``s`` if the worker has not taken it."""

    def close(self) -> None:
        """Release what the transport holds (the socket is the client's to close)."""

    def stats(self) -> dict[str, Any]:
        """The transport's waits so far (the doorbell's decisions; {} where there are none)."""


class InlineFrames:
    """One frame each way on the control socket; the tensors inline."""

    kind = "inline"
    region: shm.Region | None = None
    bell: shm.Doorbell | None = None
    channel: wire.Channel | None = None
    spin: Any = None

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.io = DeadlineSocket(ctl)  # the control socket, one deadline per call
        #: Binary ``run``/``result`` frames for the loaded signature (docs/wire.md), else None.
        self.codec: wire.FastCodec | None = None
        #: The outputs a call returns (the loaded signature's, state outputs left out).
        self.outputs: list[dict[str, Any]] = []
        self.expected = 0.0
        #: The lean call's kept frame sent (``wire.Lane``, its id packed in): a hook bound once,
        #: so the call pays no frame of ours for it (a channel binds its ``send_sealed``).
        self.send_lane: Callable[[Any], None] = self._send_frame_of
        self.forget()

    def forget(self) -> None:
        """Drop what repeated calls of one signature kept (a new load starts without it).

        ``lane``: the lean call's kept frame (``lane_for``); ``out_plan``: its reply's reading
        plan (``collect_lean``); ``reply``: that reply as a channel checks it in fewer steps
        (``wire._Expect``, TCP).
        """
        self.lane: Any = None
        self.out_plan: Any = None
        self.reply: Any = None

    # ------------------------------------------------------------------ frames
    def encode(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None,
               generation: int) -> list[Any]:
        """A frame's buffers: the binary call frame where the codec has one, else JSON.

        Raises:
            wire.ProtocolError: a header or tensor the wire cannot carry.
        """
        parts = None
        if self.codec is not None and header["op"] == "run":  # a binary call frame
            parts = wire.encode_fast(self.codec, "run", header["id"], generation, arrays,
                                     header.get("options"))
        if parts is None:
            parts = wire.encode_frame(wire.with_generation(header, generation), arrays)
        return parts  # type: ignore[no-any-return]

    def send(self, parts: list[Any], run: bool) -> None:
        """One ``sendmsg`` for a frame the kernel takes whole."""
        wire.send_parts(self.io, parts)

    def _send_frame_of(self, lane: Any) -> None:
        """The lean call's kept frame, its id packed in (``wire.Lane``), as it is.

        One ``send`` takes a small frame whole (``DeadlineSocket.sendall``'s first step); what
        the kernel did not take follows by ``sendall``.
        """
        frame = lane.frame  # a memoryview of the kept frame, its trailer room left out
        sent = self.io.send(frame)
        if sent != frame.nbytes:
            self.io.sendall(frame[sent:])

    def recv(self, expect: Any = None) -> wire.Frame:
        """Read one frame within the deadline ``io.start`` set."""
        return wire.recv_frame(self.io, codec=self.codec)  # type: ignore[no-any-return]

    def cancel(self, rid: int, s: int) -> bool:
        """No slot sets: nothing sent can be withdrawn."""
        return False

    def close(self) -> None:
        """Nothing of its own to release (the socket is the client's)."""

    def stats(self) -> dict[str, Any]:
        """No doorbell: no waits to count."""
        return {}

    # ------------------------------------------------------------------ the lean call
    def lane_for(self, feeds: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
                 generation: int) -> Any:
        """The lean call's lane for inputs the client just accepted, else None.

        Only for numpy arrays accepted as they are (already in wire byte order): the lane is
        the signature's kept frame (``wire._Lane``), which knows its signature.
        """
        if self.codec is None:
            return None
        if any(feeds[name] is not value for name, value in inputs.items()):
            return None  # converted (byte order, not an array): the long way each time
        return self.codec.lane(wire.FAST_RUN, generation, feeds)

    def collect(self, arrays: Mapping[str, np.ndarray],
                out: Mapping[str, np.ndarray]) -> Outputs:
        """The outputs of a reply frame just read, by name in graph order.

        ``arrays`` view that frame's payload, which nothing else holds, so each is returned as
        it is (no copy), unless the caller gave an ``out`` array for it or it sits unaligned in
        the payload (then copied).
        """
        result = Outputs()
        for d in self.outputs:
            name = d["name"]
            value = arrays[name]
            target = out.get(name)
            if target is None and value.flags.aligned and value.flags.writeable:
                result[name] = value
            else:
                result[name] = fill(target, value, name)
        return result

    def collect_lean(self, frame: wire.Frame, generation: int) -> Outputs:
        """``collect`` for a binary reply, with a reading plan per descriptor list.

        The codec hands back its one checked list for every reply of a signature: a list met
        before is read with the plan made from the first.
        """
        tensors = frame.tensors
        plan = self.out_plan
        if plan is None or tensors is not plan[0]:
            result = self.collect(frame.arrays(), {})
            self.out_plan = self.reply = None
            if all(nbytes for _, _, _, _, nbytes in tensors) and len(tensors) == len(result):
                at = {name: (offset, shape) for name, _, shape, offset, _ in tensors}
                self.out_plan = (tensors, tuple(
                    (name, at[name][1], v.dtype, at[name][0]) for name, v in result.items()))
                if self.channel is not None and self.codec is not None \
                        and "state_reset" not in frame.header["timing"]:
                    # the next reply of this signature, checked by the channel in fewer
                    # steps: this one passed every check (the lean call) to get here
                    self.reply = self.codec.expect(wire.FAST_RESULT, generation, tensors,
                                                   len(frame.payload))
            return result
        return self.planned(frame.payload)

    def planned(self, payload: Any) -> Outputs:
        """A binary reply's ``payload`` read with ``collect_lean``'s plan.

        Arrays viewing it, as ``Frame.arrays`` makes them (an unaligned one copied).
        """
        result = Outputs()
        for name, shape, dtype, offset in self.out_plan[1]:
            value = np.ndarray(shape, dtype, payload, offset)
            result[name] = value if value.flags.aligned else fill(None, value, name)
        return result


class SocketChannel(InlineFrames):
    """Authenticated records on the connect-back TCP socket (``wire.Channel``)."""

    kind = "channel"

    def __init__(self, ctl: socket.socket, channel: wire.Channel) -> None:
        super().__init__(ctl)
        self.channel = channel
        channel.sock = self.io  # records bounded by the call's deadline too
        self.send_lane = channel.send_sealed  # the lane's frame as one record, sealed in place

    def watch(self, spin_seconds: float, peer_cpu: Any, tuning: Any = None) -> None:
        """Spin for a reply before blocking (``sockspin``: the shared region's policy).

        ``peer_cpu`` (``sockspin.proc_cpu`` of a worker on this kernel) is watched for a
        shared CPU, as the region's caller does; kept, or closed where no spin is installed.
        ``tuning``: the client's ``TransportTuning`` (the spin policy's knobs).
        """
        self.spin = sockspin.install(self.channel, spin_seconds, self.io.recv_nowait, peer_cpu,
                                     tuning=tuning)
        if self.spin is None:
            sockspin.close_proc_cpu(peer_cpu)

    def send(self, parts: list[Any], run: bool) -> None:
        """The frame as records; the reply to a small call is spun for.

        A reply other than a call's is long (``long_call``), and where a large frame's
        transfer takes a millisecond a spin saves one wake-up and takes the CPU the peer's
        copies, MACs and runtime threads want (measured: docs/performance.md#sockwait).
        """
        if self.spin is not None:
            _, hlen, plen = wire.PREFIX.unpack_from(parts[0])
            small = run and wire.PREFIX.size + hlen + plen <= wire.SMALL_FRAME
            self.spin.expected = self.expected if small else 60.0
        self.channel.send_parts(parts)  # type: ignore[union-attr]

    def recv(self, expect: Any = None) -> wire.Frame:
        """One record's frame; ``expect``: the reply a call's signature makes (fewer checks)."""
        return self.channel.recv(codec=self.codec, expect=expect)  # type: ignore[union-attr,no-any-return]

    def close(self) -> None:
        """Close the peer's CPU reader the spin held."""
        if self.spin is not None:
            sockspin.close_proc_cpu(self.spin.peer_cpu)
            self.spin.peer_cpu = None
