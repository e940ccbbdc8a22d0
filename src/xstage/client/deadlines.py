"""Per-phase deadlines for a worker: each phase has its own limit and its own timeout class.

``DeadlineSocket`` holds one call's deadline on the control socket with the kernel's own
send and receive limits (one mechanism per call, not one per system call).
"""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from xstage import errors

__all__ = ["PHASES", "DeadlineSocket", "Deadlines", "parse_timeouts"]

#: The phases, in the order a worker passes through them.
PHASES = ("spawn", "hello", "load", "warmup", "call", "shutdown")


@dataclass(frozen=True)
class Deadlines:
    """Seconds allowed per phase; ``None`` means no limit.

    The defaults are generous where devices are slow to start: an NPU compile of a large
    graph takes many minutes, so ``load`` and ``warmup`` default to 30 minutes, while a
    worker that has not said hello after a minute is broken, not slow.
    """

    spawn: float | None = 30.0
    hello: float | None = 60.0
    load: float | None = 1800.0
    warmup: float | None = 1800.0
    call: float | None = 600.0
    shutdown: float | None = 5.0

    def __post_init__(self) -> None:
        for name in ("spawn", "hello", "load", "warmup", "call", "shutdown"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"deadline {name}={value!r} must be positive or None")


def parse_timeouts(items: Iterable[str], base: Deadlines | None = None) -> Deadlines | None:
    """``--timeout PHASE=SECONDS`` (repeatable) → ``Deadlines``; None when none was given.

    Raises:
        UsageError: an item is not ``PHASE=SECONDS``, names an unknown phase or a phase
            twice, or gives seconds that are not a finite number > 0.
    """
    given: dict[str, float] = {}
    for item in items:
        phase, sep, raw = item.partition("=")
        phase = phase.strip()
        if not sep:
            raise errors.UsageError(f"--timeout {item!r} is not PHASE=SECONDS",
                                    remedy="e.g. --timeout call=30 --timeout warmup=600")
        if phase not in PHASES:
            raise errors.UsageError(f"--timeout names an unknown phase {phase!r}",
                                    remedy=f"phases: {', '.join(PHASES)}")
        if phase in given:
            raise errors.UsageError(f"--timeout names {phase} twice")
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds <= 0:
            raise errors.UsageError(f"--timeout {phase}={raw!r} is not a number of seconds > 0",
                                    remedy=f"e.g. --timeout {phase}=30")
        given[phase] = seconds
    if not given:
        return base
    return replace(base or Deadlines(), **given)


#: How far past its deadline one system call may end before the timeout the kernel holds is
#: set again: small against any phase, large against a call's few microseconds of Python.
REARM_SLACK_S = 1e-3
_TIMEVAL = struct.Struct("@ll")
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class DeadlineSocket:
    """A blocking stream socket whose sends and receives end by one deadline per call.

    ``start(seconds)`` opens a call; every ``send``/``recv`` after it is bounded by the
    kernel (``SO_SNDTIMEO``/``SO_RCVTIMEO``), set only when the limit changes: a call of the
    phase's usual length makes exactly its own sends and receives, with no ``poll`` before
    each and no ``ioctl`` switching the descriptor between modes (what ``settimeout`` does).
    Between two system calls of one call the remaining time is compared with the limit the
    kernel holds; when a call could end more than ``REARM_SLACK_S`` past its deadline, the
    limit is set to what remains (a long frame's later reads), and a deadline already passed
    raises ``TimeoutError`` before the next system call. A kernel timeout raises
    ``TimeoutError`` too. ``got`` counts the bytes received since ``start``: zero means an
    interrupted receive consumed nothing, so the stream is still whole.

    Only the wire's calls go through here; the socket itself stays available (``sock``) for
    descriptors passed alongside and for ``select``.
    """

    __slots__ = ("sock", "deadline", "got", "_armed", "_seconds")

    def __init__(self, sock: socket.socket) -> None:
        """Wrap ``sock`` (made blocking: the kernel's limits replace Python's timeout)."""
        sock.settimeout(None)
        self.sock = sock
        self.deadline: float | None = None
        self.got = 0
        self._seconds: float | None = None
        #: The limit the kernel holds per direction (SO_SNDTIMEO, SO_RCVTIMEO); 0: none.
        self._armed = [0.0, 0.0]

    def fileno(self) -> int:
        """The socket's descriptor (for ``select``)."""
        return self.sock.fileno()

    def start(self, seconds: float | None) -> None:
        """Open a call of at most ``seconds`` (None: no limit) from now."""
        self.got = 0
        self._seconds = seconds
        if seconds is None:
            self.deadline = None
            limit = 0.0
        else:
            self.deadline = time.monotonic() + seconds
            limit = seconds
        if self._armed[0] != limit:
            self._arm(0, limit)
        if self._armed[1] != limit:
            self._arm(1, limit)

    def _arm(self, direction: int, seconds: float) -> None:
        whole = int(seconds)
        micros = int((seconds - whole) * 1e6)
        if seconds and not whole and not micros:
            micros = 1  # 0 means "no limit" to the kernel
        option = socket.SO_SNDTIMEO if direction == 0 else socket.SO_RCVTIMEO
        self.sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, micros))
        self._armed[direction] = seconds

    def _bound(self, direction: int) -> None:
        """Before a system call: a passed deadline raises; a limit too long is shortened."""
        deadline = self.deadline
        if deadline is None:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the deadline of {self._seconds}s passed")
        if self._armed[direction] > left + REARM_SLACK_S:
            self._arm(direction, left)

    def _expired(self) -> TimeoutError:
        return TimeoutError(f"no progress on the socket within the deadline of {self._seconds}s")

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """``socket.recv_into`` within the call's deadline."""
        self._bound(1)
        try:
            k = self.sock.recv_into(buffer, nbytes)
        except BlockingIOError:
            raise self._expired() from None
        self.got += k
        return k

    def recv_nowait(self, buffer: Any) -> int | None:
        """``recv_into`` that does not block: the bytes received (0: end of file), or None.

        None means nothing is there yet. A passed deadline raises ``TimeoutError`` (a spin
        polls through here, so it ends by the call's deadline).
        """
        deadline = self.deadline
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"the deadline of {self._seconds}s passed")
        try:
            k = self.sock.recv_into(buffer, 0, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        self.got += k
        return k

    def send(self, data: Any) -> int:
        """``socket.send`` within the call's deadline."""
        self._bound(0)
        try:
            return self.sock.send(data)
        except BlockingIOError:
            raise self._expired() from None

    def sendmsg(self, buffers: Any) -> int:
        """``socket.sendmsg`` within the call's deadline."""
        self._bound(0)
        try:
            return self.sock.sendmsg(buffers)
        except BlockingIOError:
            raise self._expired() from None

    def sendall(self, data: Any) -> None:
        """Send every byte of ``data``, each system call within the call's deadline."""
        sent = self.send(data)  # a small frame: the kernel takes it whole, one system call
        if sent == (data.nbytes if type(data) is memoryview else len(data)):
            return
        view = memoryview(data).cast("B")[sent:]
        while view:
            view = view[self.send(view):]
