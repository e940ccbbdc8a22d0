"""A worker process's lifecycle around its client: states, exit watching, forks, settings.

The pieces of ``client/worker.py``'s lifecycle that hold no client state: the ``WorkerState``
machine, the thread that sees the worker exit (``watch_exit``), the fork handler that makes a
forked child let go of its parent's workers (``LIVE``), and the checks run before a worker is
started (``checked_settings``, ``settings_usable``).
"""

from __future__ import annotations

import contextlib
import enum
import os
import select
import signal
import socket
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from xstage import errors
from xstage.home import LOG_KEEP_DEFAULT, prune_logs
from xstage_remote import shm, tuning, wire

__all__ = ["LIVE", "Lifecycle", "WorkerState", "checked_settings", "describe_exit",
           "dma_reads_region", "settings_usable", "watch_exit"]


class WorkerState(enum.Enum):
    """Lifecycle of one worker; moves only forward."""

    UNSTARTED = "unstarted"  # constructed; no process yet
    STARTING = "starting"  # process spawned; waiting for its hello
    READY = "ready"  # hello checked; load/run/ping allowed
    CLOSING = "closing"  # shutdown sent; waiting for it to exit
    CLOSED = "closed"  # exited and reaped; resources released
    DEAD = "dead"  # died, timed out or broke protocol; every call raises StageClosed


class Lifecycle(Protocol):
    """What this module's threads and fork handler ask of a worker client."""

    def forked_away(self) -> None:
        """In a forked child: refuse every call from now on; let go of the parent's worker."""

    def saw_exit(self) -> None:
        """The watcher saw the worker process exit (its pidfd is closed by the watcher)."""


#: Every client of this process: a forked child lets go of their descriptors at once.
LIVE: weakref.WeakSet[Lifecycle] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: each client is the parent's, not ours."""
    for client in list(LIVE):
        with contextlib.suppress(Exception):  # a handler must not fail the fork
            client.forked_away()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def watch_exit(client: weakref.ReferenceType[Lifecycle], pid: int, pidfd: int | None,
                socks: list[socket.socket]) -> None:
    """Wait for worker ``pid`` to exit; then end its group and wake whoever waits on it.

    ``socks`` are this thread's own duplicates of the control socket and the doorbell:
    ``shutdown`` on them ends a blocked receive on the client's descriptors (the same
    sockets) without racing their ``close``. The worker is not reaped here (the pidfd and
    ``WNOWAIT`` leave it to ``Popen``), so its pid, and its group's id, name it still.
    """
    try:
        if pidfd is not None:
            waiter = select.poll()  # this thread's own (select() would refuse fds past 1024)
            waiter.register(pidfd, select.POLLIN)
            while not waiter.poll():  # readable once the process has exited
                pass
        else:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # reaped already: it exited
    live = client()
    if live is not None:
        live.saw_exit()  # its pidfd is closed below: a later fork's child must not close it
    del live
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # what it started, holding its sockets or not
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    if pidfd is not None:
        os.close(pidfd)


def describe_exit(code: int | None) -> str:
    """How a worker ended, from ``Popen.returncode``, for a message ("exited with status 1")."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def settings_usable(problems: Sequence[str]) -> None:
    """Refuse to start a worker on a malformed ``XSTAGE_*`` setting; prune old logs.

    ``problems`` are the transport tuning's (``tuning.from_environ``), one line per malformed
    variable.

    Raises:
        UsageError: a malformed ``XSTAGE_MAX_REGION_BYTES``, ``XSTAGE_SPIN_SECONDS`` (…) or
            ``XSTAGE_LOG_KEEP`` (the message names the variable and a valid value).
    """
    if problems:
        raise errors.UsageError(problems[0])
    try:
        prune_logs()
    except ValueError as exc:
        raise errors.UsageError(str(exc), remedy="unset XSTAGE_LOG_KEEP for the default, "
                                f"{LOG_KEEP_DEFAULT}") from None


def dma_reads_region(loaded: Mapping[str, Any] | None) -> bool:
    """True when the worker's device reads the inputs from the region by DMA.

    torch-cuda's pinned region: there the inputs are copied in by the calling thread alone.
    Why: on the H200, with a 4.8 MB input (``benchmarks/gpu_stage.py``'s conv-224, helpers
    on against off in the same run, four runs), the split copy never made the caller faster
    (0 to 55 µs slower) and the worker's DMA and compute took 32-145 µs longer every time
    (docs/performance.md#copies); why is not known (the ORT path, which the CPU reads, gains).
    """
    acc = ((loaded or {}).get("info") or {}).get("accelerator")
    pinned = acc.get("pinned_region") if isinstance(acc, dict) else None
    return isinstance(pinned, dict) and pinned.get("state") in ("pending", "registered")


def checked_settings(generation: int, depth: int, shm_mode: str | None,
                      transport: str, tuned: tuning.TransportTuning) -> str:
    """The shared-region mode a client runs with; a usage error for any setting out of range."""
    if type(generation) is not int or not 1 <= generation <= wire.MAX_GENERATION:
        raise errors.UsageError(f"generation {generation!r} is outside [1, 2^32)")
    if type(depth) is not int or not 1 <= depth <= shm.MAX_SETS:
        raise errors.UsageError(f"depth {depth!r} is outside 1..{shm.MAX_SETS}",
                                remedy="give a whole number of requests in flight, e.g. 2")
    mode = shm_mode or tuned.shm  # a malformed XSTAGE_SHM is one of the tuning's problems
    if mode not in tuning.SHM_MODES:
        raise errors.UsageError(f"shm_mode={mode!r} is not one of {', '.join(tuning.SHM_MODES)}")
    if transport not in ("local", "tcp"):
        raise errors.UsageError(f"transport {transport!r} is not one of local, tcp")
    return mode

