"""Spawn one worker in a route's interpreter, talk to it, notice when it dies, end it.

The only module (with ``routes``) that starts processes. On one kernel a worker inherits
two descriptors, the control socket and the doorbell; across WSL↔Windows it connects back
over TCP to a port this client listens on (``transport="tcp"``, inline tensors only). In
both cases its stdin is a pipe whose first line is the secret (never argv) and which then
stays open as the death pipe: when this process dies, the worker's watchdog reads
end-of-file and exits. Its fd 1 and fd 2 go to a log file whose tail is attached to every
``WorkerDied``. It runs in a session of its own so ``close()`` can end the whole process
group, grandchildren included.

Death is seen from the process, not only from the socket: a thread waits on the worker process
itself (a pidfd where the OS has one, else ``waitid`` without reaping) and, when it exits, ends
its process group and shuts this side of the control socket and the doorbell down, so a wait
on either ends at once even while a process the worker started still holds the other end; and
every call first asks whether the worker has exited (``_exited``: ``waitid`` without reaping),
so a call made after an idle death is never sent (``WorkerDied`` with ``idle=True``).

A client belongs to the process that made it. In a forked child (``os.fork``, multiprocessing's
fork start method, a DataLoader worker) every entry point raises ``ForkedStage`` (its requests
and answers would mix with the parent's in the one region and socket), ``close()`` is a no-op
that leaves the parent's worker alone, and the child's copies of the death pipe, the control
socket and the doorbell are closed at the fork (``os.register_at_fork``), so a killed parent's
worker still sees end-of-file and exits.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from xstage import errors
from xstage.client import connect_back, copies, device_slots
from xstage.client.deadlines import Deadlines, DeadlineSocket
from xstage.client.pipeline import USE_DEADLINE, Outputs, Pipeline, StageFuture
from xstage.client.staging import local_hash, worker_argv
from xstage.home import LOG_KEEP_DEFAULT, hold_log, logs_dir, prune_logs
from xstage.signature import check_inputs, not_a_mapping, wire_order
from xstage_remote import PROTOCOL_VERSION, shm, sockspin, tuning, wire

__all__ = ["WorkerClient", "WorkerState"]

_LOG_TAIL_BYTES = 4096
#: The ``out`` of a call that gave none (read only: nothing is ever added to it).
_NO_OUT: Mapping[str, np.ndarray] = MappingProxyType({})


class WorkerState(enum.Enum):
    """Lifecycle of one worker; moves only forward."""

    UNSTARTED = "unstarted"  # constructed; no process yet
    STARTING = "starting"  # process spawned; waiting for its hello
    READY = "ready"  # hello checked; load/run/ping allowed
    CLOSING = "closing"  # shutdown sent; waiting for it to exit
    CLOSED = "closed"  # exited and reaped; resources released
    DEAD = "dead"  # died, timed out or broke protocol; every call raises StageClosed


#: Every client of this process: a forked child lets go of their descriptors at once.
_LIVE: weakref.WeakSet[WorkerClient] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: each client is the parent's, not ours."""
    for client in list(_LIVE):
        with contextlib.suppress(Exception):  # a handler must not fail the fork
            client._forked_away()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch_exit(client: weakref.ReferenceType[WorkerClient], pid: int, pidfd: int | None,
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
        live._exit_seen = True
        live._watch_pidfd = None  # closed below: a later fork's child must not close its number
    del live
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # what it started, holding its sockets or not
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    if pidfd is not None:
        os.close(pidfd)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _settings_usable(problems: Sequence[str]) -> None:
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


def _checked_settings(generation: int, depth: int, shm_mode: str | None,
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


class WorkerClient:
    """One worker process and the protocol to it.

    Calls are serialized by a lock (thread-safe). Every call has the deadline of its phase;
    a passed deadline kills the worker (its state is unknown), so the client becomes DEAD.
    """

    def __init__(
        self,
        interpreter: str,
        *,
        route: str = "ort-cpu",
        deadlines: Deadlines | None = None,
        shm_mode: str | None = None,
        env: Mapping[str, str] | None = None,
        transport: str = "local",
        listen_host: str = "127.0.0.1",
        connect_host: str | None = None,
        worker_path: Callable[[str], str] | None = None,
        end_tree: Callable[[int], None] | None = None,
        generation: int = 1,
        depth: int = 1,
        first_id: int = 1,
        concurrency: int = 1,
    ) -> None:
        """Set up a client; the worker starts in ``start()`` (or on entering ``with``).

        Args:
            interpreter: the route's Python, as this OS starts it.
            route: the route's name, for messages and log names.
            deadlines: per-phase limits (``Deadlines()`` when None).
            shm_mode: ``auto``, ``memfd``, ``named`` or ``off`` (default: the tuning's, ``XSTAGE_SHM``).
            env: the worker's environment (this process's when None).
            transport: ``local`` (inherited sockets, shared region) or ``tcp`` (connect-back,
                inline tensors; what a Windows worker started from WSL uses).
            listen_host: where the client listens for a ``tcp`` worker.
            connect_host: the address the worker dials (``listen_host`` when None).
            worker_path: maps a path on this side to the worker's view of it (WSL → Windows);
                applied to the staged package and every graph path. It must raise rather than
                hand over a path the worker cannot open.
            end_tree: ends the worker's whole process tree given the pid it reported in hello
                (a Windows tree is not this OS's process group).
            generation: this worker's generation in its stage (1 for the first worker, +1 per
                replacement); every frame and the region carry it (docs/wire.md).
            depth: slot sets in the shared region, i.e. requests in flight at once (``submit``
                queues the rest in the client).
            first_id: the first request id (a replacement worker continues its stage's ids).
            concurrency: requests of the region's sets the worker may compute at once (1 to
                ``depth``), where its runtime can (docs/serving.md, "Concurrent runs");
                ``concurrent`` says what the worker granted once the region is attached.
        """
        #: The transport's knobs, built once here (docs/configuration.md): the client's own
        #: (shared-memory mode, copy threads, the socket's spin) are read from it, and the
        #: worker is sent ``to_wire()`` in ``load``.
        self.tuning, self._tuning_problems = tuning.from_environ(os.environ)
        self.shm_mode = _checked_settings(generation, depth, shm_mode, transport, self.tuning)
        if type(concurrency) is not int or not 1 <= concurrency <= depth:
            raise errors.UsageError(f"concurrency {concurrency!r} is outside 1..{depth} (the depth)",
                                    remedy="compute at most as many requests at once as are in flight")
        self.depth = depth
        self.concurrency = concurrency
        #: Requests the worker computes at once, as it granted them (1 until a region is attached).
        self.concurrent = 1
        self.generation = generation
        self.interpreter = interpreter
        self.route = route
        self.deadlines = deadlines or Deadlines()
        self.transport = transport
        self.listen_host = listen_host
        self.connect_host = connect_host or listen_host
        self.worker_path = worker_path or (lambda p: p)
        self.end_tree = end_tree
        if transport == "tcp":
            self.shm_mode = "off"  # tensors travel inline across kernels
        self._env = dict(os.environ if env is None else env)
        self._owner, self._forked = os.getpid(), False  # its maker; True in a forked child
        _LIVE.add(self)
        self.state = WorkerState.UNSTARTED
        self.hello: dict[str, Any] | None = None  # the worker's hello, then its load's answer
        self.loaded: dict[str, Any] | None = None
        self.last_timing: dict[str, int] = {}
        self.log_path: Path | None = None
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._io: DeadlineSocket | None = None  # the control socket, one deadline per call
        self._channel: wire.Channel | None = None  # authenticated records (tcp transport)
        #: Binary ``run``/``result`` frames for the loaded signature, when the worker lists
        #: ``fast-frames`` in its hello and ``fast_frames`` is on (docs/wire.md).
        self._fast: wire.FastCodec | None = None
        self._forget_signatures()
        self.fast_frames = True
        self._tcp_hello: dict[str, Any] | None = None
        self.refused_peers: list[str] = []
        #: The TCP channel's spin before a blocking receive (``sockspin.SocketSpin``), and
        #: the worker's last time per call, which it is told as the answer's expected time.
        self._spin: Any = None
        self._spin_expected = 0.0
        self._bell: shm.Doorbell | None = None
        self._stdin: Any = None
        self._region: shm.Region | None = None
        self._next_id = first_id
        self._pipe = Pipeline(self)
        #: The state pairs the worker keeps (``load``'s ``options["state"]``).
        self.state_pairs: list[dict[str, Any]] = []
        self._reset_next = False
        #: An interrupted request of a stage with state that may have moved the state
        #: (``Pipeline._uncertain``): calls raise ``StateUncertain`` until ``reset_state()``,
        #: unless its answer says it never ran.
        self._state_uncertain: Any = None
        # The request whose reply has not been read yet: ("frame" | "shm", id). Set once the
        # request is wholly sent, cleared when its reply is read. A call interrupted between
        # the two closes the stage (``_interrupted``); were one left set, the next request
        # would first read and discard that reply (``_repair``).
        self._pending: tuple[str, int] | None = None
        self._closed_why: str | None = None  # why the stage was closed under a caller
        self._close_requested = False
        self._inputs: list[dict[str, Any]] = []
        self._accepted: set[tuple[Any, ...]] = set()
        self._observed: dict[str, int] = {}  # bytes seen per tensor name (fit_region)
        self._expected_s = 0.0  # moving average of the worker's compute time per call
        self._copy_in_ns = 0
        self._outputs: list[dict[str, Any]] = []
        #: Helper threads for large copies into and out of the region (``copies.py``; none
        #: start before the first such copy).
        self._copies = copies.CopyPool(self.tuning.copy_threads)
        #: Whether the watcher (``_watch_exit``) saw the worker process exit.
        self._exit_seen = False
        self._watch_socks: list[socket.socket] = []
        self._watch_pidfd: int | None = None  # the watcher's pidfd (closed by its thread)

    def _forget_signatures(self) -> None:
        """Drop what repeated calls of one signature kept (a new load starts without it).

        ``_lane``: the lean socket call's kept frame (``_lane_for``); ``_out_plan``: its
        reply's reading plan (``_collect_lean``); ``_reply``: that reply as the channel checks
        it in fewer steps (``wire._Expect``, TCP); ``_known``: the region path's last accepted
        input signature and its region (``_known_for``).
        """
        self._lane: Any = None
        self._out_plan: Any = None
        self._reply: Any = None
        self._known: tuple[tuple[Any, ...], Any] | None = None

    # ------------------------------------------------------------------ fork
    def _forked_away(self) -> None:
        """In a forked child: refuse every call from now on; let go of the parent's worker.

        This process's copies of the death pipe, the control socket and the doorbell are
        closed (never a shutdown, never a signal: the worker is the parent's). No lock is
        taken: another thread of the parent may have held one at the fork, and it stays held
        here.
        """
        self._forked = True
        for sock in (self._ctl, self._bell.sock if self._bell is not None else None):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()  # close(2) of this process's descriptor: no shutdown(2)
        if self._bell is not None:
            self._bell.close_eventfds()
        if self._stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._stdin.close()  # the death pipe's write end (its buffer is empty)
        for sock in self._watch_socks:  # the watcher's duplicates (its thread is not here)
            with contextlib.suppress(OSError):
                sock.close()
        if self._watch_pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._watch_pidfd)

    def _forked_error(self) -> errors.ForkedStage:
        return errors.ForkedStage(
            f"this {self.route} worker (pid {self.pid}) belongs to process {self._owner}; "
            f"process {os.getpid()} is a fork of it and may not use it (its requests and "
            "answers would mix with the parent's)",
            remedy="open the stage in the child process (after the fork: in a multiprocessing "
            "or DataLoader worker's initializer), or start children with the 'spawn' or "
            "'forkserver' method (docs/serving.md, \"Processes\")")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> WorkerClient:
        if self.state is WorkerState.UNSTARTED:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The worker's process id once spawned, else None."""
        return self._proc.pid if self._proc else None

    def start(self) -> dict[str, Any]:
        """Spawn the worker and check its hello (version, package hash, secret)."""
        if self._forked:
            raise self._forked_error()
        with self._lock:
            if self.state is not WorkerState.UNSTARTED:
                raise errors.StageClosed(f"worker is {self.state.value}; start it only once")
            self.state = WorkerState.STARTING
            try:
                self._spawn()
                self.hello = self._await_hello()
            except BaseException:
                self._abort()
                raise
            self.state = WorkerState.READY
            return self.hello

    def _spawn(self) -> None:
        _settings_usable(self._tuning_problems)
        secret = secrets.token_hex(16)
        self._secret = secret
        self.log_path = logs_dir() / (
            f"worker-{self.route.replace(':', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-"
            f"{secrets.token_hex(3)}.log"
        )
        listener = ctl_child = bell_child = None
        bell_parent = ctl_parent = None
        if self.transport == "tcp":
            listener = socket.create_server((self.listen_host, 0))
            port = listener.getsockname()[1]
            args = ["--connect", f"{self.connect_host}:{port}"]
            pass_fds: tuple[int, ...] = ()
        else:
            ctl_parent, ctl_child = shm.socketpair()
            bell_parent, bell_child = shm.socketpair()
            args = ["--ctl-fd", str(ctl_child.fileno()), "--bell-fd", str(bell_child.fileno())]
            pass_fds = (ctl_child.fileno(), bell_child.fileno())
        args += ["--generation", str(self.generation)]
        argv = worker_argv(self.interpreter, "worker", *args, path_map=self.worker_path)
        try:
            # 0600: a log may hold what the runtime printed about the caller's data
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            hold_log(fd)  # never pruned while the worker (or what it started) holds it open
            with open(fd, "wb") as log:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=log,
                    env=self._env,
                    pass_fds=pass_fds,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            for sock in (ctl_parent, bell_parent, listener):
                if sock is not None:
                    sock.close()
            raise errors.WorkerError(
                f"could not start the {self.route} interpreter {self.interpreter}: "
                f"{exc.strerror or exc}",
                remedy=f"check the interpreter path, or set XSTAGE_PYTHON_"
                f"{self.route.upper().replace('-', '_')} to a working Python",
            ) from exc
        finally:
            for sock in (ctl_child, bell_child):
                if sock is not None:
                    sock.close()
        self._stdin = self._proc.stdin
        try:
            self._stdin.write(secret.encode("ascii") + b"\n")
            self._stdin.flush()
        except OSError:
            pass  # it died at once; the hello wait reports how
        if listener is not None:
            ctl_parent = self._accept(listener)
        self._ctl = ctl_parent
        if ctl_parent is not None:
            self._io = DeadlineSocket(ctl_parent)
            if self._channel is not None:
                self._channel.sock = self._io  # records bounded by the call's deadline too
                # spin for a reply before blocking (sockspin: the shared region's policy);
                # a worker on this kernel (its hello's pid is our child's) is watched for a
                # shared CPU, as the region's caller does
                pid = ((self._tcp_hello or {}).get("worker") or {}).get("pid")
                peer_cpu = sockspin.proc_cpu(pid) if self._proc is not None \
                    and pid == self._proc.pid else None
                self._spin = sockspin.install(self._channel, self.tuning.spin_seconds,
                                              self._io.recv_nowait, peer_cpu)
                if self._spin is None:
                    sockspin.close_proc_cpu(peer_cpu)
        self._bell = shm.Doorbell(bell_parent) if bell_parent is not None else None
        self._watch_process()

    def _watch_process(self) -> None:
        """Start the thread that sees the worker exit (``_watch_exit``) and the call check."""
        proc = self._proc
        if proc is None:
            return
        pidfd = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(proc.pid)
        socks = [sock.dup() for sock in (self._ctl, self._bell.sock if self._bell else None)
                 if sock is not None]
        self._watch_socks, self._watch_pidfd = socks, pidfd
        threading.Thread(target=_watch_exit, args=(weakref.ref(self), proc.pid, pidfd, socks),
                         daemon=True, name=f"xstage-exit-{proc.pid}").start()

    def _exited(self) -> bool:
        """Whether the worker process has exited: ``waitid`` without waiting or reaping.

        ~1.5 µs, and safe from any thread (a ``poll`` object is not: two threads submitting
        at once made it raise). Its pid names it until ``Popen`` reaps it, which only this
        client does; reaped, it has exited.
        """
        if self._exit_seen:
            return True
        proc = self._proc
        if proc is None:
            return False
        if proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, proc.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped meanwhile
            return True

    def _idle_death(self) -> errors.WorkerDied:
        """``WorkerDied`` for a call that found the worker exited before it sent anything."""
        exc = self._died()
        exc.idle = True
        return exc

    def _accept(self, listener: socket.socket) -> socket.socket:
        """The worker's connect-back: the first peer to complete the handshake.

        The rest are closed; the winner's hello is checked like a local one, and every later
        frame is authenticated.
        """
        spawn, hello = self.deadlines.spawn, self.deadlines.hello
        total = None if spawn is None or hello is None else spawn + hello
        try:
            won = connect_back.accept_authenticated(
                listener, self._secret, None if total is None else time.monotonic() + total,
                alive=lambda: self._proc is not None and self._proc.poll() is None)
        except connect_back.NoPeer as exc:
            if exc.last_failure is not None and self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)  # a refused handshake ends the worker: say how
            exited = self._proc is not None and self._proc.poll() is not None
            if exc.last_failure is not None:  # a failed handshake says more than the exit
                raise errors.RemoteProtocolError(
                    "no peer completed the connect-back handshake"
                    + (f" and the worker {_describe_exit(self._proc.returncode)}"
                       if exited and self._proc is not None else "")
                    + f"; the last one failed: {exc.last_failure}",
                    remedy=f"see the worker's log {self.log_path} (its side of the check)"
                    if exited else None) from None
            if exited:
                raise self._died() from None
            timeout_cls = errors.SpawnTimeout if exc.reached == "accept" else errors.HelloTimeout
            raise timeout_cls(total or 0, pid=self.pid, log_tail=self.log_tail()) from None
        self._channel = won.channel
        self._tcp_hello = won.hello
        self.refused_peers = won.refused  # peers closed before the worker won (diagnostics)
        return won.sock

    def _await_hello(self) -> dict[str, Any]:
        assert self._ctl is not None and self._proc is not None
        import select

        spawn_s = self.deadlines.spawn
        if self._tcp_hello is not None:  # already read and proved by the handshake
            frame = wire.Frame(self._tcp_hello, b"", [])
        else:
            readable, _, _ = select.select([self._ctl], [], [], spawn_s)
            if not readable:
                raise errors.SpawnTimeout(spawn_s or 0, pid=self.pid, log_tail=self.log_tail())
            frame = self._recv("hello", self.deadlines.hello)
        if frame.op != "hello":
            raise errors.RemoteProtocolError(f"first frame is {frame.op!r}, expected hello")
        h = frame.header
        if h["v"] != PROTOCOL_VERSION:
            raise errors.RemoteProtocolError(
                f"worker speaks protocol v{h['v']}, this client v{PROTOCOL_VERSION}"
            )
        if h["package_hash"] != local_hash():
            raise errors.RemoteProtocolError(
                "worker package hash differs from the client's "
                f"({h['package_hash'][:12]} != {local_hash()[:12]})",
                remedy="remove the staged copy under XSTAGE_HOME/cache/remote and retry",
            )
        if frame.id != 0:
            raise errors.RemoteProtocolError(f"hello carries id {frame.id}, expected 0")
        worker_pid = h["worker"].get("pid")
        if not isinstance(worker_pid, int) or not hmac.compare_digest(
            h["auth"], wire.auth_token(self._secret, worker_pid)
        ):
            raise errors.RemoteProtocolError("worker hello does not prove the session secret")
        missing = {"inline"} - set(h["features"])
        if missing:
            raise errors.RemoteProtocolError(f"worker lacks required features {sorted(missing)}")
        self._check_generation(frame)
        return h

    def close(self) -> None:
        """End the worker (politely, then the whole group) and release everything. Idempotent.

        From another thread while a call is in flight, it kills the worker first, so the call
        ends at once with ``StageClosed`` saying so, then releases everything. In a forked
        child it does nothing: the worker is the parent's.
        """
        if self._forked:
            return
        if not self._lock.acquire(blocking=False):
            self._close_requested = True
            self._kill_group()
            self._lock.acquire()
        try:
            self._close_locked()
        finally:
            self._lock.release()
        self._pipe.close(errors.StageClosed(f"the {self.route} worker was closed"))
        self._pipe.release()
        self._copies.close()

    def _kill_group(self) -> None:
        """SIGKILL the worker's process group without touching descriptors (thread-safe)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _close_locked(self) -> None:
        if self.state in (WorkerState.CLOSED, WorkerState.UNSTARTED):
            self.state = WorkerState.CLOSED
            return
        if self.state is WorkerState.READY:
            self.state = WorkerState.CLOSING
            if self._pipe.device is not None:  # the device slots' mapping, before the worker ends
                self._pipe.device.release()
            with contextlib.suppress(errors.XstageError, OSError, errors.StageClosed,
                                     subprocess.TimeoutExpired):
                self._send({"op": "shutdown", "id": self._take_id()}, phase="shutdown")
                self._recv("shutdown", self.deadlines.shutdown)
                if self._proc is not None:
                    self._proc.wait(timeout=self.deadlines.shutdown)
        self._abort()
        self.state = WorkerState.CLOSED

    def _abort(self) -> None:
        """Kill the process group, reap, close descriptors and the region."""
        proc = self._proc
        worker_pid = (self.hello or {}).get("worker", {}).get("pid")
        if self.end_tree is not None and isinstance(worker_pid, int):
            with contextlib.suppress(Exception):  # best effort: the tree may be gone already
                self.end_tree(worker_pid)
            self.end_tree = None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        else:
            pass
        if proc is not None:
            # Anything the worker started in its session goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._region is not None:
            self._region.close()
            self._region = None
        if self._bell is not None:
            self._bell.close_eventfds()
        for closer in (self._ctl, self._bell.sock if self._bell else None):
            if closer is not None:
                closer.close()
        self._ctl = None
        self._io = None
        self._channel = None
        if self._spin is not None:
            sockspin.close_proc_cpu(self._spin.peer_cpu)
            self._spin.peer_cpu = None
        self._bell = None
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                self._stdin.close()
            self._stdin = None
        if self.state is not WorkerState.CLOSING:
            self.state = WorkerState.DEAD

    # ------------------------------------------------------------------ plumbing
    def log_tail(self, lines: int = 20) -> str:
        """The last lines the worker (or its native runtime) wrote."""
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def _died(self) -> errors.WorkerDied:
        code = None
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        exc = self._death_of(_describe_exit(code), exit_status=code, log_tail=self.log_tail())
        self._abort()
        self.state = WorkerState.DEAD
        return exc

    def _death_of(self, how: str, *, exit_status: int | None, log_tail: str) -> errors.WorkerDied:
        """``WorkerDied`` naming this worker's pid and generation and how it ended."""
        return errors.WorkerDied(
            f"the {self.route} worker (pid {self.pid}, generation {self.generation}) {how}",
            exit_status=exit_status,
            pid=self.pid,
            log_tail=log_tail,
            generation=self.generation,
            remedy=f"see its log {self.log_path}" if self.log_path else None,
        )

    #: What ``_translate`` turns into an xstage error (anything else passes as it is).
    _LOWER = (wire.PeerClosed, ConnectionError, TimeoutError, wire.ProtocolError)

    def _translate(self, exc: BaseException, phase: str, seconds: float | None) -> BaseException:
        """A lower-layer failure as the most specific xstage error (ends the worker)."""
        if isinstance(exc, (wire.PeerClosed, ConnectionError)):
            if self._close_requested:
                return self._closed_under_call()
            return self._died()
        if isinstance(exc, TimeoutError):
            timeout_cls = {
                "spawn": errors.SpawnTimeout,
                "hello": errors.HelloTimeout,
                "load": errors.LoadTimeout,
                "warmup": errors.WarmupTimeout,
                "call": errors.CallTimeout,
                "shutdown": errors.ShutdownTimeout,
            }[phase]
            tail = self.log_tail()
            pid = self.pid
            self._abort()
            return timeout_cls(seconds or 0, pid=pid, log_tail=tail)
        self._abort()
        return errors.RemoteProtocolError(f"worker {self.pid}: {exc}")

    def _closed_under_call(self) -> errors.StageClosed:
        self._abort()
        self._closed_why = "close() was called from another thread while this call was in flight"
        return errors.StageClosed(f"the {self.route} worker was closed: {self._closed_why}")

    def _break(self, why: str) -> None:
        """The stream's position is unknown (a frame half sent or half read): end the worker."""
        self._closed_why = why
        self._abort()

    def _send(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None,
              phase: str = "call") -> None:
        """Send one frame within ``phase``'s deadline (a stopped reader cannot hold us).

        The deadline starts here and covers the reply's ``_recv`` too (``DeadlineSocket``: the
        kernel's limits, set once per change, instead of a ``poll`` and two ``ioctl`` per
        system call).
        """
        io = self._io
        assert io is not None
        try:
            parts = None
            if self._fast is not None and header["op"] == "run":  # a binary call frame
                parts = wire.encode_fast(self._fast, "run", header["id"], self.generation,
                                         arrays, header.get("options"))
            if parts is None:
                parts = wire.encode_frame(wire.with_generation(header, self.generation), arrays)
        except wire.ProtocolError as exc:
            raise errors.LocalProtocolError(str(exc)) from exc
        seconds = getattr(self.deadlines, phase)
        io.start(seconds)
        if self._spin is not None:
            # Spin only for the reply to a call sent as one record: a reply other than a
            # call's is long (long_call), and where a large frame's transfer takes a
            # millisecond a spin saves one wake-up and takes the CPU the peer's copies,
            # MACs and runtime threads want (measured: docs/performance.md#sockwait).
            _, hlen, plen = wire.PREFIX.unpack_from(parts[0])
            small = header["op"] == "run" and wire.PREFIX.size + hlen + plen <= wire.SMALL_FRAME
            self._spin.expected = self._spin_expected if small else 60.0
        try:
            if self._channel is not None:  # authenticated records
                self._channel.send_parts(parts)
            else:
                wire.send_parts(io, parts)  # one sendmsg for a frame the kernel takes whole
        except self._LOWER as exc:
            raise self._translate(exc, phase, seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, OSError):
                self._break(f"a request was interrupted ({type(exc).__name__}) while it was "
                            "being sent; the worker holds part of a frame")
            raise

    def _recv(self, phase: str, seconds: float | None, *, fresh: bool = True) -> wire.Frame:
        """Read one frame within ``seconds``.

        ``fresh=False`` goes on with the deadline the request's ``_send`` started (one
        deadline per call). An interrupt (Ctrl-C) inside the read closes the stage at once,
        whether or not a byte of the frame had arrived: a signal handler runs between two
        bytecodes, so bytes taken from the socket may not be counted yet, and the next call
        must never read from the middle of a frame (it raises ``StageClosed`` saying why).
        """
        io = self._io
        if io is None:
            raise errors.StageClosed(f"worker is {self.state.value}")
        if fresh:
            io.start(seconds)
        else:
            io.got = 0
        try:
            if self._channel is not None:
                return self._channel.recv(codec=self._fast)
            return wire.recv_frame(io, codec=self._fast)
        except self._LOWER as exc:
            raise self._translate(exc, phase, seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError)):
                self._interrupted(exc)
            raise

    def _interrupted(self, exc: BaseException) -> None:
        """A call was interrupted between its request and its whole reply: close the stage."""
        if self._closed_why is None and self.state is WorkerState.READY:
            self._break(f"a call was interrupted ({type(exc).__name__}) before its reply was "
                        "read whole; the stream's position is unknown")

    def _check_generation(self, frame: wire.Frame) -> None:
        gen = frame.header.get(wire.GEN_FIELD)
        if gen != self.generation:
            self._abort()
            raise errors.RemoteProtocolError(
                f"the worker's {frame.op} #{frame.id} carries gen {gen!r}, "
                f"this stage's worker is generation {self.generation}")

    def _expect(self, frame: wire.Frame, op: str, rid: int) -> wire.Frame:
        if frame.id != rid or frame.op not in (op, "error"):
            self._abort()
            raise errors.RemoteProtocolError(
                f"expected {op} #{rid}, the worker sent {frame.op} #{frame.id}"
            )
        self._check_generation(frame)
        if frame.op == "error":
            h = frame.header
            raise errors.WorkerRaised(
                f"the {self.route} worker raised {h['kind']}: {h['message']}",
                kind=h["kind"],
                remote_traceback=h.get("traceback", ""),
                pid=self.pid,
            )
        return frame

    def _repair(self) -> None:
        """Read and discard the reply of a call that did not finish.

        A call interrupted after its request was sent leaves its reply unread; reading it
        here makes the next reply read the next request's.
        """
        pending = self._pending
        if pending is None:
            return
        _, rid = pending
        seconds = self.deadlines.call
        frame = self._recv("call", seconds)
        if frame.id != rid:
            self._abort()
            raise errors.RemoteProtocolError(
                f"the reply to interrupted request #{rid} was expected, the worker sent "
                f"{frame.op} #{frame.id}")
        self._check_generation(frame)
        self._pending = None

    def _call_timeout(self, phase: str, seconds: float | None) -> None:
        pid, tail = self.pid, self.log_tail()
        self._abort()
        timeout_cls = errors.WarmupTimeout if phase == "warmup" else errors.CallTimeout
        raise timeout_cls(seconds or 0, pid=pid, log_tail=tail)

    def _request(self, header: dict[str, Any], reply: str, phase: str,
                 arrays: Mapping[str, np.ndarray] | None = None) -> wire.Frame:
        self._require_ready()
        self._pipe.drain()  # region requests in flight are answered before any frame
        self._repair()
        rid = self._take_id()
        header = dict(header, id=rid)
        self._pending = ("frame", rid)  # before the send: no window where it is sent, unmarked
        try:
            self._send(header, arrays, phase)
        except BaseException as exc:
            self._pending = None  # not sent, or half sent and the worker ended (_break)
            if not isinstance(exc, (OSError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # or sent whole as the interrupt came: it will answer
            raise
        try:
            frame = self._recv(phase, getattr(self.deadlines, phase), fresh=False)
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # before the read began, too: the stage closes
            raise
        self._pending = None
        return self._expect(frame, reply, rid)

    def _require_ready(self) -> None:
        if self._closed_why is not None:
            raise errors.StageClosed(f"the {self.route} worker was closed: {self._closed_why}")
        if self.state is not WorkerState.READY:
            raise errors.StageClosed(
                f"the {self.route} worker is {self.state.value}"
                + ("; it died earlier, open a new one" if self.state is WorkerState.DEAD else "")
            )
        if self._exited():
            with self._lock:  # a driver may be finding the same death: one of us reports it
                if self.state is WorkerState.READY:
                    raise self._idle_death()
            self._require_ready()

    # ------------------------------------------------------------------ operations
    def ping(self) -> dict[str, Any]:
        """Liveness and the worker's memory (rss, peak).

        A torch-cuda worker adds its pinned region as it serves now (``streamed_bytes``: input
        bytes sent to the device ahead of their requests).
        """
        if self._forked:
            raise self._forked_error()
        with self._lock:
            return self._request({"op": "ping"}, "pong", "call").header.get("info", {})

    def device_inputs(self, *, timeout: float | None = None) -> dict[str, Any]:
        """A device slot set no request owns, reserved for the call given it, to write in place.

        ``device_tensors=on`` only. CUDA tensors by input name, views of one set's device
        input slots; a call given these tensors copies nothing in this process
        (``device_slots.DeviceSlots.inputs``). The set is reserved as ``input_slots`` reserves
        one: no request is published into it until the call given these tensors takes it;
        while every set is in flight or reserved this waits (at most ``timeout`` seconds).
        Ask again before each call. A device call of tensors of its own made while another
        caller's reserved set is next cannot go around it inline: it raises ``SlotsBusy``.

        Raises:
            UsageError: the stage serves no device tensors, or a ``timeout`` that is not a
                number of seconds >= 0.
            SlotsBusy: no set came free within ``timeout``.
            StageClosed: the worker was closed or died.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or not timeout >= 0):
            raise errors.UsageError(f"device_inputs(timeout={timeout!r}) is not a number of "
                                    "seconds >= 0", remedy="give seconds, or None to wait")
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        device = self._pipe.device
        if device is None:
            raise errors.UsageError(
                "device_inputs() on a stage opened without device tensors",
                remedy="open a torch-cuda stage with --ep-option device_tensors=on "
                "(open_stage(..., ep_options={'device_tensors': 'on'}))")
        region = self._region
        if region is None:
            raise errors.StageClosed(f"the {self.route} worker is {self.state.value}")
        device.open()
        s = self._reserve_set(region, timeout)
        views = device.reserved_inputs(s)  # tensors of their own: see hand_out
        self._pipe.hand_out(s, views)
        return views

    def input_slots(self, shapes: Mapping[str, Sequence[int]] | None = None, *,
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """A slot set no request owns, reserved for the call given it, to fill in place.

        Writable numpy views (little-endian, C-contiguous) of one set's input slots at each
        input's declared shape, or at ``shapes[name]`` where a dimension is not fixed. The set
        is reserved: no request is published into it until a call (``run`` or ``submit``)
        given these arrays takes it, and that call copies nothing into the region for them.
        While every set is in flight or reserved, this waits for one to come free (at most
        ``timeout`` seconds; None: no limit). Ask again before each call. Slots dropped
        without a call give their set back; a call made meanwhile with arrays of its own goes
        around a set reserved for another (inline, one frame each way).

        Raises:
            UsageError: no shared region (the socket transport, ``shm_mode="off"``), an input
                without a slot, a dimension neither fixed nor given, a shape that does not
                fit its slot, or a ``timeout`` that is not a number of seconds >= 0.
            SlotsBusy: no set came free within ``timeout``.
            StageClosed: the worker was closed or died.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or not timeout >= 0):
            raise errors.UsageError(f"input_slots(timeout={timeout!r}) is not a number of "
                                    "seconds >= 0", remedy="give seconds, or None to wait")
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        region = self._region
        if region is None or self.loaded is None:
            raise errors.UsageError(
                "input_slots() on a stage without a shared region",
                remedy="use the default transport with shm_mode 'auto' (the socket "
                "transport and shm_mode='off' copy every call's inputs into frames)")
        wanted = self._slot_shapes(region, shapes)
        s = self._reserve_set(region, timeout)
        views = {name: v.view() for name, v in   # objects of their own: see hand_out
                 region.slot_views("in", wanted, s).items()}
        self._pipe.hand_out(s, views)
        return views

    def _slot_shapes(self, region: shm.Region, shapes: Mapping[str, Sequence[int]] | None
                     ) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
        """Each input's (dtype, shape) for ``input_slots``, checked against its slot."""
        wanted = {}
        for d in self._inputs:
            name = d["name"]
            shape = tuple(shapes[name]) if shapes and name in shapes else tuple(d["shape"])
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                       for n in shape):
                raise errors.UsageError(
                    f"input {name!r} has dimensions that are not fixed: {shape}",
                    remedy=f"give them: input_slots(shapes={{{name!r}: (...)}})")
            dtype = wire.dtype_of_tag(d["dtype"], name).newbyteorder("<")
            cap = region.capacity("in", name)
            need = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if cap is None or need > cap:
                raise errors.UsageError(
                    f"input {name!r} at {shape} ({need} bytes) has no slot it fits "
                    f"({cap} bytes)", remedy="call with arrays of your own: a call too "
                    "large for its slots goes inline")
            wanted[name] = (dtype, shape)
        return wanted

    def _reserve_set(self, region: shm.Region, timeout: float | None) -> int:
        """A free set of ``region``, reserved; waits while none is (``input_slots``).

        The requests in flight are collected by whoever drives (the pump, started here if
        need be, or a synchronous caller); each set that comes free wakes the waiters.
        """
        pipe = self._pipe
        deadline = None if timeout is None else time.monotonic() + timeout
        with pipe.mu:
            while True:
                if pipe.closed or self._region is not region:
                    raise errors.StageClosed(f"the {self.route} worker is {self.state.value}"
                                             if self._region is None else
                                             "the shared region was replaced while waiting "
                                             "for a slot set")
                s = pipe.reserve(region.n_sets)
                if s is not None:
                    return s
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise errors.SlotsBusy(
                        f"no free slot set within {timeout:g} s: all {region.n_sets} slot "
                        f"sets of the {self.route} worker are in flight or reserved",
                        remedy="wait longer (a larger timeout, or None), take fewer slot "
                        "sets before calling with them, or open the stage with a larger "
                        "depth")
                pipe.slot_waiters += 1
                try:
                    pipe.mu.release()
                    try:
                        pipe._kick()  # someone collects what is in flight
                    finally:
                        pipe.mu.acquire()
                    # Woken by each set that comes free; the bound only re-checks a set a
                    # synchronous call let go of between our look and our wait.
                    pipe.freed.wait(0.25 if left is None else min(left, 0.25))
                finally:
                    pipe.slot_waiters -= 1

    def waits(self) -> dict[str, Any]:
        """The shared region's spin-or-block decisions so far, on both sides.

        Returns:
            ``{"caller": …, "worker": …}``, each the doorbell policy's counts by rule and by
            outcome with a ``line`` in words (``xstage_remote/waitpolicy.py``); ``{}`` for a
            side that has no region (inline frames, TCP) or a worker that does not say.
        """
        if self._forked:
            raise self._forked_error()
        caller = self._bell.summary() if self._bell is not None else {}
        worker = self.ping().get("doorbell", {}) if self.state is WorkerState.READY else {}
        return {"caller": caller, "worker": worker}

    def load(self, path: str | os.PathLike[str], *, runtime: str = "ort",
             options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Load a stage; then set up the shared region when the signature allows one.

        ``options["state"]`` (``[{"input", "output", "init": "zeros" | "file", "path"}]``)
        declares state pairs the worker keeps: their inputs are not the caller's to give, their
        outputs are not returned, and requests run one at a time (docs/serving.md).
        """
        if self._forked:
            raise self._forked_error()
        with self._lock:
            options = dict(options or {})
            state = [dict(p) for p in options.get("state") or []]
            for pair in state:
                if isinstance(pair.get("path"), str):
                    pair["path"] = self.worker_path(pair["path"])
            if state:
                options["state"] = state
            header = {"op": "load", "runtime": runtime, "path": self.worker_path(str(path)),
                      "options": options}
            if "tuning" in wire.OPS["load"]:  # the protocol of this package (and the worker's)
                header["tuning"] = self.tuning.to_wire()
            self._fast = None  # the worker drops its codec when a load starts
            self._forget_signatures()
            frame = self._request(header, "loaded", "load")
            self.loaded = frame.header
            if self.fast_frames and "fast-frames" in ((self.hello or {}).get("features") or ()):
                with contextlib.suppress(wire.ProtocolError):  # over 65535 names: JSON frames
                    self._fast = wire.FastCodec([d["name"] for d in frame.header["inputs"]],
                                                [d["name"] for d in frame.header["outputs"]])
            held_in = {p["input"] for p in state}
            held_out = {p["output"] for p in state}
            self._inputs = [d for d in frame.header["inputs"] if d["name"] not in held_in]
            self._accepted.clear()
            self._outputs = [d for d in frame.header["outputs"] if d["name"] not in held_out]
            self.state_pairs = state
            self._pipe.stateful = bool(state)
            if self.shm_mode != "off" and self._bell is not None:
                self._attach_region()
            self._pipe.device = device_slots.from_loaded(self, frame.header)  # #20
            return self.loaded

    @staticmethod
    def _capacity(decl: Mapping[str, Any]) -> int | None:
        n = wire.DTYPES[decl["dtype"]][1]
        for d in decl["shape"]:
            if not isinstance(d, int):
                return None
            n *= d
        return n

    def fit_region(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Size the shared region for these concrete tensors (inputs and/or outputs).

        A stage with symbolic dimensions gets no region at load (no slot can be sized from
        the declaration); once a caller knows its real shapes — the inputs it will send, the
        outputs the warm-up returned — the slots are sized from them, and later calls of that
        size take the shared path. Larger calls still go inline. Returns whether a region is
        attached afterwards.
        """
        if self._forked:
            raise self._forked_error()
        with self._lock:
            self._require_ready()
            if self.shm_mode == "off" or self._bell is None:
                return False
            for name, arr in arrays.items():
                self._observed[name] = int(np.asarray(arr).nbytes)
            if self._region is not None and self._region_fits(self._region):
                return True
            self._attach_region()
            return self._region is not None

    def _region_fits(self, region: shm.Region) -> bool:
        for role, decls in (("in", self._inputs), ("out", self._outputs)):
            for d in decls:
                need = self._observed.get(d["name"], self._capacity(d))
                if need is None:
                    continue
                have = region.capacity(role, d["name"])
                if have is None or have < need:
                    return False
        return True

    def _attach_region(self) -> None:
        def cap(d: Mapping[str, Any]) -> int | None:
            declared = self._capacity(d)
            seen = self._observed.get(d["name"])
            if declared is None:
                return seen
            return max(declared, seen or 0)

        slots, size = shm.plan_layout(
            [(d["name"], d["dtype"], cap(d)) for d in self._inputs],
            [(d["name"], d["dtype"], cap(d)) for d in self._outputs],
            sets=self.depth,
        )
        if slots is None:
            return
        kind = "memfd" if self.shm_mode in ("auto", "memfd") and hasattr(os, "memfd_create") \
            else "named"
        self._pipe.drain()
        self._repair()
        try:
            region = shm.Region.create(size, slots, kind, generation=self.generation,
                                       n_sets=self.depth)
        except shm.RegionSpaceError as exc:  # calls go inline (docs/workers.md)
            warnings.warn(f"{exc.strerror}: this worker's tensors travel inline; free space in "
                          f"{os.path.dirname(exc.filename)} or leave XSTAGE_SHM at auto (memfd)",
                          RuntimeWarning, stacklevel=2)
            return
        spec: dict[str, Any] = {"kind": kind, "size": size, "slots": slots, "sets": self.depth}
        if self.concurrency > 1:  # an older worker ignores the key: it runs one at a time
            spec["concurrent"] = self.concurrency
        if kind == "named":
            spec["name"] = region.name
        # The doorbell: a pair of eventfds sent with the memfd where both ends can (shm.Doorbell).
        events = shm.eventfd_pair() if kind == "memfd" and "bell-eventfd" in (
            (self.hello or {}).get("features") or ()) else None
        if events is not None:
            spec["bell"] = "eventfd"
        rid = self._take_id()
        try:
            self._send({"op": "attach", "id": rid, "region": spec}, phase="load")
            if kind == "memfd":
                assert self._ctl is not None
                socket.send_fds(self._ctl, [b"\0"], [region.fd, *(events or ())])
            attached = self._expect(self._recv("load", self.deadlines.load), "attached", rid)
            granted = (attached.header.get("info") or {}).get("concurrent", 1)
            self.concurrent = granted if type(granted) is int and 1 <= granted <= self.depth else 1
        except BaseException:
            region.close()
            for fd in events or ():
                os.close(fd)
            raise
        finally:
            region.handed_over()
        if self._region is not None:
            self._region.close()  # the worker let go of it when it attached the new one
        self._region = region
        if dma_reads_region(self.loaded):  # large inputs in announced chunks (shm.py)
            region.stream_fill = True
        elif self._copies.threads:
            region.use_copier(self._copies)
        self._pipe.reset_sets()
        assert self._bell is not None
        self._bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
        if events is not None:  # the worker waits on the first and rings the second
            self._bell.use_eventfds(events[1], events[0])

    def _check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if device_slots.on_device(self._pipe.device, inputs):  # device tensors (#20)
            return self._pipe.device.check(inputs)
        feeds = {name: np.asarray(value) for name, value in inputs.items()}
        # Calls usually repeat one signature: a checked one is remembered (a few µs a call).
        key = tuple((n, a.dtype, a.shape) for n, a in feeds.items())
        if key not in self._accepted:
            self._validate_feeds(feeds)
            if len(self._accepted) > 64:
                self._accepted.clear()
            self._accepted.add(key)
        return wire_order(feeds)  # the shared region holds little-endian bytes, as the wire

    def _validate_feeds(self, inputs: Mapping[str, np.ndarray]) -> None:
        check_inputs(inputs, self._inputs)

    def evidence(self) -> tuple[dict[str, Any], bytes | None]:
        """What the worker's runtime collected for the proof: facts, and the profile's bytes."""
        if self._forked:
            raise self._forked_error()
        with self._lock:
            frame = self._request({"op": "evidence"}, "evidence_data", "call")
            arrays = frame.arrays()
            profile = arrays.get(wire.PROFILE_TENSOR)
            return dict(frame.header["info"]), (bytes(profile) if profile is not None else None)

    def state_values(self) -> dict[str, np.ndarray]:
        """The state the last call left in the worker, by state output name (copies).

        For the numeric gate, which compares every state output at every call; a stage's
        state otherwise never crosses the wire.
        """
        with self._lock:
            frame = self._request({"op": "state"}, "state_data", "call")
            return {name: np.array(value) for name, value in frame.arrays().items()}

    def run(self, inputs: Mapping[str, Any], *,
            out: Mapping[str, np.ndarray] | None = None,
            phase: str = "call", views: bool = False) -> dict[str, np.ndarray]:
        """Run the loaded stage: outputs by name in graph order, C-contiguous, owned.

        ``out`` may hold preallocated C-contiguous arrays for some outputs (same dtype and
        shape as the result); those are filled in place and returned, saving an allocation
        per call on the shared-memory path. ``views=True``: outputs that come back through
        the shared region are read-only views of their slots instead (nothing copied out),
        valid until the request ``depth`` calls later is published (at depth 1, the next
        call); an ``out`` array is still filled. ``phase`` picks the deadline: ``call``, or
        ``warmup`` for the first, profiled run.
        """
        if self._forked:  # one attribute: a child of a fork (``_forked_away``)
            raise self._forked_error()
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            raise not_a_mapping(inputs, (s["name"] for s in (self.loaded or {}).get("inputs", ())))
        with self._lock:
            if self._exited() and self.state is WorkerState.READY:
                raise self._idle_death()  # nothing sent: a restarted stage serves this call
            if self._state_uncertain is not None:
                self._settle_state()
            lane = self._lane
            if lane is not None and out is None and phase == "call" and self._pending is None \
                    and not self._reset_next and type(inputs) is dict and self._region is None \
                    and self.state is WorkerState.READY and self._closed_why is None \
                    and not self._pipe.queue and not self._pipe.inflight:
                result = self._call_lean(lane, inputs)
                if result is not None:
                    return result
            known = self._known
            if known is not None and known[1] is self._region and out is None \
                    and phase == "call" and type(inputs) is dict \
                    and self.state is WorkerState.READY and self._closed_why is None:
                try:
                    key = tuple([(name, type(a), a.dtype, a.shape) for name, a in inputs.items()])
                except AttributeError:  # not an array
                    key = None
                if key == known[0]:  # accepted as they are, region path: see _known_for
                    return self._pipe.call(inputs, _NO_OUT, phase, views)
            self._require_ready()
            if self.loaded is None:
                raise errors.UsageError("run() before load()")
            feeds = self._check_inputs(inputs)
            if out is None and phase == "call":
                if self._region is None:
                    if self._fast is not None:
                        self._lane = self._lane_for(feeds, inputs)
                else:
                    self._known = self._known_for(feeds, inputs)
            return self._pipe.call(feeds, out or {}, phase, views)

    def _known_for(self, feeds: Mapping[str, np.ndarray],
                   inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], Any] | None:
        """The signature of inputs ``_check_inputs`` just accepted, for ``run`` to skip.

        Numpy arrays accepted as they are (in wire byte order, host memory), with the region
        they go through: a later call of the same (name, type, dtype, shape) skips the checks,
        as a socket call's lane does (~2 µs a call). Device tensors, converted inputs: None
        (checked each time).
        """
        if self._pipe.device is not None or type(inputs) is not dict \
                or any(feeds[name] is not value or type(value) is not np.ndarray
                       for name, value in inputs.items()):
            return None
        return (tuple([(name, type(a), a.dtype, a.shape) for name, a in inputs.items()]),
                self._region)

    def _lane_for(self, feeds: Mapping[str, np.ndarray],
                  inputs: Mapping[str, Any]) -> Any:
        """The lean call's lane (``_call_lean``) for inputs ``_check_inputs`` just accepted.

        Only for numpy arrays accepted as they are (already in wire byte order); else None.
        The lane is the signature's kept frame (``wire._Lane``), which knows its signature.
        """
        if self._fast is None or self._pipe.stateful or self._pipe.device is not None:
            return None
        if any(feeds[name] is not value for name, value in inputs.items()):
            return None  # converted (byte order, not an array): the long way each time
        return self._fast.lane(wire.FAST_RUN, self.generation, feeds)

    def _call_lean(self, lane: Any, inputs: dict[str, Any]) -> Outputs | None:
        """One call the common way, in fewer steps.

        The lock is held; nothing is pending, queued or in flight; no region, no state, no
        ``out``; the inputs are of the signature last accepted.

        The request is the signature's kept binary frame with its id packed in, sealed in
        place (``wire._Lane``, ``Channel.send_sealed``); the reply is checked as
        ``_expect`` checks it (id, op, generation) and its arrays read with the plan of the
        reply's checked descriptor list. None where the inputs are not that signature's
        (nothing sent): the caller takes the long way, which checks them.
        """
        frame_lane = lane
        rid = self._next_id
        try:
            if frame_lane.fill_same(rid, inputs) is None:  # not the signature: the long way
                return None
        except (ValueError, TypeError, BufferError, KeyError):  # not C-contiguous: the long way
            return None
        except struct.error as exc:
            raise errors.LocalProtocolError(f"binary run frame: {exc}") from exc
        self._next_id = rid + 1
        io = self._io
        channel = self._channel
        assert io is not None
        seconds = self.deadlines.call
        io.start(seconds)
        spin = self._spin
        if spin is not None:
            spin.expected = self._spin_expected
        self._pending = ("frame", rid)  # before the send, as _request
        try:
            if channel is not None:
                channel.send_sealed(frame_lane)
            else:
                io.sendall(frame_lane.frame)
        except self._LOWER as exc:
            self._pending = None
            raise self._translate(exc, "call", seconds) from exc
        except BaseException as exc:
            self._pending = None
            if not isinstance(exc, OSError):
                self._break(f"a request was interrupted ({type(exc).__name__}) while it was "
                            "being sent; the worker holds part of a frame")
            raise
        reply = self._reply
        try:
            if reply is None or channel is None:
                frame = self._recv("call", seconds, fresh=False)
            else:
                # The reply this call's signature makes (``_recv``, with the channel checking
                # it in fewer steps): any other frame comes back as a Frame, checked below.
                reply.rid = rid
                try:
                    frame = channel.recv(codec=self._fast, expect=reply)
                except self._LOWER as exc:
                    raise self._translate(exc, "call", seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # inside the read or before it began: the stage closes
            raise
        if reply is not None and channel is not None:
            if frame is reply:
                self._pending = None
                _, worker_ns, rss, peak = reply.fields
                self.last_timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak}
                self._spin_expected = worker_ns * 1e-9
                return self._planned(reply.payload)
        self._pending = None
        header = frame.header
        if header["id"] != rid or header["op"] != "result" or not frame.fast \
                or header.get(wire.GEN_FIELD) != self.generation:
            return self._finish_inline(self._expect(frame, "result", rid), {})
        timing = self.last_timing = header["timing"]  # decoded for this frame alone
        self._spin_expected = timing["worker_ns"] * 1e-9
        return self._collect_lean(frame)

    def _collect_lean(self, frame: wire.Frame) -> Outputs:
        """``_collect`` for a binary reply, with a reading plan per descriptor list.

        The codec hands back its one checked list for every reply of a signature: a list met
        before is read with the plan made from the first.
        """
        tensors = frame.tensors
        plan = self._out_plan
        if plan is None or tensors is not plan[0]:
            arrays = frame.arrays()
            result = self._collect(arrays, {})
            self._out_plan = self._reply = None
            if all(nbytes for _, _, _, _, nbytes in tensors) and len(tensors) == len(result):
                at = {name: (offset, shape) for name, _, shape, offset, _ in tensors}
                self._out_plan = (tensors, tuple(
                    (name, at[name][1], v.dtype, at[name][0]) for name, v in result.items()))
                if self._channel is not None and self._fast is not None \
                        and "state_reset" not in frame.header["timing"]:
                    # the next reply of this signature, checked by the channel in fewer
                    # steps: this one passed every check (_call_lean) to get here
                    self._reply = self._fast.expect(wire.FAST_RESULT, self.generation,
                                                    tensors, len(frame.payload))
            return result
        return self._planned(frame.payload)

    def _planned(self, payload: Any) -> Outputs:
        """A binary reply's ``payload`` read with ``_collect_lean``'s plan.

        Arrays viewing it, as ``Frame.arrays`` makes them (an unaligned one copied).
        """
        result = Outputs()
        for name, shape, dtype, offset in self._out_plan[1]:
            value = np.ndarray(shape, dtype, payload, offset)
            result[name] = value if value.flags.aligned else _fill(None, value, name)
        return result

    def _call_inline(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
                     phase: str, flags: int) -> Outputs:
        """A synchronous call as one frame each way, nothing queued or in flight (lock held).

        No request object, no queue; the reply's arrays are the outputs.
        """
        header: dict[str, Any] = {"op": "run"}
        if flags & shm.FLAG_RESET_STATE:
            header["options"] = {"reset_state": True}
        return self._finish_inline(self._request(header, "result", phase, arrays=feeds), out)

    def _finish_inline(self, frame: wire.Frame, out: Mapping[str, np.ndarray]) -> Outputs:
        """A ``result`` frame (checked by ``_expect``) as the call's outputs and timing."""
        timing = frame.header.get("timing")
        self.last_timing = dict(timing) if timing else {}
        self._spin_expected = self.last_timing.get("worker_ns", 0) * 1e-9
        result = self._collect(frame.arrays(), out)
        result.state_reset = bool(self.last_timing.get("state_reset"))
        return result

    def submit(self, inputs: Mapping[str, Any], *, timeout: Any = USE_DEADLINE) -> StageFuture:
        """Queue one call; its future's result is what ``run`` returns.

        At most ``depth`` requests are in flight in the worker; the rest wait in the client, in
        order. The deadline (``timeout`` seconds, ``None`` for none, by default the call
        deadline) runs from now.

        Raises:
            InputError: inputs that do not match the stage (checked before queuing).
            StageClosed: the worker was closed or died.
            UsageError: a ``timeout`` that is not a number of seconds > 0 or None.
        """
        seconds = self.deadlines.call if timeout is USE_DEADLINE else timeout
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(
                seconds, (int, float)) or not seconds > 0 or seconds == float("inf")):
            raise errors.UsageError(f"timeout={timeout!r} is not a number of seconds > 0",
                                    remedy="give seconds, or None for no limit")
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        if self.loaded is None:
            raise errors.UsageError("submit() before load()")
        if not isinstance(inputs, Mapping):
            raise not_a_mapping(inputs, (s["name"] for s in self.loaded.get("inputs", ())))
        if self._state_uncertain is not None:
            with self._lock:
                self._settle_state()
        return self._pipe.submit(self._check_inputs(inputs), seconds)

    def reset_state(self) -> None:
        """The next request (submitted after this) runs from the initial state.

        It also ends the doubt an interrupted call left (``StateUncertain``).
        """
        if self._forked:
            raise self._forked_error()
        self._reset_next = True
        self._state_uncertain = None

    def _state_settled(self, req: Any) -> None:
        """The interrupted request ``req`` never ran (its answer says so): the state stands."""
        if self._state_uncertain is req:
            self._state_uncertain = None

    def _settle_state(self) -> None:
        """Before a call that follows an interrupted one of a stage with state (lock held).

        The interrupted request's answer is collected first (it says whether it ran); if it
        ran, or may have, the call is refused.

        Raises:
            StateUncertain: the interrupted call may have moved the state.
        """
        if self._pipe.inflight:
            self._pipe.drain()
        if self._state_uncertain is not None:
            raise errors.StateUncertain(
                f"request #{self._state_uncertain.rid} to the {self.route} worker was "
                "interrupted after the worker took it: the state it keeps may have moved by "
                "that call, so the next call would run on a state you cannot know",
                remedy="call reset_state() to run the next call from the initial state "
                "(docs/serving.md, \"State that stays in the worker\")")

    def _take_reset(self) -> int:
        if not self._reset_next:
            return 0
        self._reset_next = False
        return shm.FLAG_RESET_STATE

    def in_flight(self) -> int:
        """Requests queued or in flight (not yet answered)."""
        return len(self._pipe.queue) + len(self._pipe.inflight)

    def _collect(self, arrays: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray]) -> Outputs:
        """The outputs of a reply frame just read, by name in graph order.

        ``arrays`` view that frame's payload, which nothing else holds, so each is returned as
        it is (no copy), unless the caller gave an ``out`` array for it or it sits unaligned in
        the payload (then copied).
        """
        result = Outputs()
        for d in self._outputs:
            name = d["name"]
            value = arrays[name]
            target = out.get(name)
            if target is None and value.flags.aligned and value.flags.writeable:
                result[name] = value
            else:
                result[name] = _fill(target, value, name)
        return result

    def _fill_output(self, target: np.ndarray | None, value: np.ndarray, name: str) -> np.ndarray:
        """A region output copied out (``_fill``), a large one on the copy threads."""
        return _fill(target, value, name, self._copies)


def _fill(target: np.ndarray | None, value: np.ndarray, name: str,
          pool: copies.CopyPool | None = None) -> np.ndarray:
    """Copy ``value`` into ``target`` when given (checked), else into a new owned array.

    ``pool``, when given, splits a large copy (and a new array's first touch) across threads.
    """
    if target is None:
        if pool is not None:
            return pool.empty_copy(value)
        return np.array(value, copy=True, order="C")
    if target.dtype != value.dtype or target.shape != value.shape or not target.flags.c_contiguous:
        raise errors.InputError(
            f"out[{name!r}] is {target.dtype}{tuple(target.shape)}, the output is "
            f"{value.dtype}{tuple(value.shape)}",
            remedy="pass a C-contiguous array of the output's dtype and shape, or no out",
        )
    if pool is not None:
        pool.copyto(target, value)
    else:
        np.copyto(target, value)
    return target
