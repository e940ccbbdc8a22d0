"""The worker's transport, chosen once when it starts (docs/wire.md, docs/architecture.md).

The worker talks to its client over one control stream, one of two kinds:

* ``InlineStream``: plain frames on the socketpair a local client made (``--ctl-fd``);
* ``ChannelStream``: authenticated records over TCP (``--connect``, ``wire.Channel``).

Both have the same methods (``send``, ``send_parts``, ``send_lane``, ``recv``, ``tune``), so
the serve loop never asks which it has. A local client may then hand over a shared region
(``attach``): ``receive_region`` takes its descriptors and maps it, and the region's doorbell
carries the calls from then on, while the stream keeps errors, inline fallbacks and liveness.

The hooks are bound once, in ``__init__`` (``send_lane`` is the channel's ``send_sealed`` or
the socket's ``sendall`` of the lane's frame): a call pays no branch and no extra frame for
the choice. ``tune`` takes the client's ``TransportTuning`` when ``load`` brings it.

Runs under the worker's interpreter (Python >= 3.9, standard library and numpy).
"""

import functools
import os
import socket

from . import shm, sockspin, wire

__all__ = ["ChannelStream", "InlineStream", "receive_region"]


class InlineStream:
    """Plain frames on a local socketpair (no records: both ends are one user's processes
    on one OS, and the client made the pair). ``expects``: False, this stream reads every
    frame the long way (``wire.ExpectedFrame`` is the channel's hook)."""

    expects = False
    kind = "inline"

    def __init__(self, sock):
        self.sock = sock
        self.spin = None
        self.send = functools.partial(wire.send_frame, sock)
        self.send_parts = functools.partial(wire.send_encoded, sock)
        #: A lane's frame as it is (``wire.Lane``: its trailer room goes unused here).
        self.send_lane = lambda lane: sock.sendall(lane.frame)
        #: ``recv(codec=)``: every frame the long way (no ``expect`` on this stream).
        self.recv = functools.partial(wire.recv_frame, sock)

    def tune(self, tuning):
        """Nothing to tune: a plain stream blocks in ``recv`` (the region's doorbell spins)."""


class ChannelStream:
    """Authenticated records over TCP (``wire.Channel``), with a ``sockspin.SocketSpin`` for
    the next request where spinning can pay. ``expects``: True, the next binary run of the
    last one's signature is checked in place (``Channel.recv(expect=)``)."""

    expects = True
    kind = "channel"

    def __init__(self, sock, channel, tuning=None):
        self.sock = sock
        self.channel = channel
        self.send = channel.send
        self.send_parts = channel.send_parts
        #: A lane sealed in place in its trailer room (``Channel.send_sealed``).
        self.send_lane = channel.send_sealed
        self.recv = channel.recv
        self.spin = None
        self.tune(tuning)

    def tune(self, tuning):
        """Hash with ``tuning.mac_threads`` (None: this process's default) and spin for the
        next request by ``tuning.worker_spin_seconds``; the record size stays the one the
        hello announced (both ends agreed on it)."""
        self.channel.mac_threads = wire.mac_threads_of(tuning)
        seconds = shm.WORKER_SPIN_SECONDS if tuning is None else tuning.worker_spin_seconds
        self.channel.spin = None
        self.spin = None
        if sockspin.AVAILABLE:
            self.spin = sockspin.install(self.channel, seconds,
                                         sockspin.nonblocking_poll(self.sock), tuning=tuning)


def receive_region(sock, spec, generation, tuning):
    """The region an ``attach`` frame's ``spec`` announces, mapped: ``(region, bell_fds)``.

    A memfd region's descriptor (and, with ``"bell": "eventfd"``, this side's and the
    client's eventfds) follow the frame at once on ``sock``; a client that never sends them
    must not hold this worker forever: ``tuning.attach_fd_seconds``. Every malformed spec is
    a ``wire.ProtocolError`` naming it, and no descriptor received is left open on a refusal.
    """
    size, slots = spec.get("size"), spec.get("slots")
    events = spec.get("bell") == "eventfd"
    if events and spec.get("kind") != "memfd":
        raise wire.ProtocolError("attach: an eventfd doorbell comes with a memfd region only")
    bell_fds = None
    if spec.get("kind") == "memfd":
        want = 3 if events else 1
        sock.settimeout(tuning.attach_fd_seconds)
        try:
            _, fds, _, _ = socket.recv_fds(sock, 1, want)
        except socket.timeout:
            raise wire.ProtocolError("attach: no region descriptor within %gs of the frame"
                                     % tuning.attach_fd_seconds) from None
        finally:
            sock.settimeout(None)
        if len(fds) != want:
            for fd in fds:
                os.close(fd)
            raise wire.ProtocolError("attach: expected %d descriptors, got %d"
                                     % (want, len(fds)))
        target = fds[0]
        bell_fds = fds[1:] if events else None
    elif spec.get("kind") == "named":
        target = spec.get("name")
        if not isinstance(target, str):
            raise wire.ProtocolError("attach: named region without a name")
    else:
        raise wire.ProtocolError("attach: unknown region kind %r" % (spec.get("kind"),))
    n_sets = spec.get("sets", 1)
    if type(n_sets) is not int:
        if isinstance(target, int):
            os.close(target)
        raise wire.ProtocolError("attach: region set count %r is not an integer" % (n_sets,))
    try:
        region = shm.Region.attach(target, size, slots, generation, n_sets, tuning=tuning)
    except BaseException:
        for fd in bell_fds or ():
            os.close(fd)
        raise
    return region, bell_fds
