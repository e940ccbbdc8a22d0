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
import hmac
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xstage import errors
from xstage.client import connect_back, copies, device_slots
from xstage.client.calls import Calls
from xstage.client.deadlines import Deadlines
from xstage.client.pipeline import Pipeline
from xstage.client.process import (
    LIVE,
    WorkerState,
    checked_settings,
    describe_exit,
    dma_reads_region,
    settings_usable,
    watch_exit,
)
from xstage.client.region import SharedRegion
from xstage.client.staging import local_hash, worker_argv
from xstage.client.transport import InlineFrames, SocketChannel, Transport
from xstage.home import hold_log, logs_dir
from xstage_remote import PROTOCOL_VERSION, shm, sockspin, tuning, wire

__all__ = ["WorkerClient", "WorkerState"]

_LOG_TAIL_BYTES = 4096


class WorkerClient(Calls):
    """One worker process, its lifecycle, and the one transport to it.

    The lifecycle is here (spawn, hello, load, close, liveness); the call API comes from
    ``Calls`` (``client/calls.py``); the bytes travel by ``link``, the transport chosen once
    at spawn (``client/transport.py``). Calls are serialized by a lock (thread-safe). Every
    call has the deadline of its phase; a passed deadline kills the worker (its state is
    unknown), so the client becomes DEAD.
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
        self.shm_mode = checked_settings(generation, depth, shm_mode, transport, self.tuning)
        self._check_concurrency(concurrency, depth)
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
        LIVE.add(self)
        self.state = WorkerState.UNSTARTED
        self.hello: dict[str, Any] | None = None  # the worker's hello, then its load's answer
        self.loaded: dict[str, Any] | None = None
        self.log_path: Path | None = None
        #: Held by whoever drives the worker (a call, the pump, a load).
        self.lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        #: The transport, chosen once at spawn (``client/transport.py``): the shared region's
        #: (``SharedRegion``), inline frames, or the socket channel's (TCP); None before.
        self.link: Any = None
        self._channel: wire.Channel | None = None  # the handshake's channel (tcp transport)
        #: Binary ``run``/``result`` frames for the loaded signature, when the worker lists
        #: ``fast-frames`` in its hello and ``fast_frames`` is on (docs/wire.md).
        self.fast_frames = True
        self._tcp_hello: dict[str, Any] | None = None
        self.refused_peers: list[str] = []
        self._stdin: Any = None
        self._spare_bell: socket.socket | None = None  # inline frames' unused doorbell
        self._init_calls(first_id)  # the call API's own state (``Calls``)
        #: The requests queued and in flight; a stage's restart adopts the queued ones into the
        #: next generation's (``Stage._on_death``).
        self.pipeline = Pipeline(self)
        #: The state pairs the worker keeps (``load``'s ``options["state"]``).
        self.state_pairs: list[dict[str, Any]] = []
        self.closed_why: str | None = None  # why the stage was closed under a caller
        self.close_requested = False

        #: Helper threads for large copies into and out of the region (``copies.py``; none
        #: start before the first such copy).
        self._copies = copies.CopyPool(self.tuning.copy_threads)
        #: Whether the watcher (``process.watch_exit``) saw the worker process exit.
        self._exit_seen = False
        self._watch_socks: list[socket.socket] = []
        self._watch_pidfd: int | None = None  # the watcher's pidfd (closed by its thread)

    # ------------------------------------------------------------------ fork
    def saw_exit(self) -> None:
        """The watcher (``process.watch_exit``) saw the worker exit; it closes its pidfd."""
        self._exit_seen = True
        self._watch_pidfd = None  # a later fork's child must not close its number

    def forked_away(self) -> None:
        """In a forked child: refuse every call from now on; let go of the parent's worker.

        This process's copies of the death pipe, the control socket and the doorbell are
        closed (never a shutdown, never a signal: the worker is the parent's). No lock is
        taken: another thread of the parent may have held one at the fork, and it stays held
        here.
        """
        self._forked = True
        bell = self.link.bell if self.link is not None else None
        for sock in (self._ctl, bell.sock if bell is not None else None, self._spare_bell):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()  # close(2) of this process's descriptor: no shutdown(2)
        if bell is not None:
            bell.close_eventfds()
        if self._stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._stdin.close()  # the death pipe's write end (its buffer is empty)
        for sock in self._watch_socks:  # the watcher's duplicates (its thread is not here)
            with contextlib.suppress(OSError):
                sock.close()
        if self._watch_pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._watch_pidfd)

    @property
    def forked(self) -> bool:
        """True in a forked child of the worker's maker (``forked_away``)."""
        return self._forked

    def check_not_forked(self) -> None:
        """Raise ``ForkedStage`` in a forked child of the worker's maker.

        No lock is taken: one the parent's threads held at the fork stays held here.
        """
        if self._forked:
            raise self._forked_error()

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
        with self.lock:
            if self.state is not WorkerState.UNSTARTED:
                raise errors.StageClosed(f"worker is {self.state.value}; start it only once")
            self.state = WorkerState.STARTING
            try:
                self._spawn()
                self.hello = self._await_hello()
            except BaseException:
                self.abort()
                raise
            self.state = WorkerState.READY
            return self.hello

    def _spawn(self) -> None:
        settings_usable(self._tuning_problems)
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
            self.link = self._choose(ctl_parent, bell_parent)
        elif bell_parent is not None:
            bell_parent.close()
        self._watch_process()

    def _choose(self, ctl: socket.socket, bell: socket.socket | None) -> Transport:
        """The transport, chosen once: the channel (TCP), the region's, or inline frames."""
        if self._channel is not None:
            self._channel.mac_threads = wire.mac_threads_of(self.tuning)
            link = SocketChannel(ctl, self._channel)
            # spin for a reply before blocking (sockspin: the shared region's policy); a
            # worker on this kernel (its hello's pid is our child's) is watched for a shared
            # CPU, as the region's caller does
            pid = ((self._tcp_hello or {}).get("worker") or {}).get("pid")
            link.watch(self.tuning.spin_seconds, sockspin.proc_cpu(pid)
                       if self._proc is not None and pid == self._proc.pid else None, self.tuning)
            return link
        if bell is not None and self.shm_mode != "off":
            return SharedRegion(ctl, bell, self._copies, self.tuning)
        self._spare_bell = bell  # never rung: the worker's end stays open, as it expects
        return InlineFrames(ctl)

    def _watch_process(self) -> None:
        """Start the thread that sees the worker exit (``process.watch_exit``) and the call check."""
        proc = self._proc
        if proc is None:
            return
        pidfd = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(proc.pid)
        bell = self.link.bell if self.link is not None else None
        socks = [sock.dup() for sock in (self._ctl, bell.sock if bell is not None else None)
                 if sock is not None]
        self._watch_socks, self._watch_pidfd = socks, pidfd
        threading.Thread(target=watch_exit, args=(weakref.ref(self), proc.pid, pidfd, socks),
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
        exc = self.died()
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
                    + (f" and the worker {describe_exit(self._proc.returncode)}"
                       if exited and self._proc is not None else "")
                    + f"; the last one failed: {exc.last_failure}",
                    remedy=f"see the worker's log {self.log_path} (its side of the check)"
                    if exited else None) from None
            if exited:
                raise self.died() from None
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
            frame = self.recv("hello", self.deadlines.hello)
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
        if not self.lock.acquire(blocking=False):
            self.close_requested = True
            self._kill_group()
            self.lock.acquire()
        try:
            self._close_locked()
        finally:
            self.lock.release()
        self.pipeline.close(errors.StageClosed(f"the {self.route} worker was closed"))
        self.pipeline.release()
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
            if self.pipeline.device is not None:  # the device slots' mapping, before the worker ends
                self.pipeline.device.release()
            with contextlib.suppress(errors.XstageError, OSError, errors.StageClosed,
                                     subprocess.TimeoutExpired):
                self._send({"op": "shutdown", "id": self.take_id()}, phase="shutdown")
                self.recv("shutdown", self.deadlines.shutdown)
                if self._proc is not None:
                    self._proc.wait(timeout=self.deadlines.shutdown)
        self.abort()
        self.state = WorkerState.CLOSED

    def abort(self) -> None:
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
        if self.link is not None:
            self.link.close()  # the region, the doorbell, the spin's reader
        if self._ctl is not None:
            self._ctl.close()
        self._ctl = None
        self._channel = None
        if self._spare_bell is not None:
            self._spare_bell.close()
            self._spare_bell = None
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

    def take_id(self) -> int:
        """The next request id (ids never repeat in a stage)."""
        rid = self._next_id
        self._next_id += 1
        return rid

    def died(self) -> errors.WorkerDied:
        """``WorkerDied`` for a worker found dead (reaped; its transport released)."""
        code = None
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        exc = self.death_of(describe_exit(code), exit_status=code, log_tail=self.log_tail())
        self.abort()
        self.state = WorkerState.DEAD
        return exc

    def death_of(self, how: str, *, exit_status: int | None, log_tail: str) -> errors.WorkerDied:
        """``WorkerDied`` naming this worker's pid and generation and how it ended."""
        return errors.WorkerDied(
            f"the {self.route} worker (pid {self.pid}, generation {self.generation}) {how}",
            exit_status=exit_status,
            pid=self.pid,
            log_tail=log_tail,
            generation=self.generation,
            remedy=f"see its log {self.log_path}" if self.log_path else None,
        )

    def _check_generation(self, frame: wire.Frame) -> None:
        gen = frame.header.get(wire.GEN_FIELD)
        if gen != self.generation:
            self.abort()
            raise errors.RemoteProtocolError(
                f"the worker's {frame.op} #{frame.id} carries gen {gen!r}, "
                f"this stage's worker is generation {self.generation}")

    def _require_ready(self) -> None:
        if self.closed_why is not None:
            raise errors.StageClosed(f"the {self.route} worker was closed: {self.closed_why}")
        if self.state is not WorkerState.READY:
            raise errors.StageClosed(
                f"the {self.route} worker is {self.state.value}"
                + ("; it died earlier, open a new one" if self.state is WorkerState.DEAD else "")
            )
        if self._exited():
            with self.lock:  # a driver may be finding the same death: one of us reports it
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
        with self.lock:
            return self.request({"op": "ping"}, "pong", "call").header.get("info", {})

    def waits(self) -> dict[str, Any]:
        """The shared region's spin-or-block decisions so far, on both sides.

        Returns:
            ``{"caller": …, "worker": …}``, each the doorbell policy's counts by rule and by
            outcome with a ``line`` in words (``xstage_remote/waitpolicy.py``); ``{}`` for a
            side that has no region (inline frames, TCP) or a worker that does not say.
        """
        if self._forked:
            raise self._forked_error()
        caller = self.link.stats() if self.link is not None else {}
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
        with self.lock:
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
            self._require_ready()
            link = self.link
            link.codec = None  # the worker drops its codec when a load starts
            link.forget()
            self._known = None
            frame = self.request(header, "loaded", "load")
            self.loaded = frame.header
            if self.fast_frames and "fast-frames" in ((self.hello or {}).get("features") or ()):
                with contextlib.suppress(wire.ProtocolError):  # over 65535 names: JSON frames
                    link.codec = wire.FastCodec([d["name"] for d in frame.header["inputs"]],
                                                [d["name"] for d in frame.header["outputs"]])
            held_in = {p["input"] for p in state}
            held_out = {p["output"] for p in state}
            self.inputs = [d for d in frame.header["inputs"] if d["name"] not in held_in]
            self._accepted.clear()
            link.outputs = [d for d in frame.header["outputs"] if d["name"] not in held_out]
            self.state_pairs = state
            self.pipeline.stateful = bool(state)
            if isinstance(link, SharedRegion):
                link.inputs = self.inputs
                self._attach_region(link)
            self.pipeline.device = device_slots.from_loaded(self, frame.header)  # #20
            return self.loaded

    @staticmethod
    def _check_concurrency(concurrency: int, depth: int) -> None:
        """``concurrency`` is a whole number in 1..``depth``, else a usage error."""
        if type(concurrency) is not int or not 1 <= concurrency <= depth:
            raise errors.UsageError(f"concurrency {concurrency!r} is outside 1..{depth} (the depth)",
                                    remedy="compute at most as many requests at once as are in flight")

    def _attach_region(self, link: SharedRegion) -> dict[str, Any] | None:
        """A region for the loaded signature, attached by the worker (``load``'s second half).

        Returns the worker's ``attached`` info, or None where no region was attached (none
        fits, or no space for a named one: the region attached before, if any, stays).
        """
        slots, size = link.plan(self.depth)
        if slots is None:
            return None
        kind = "memfd" if self.shm_mode in ("auto", "memfd") and hasattr(os, "memfd_create") \
            else "named"
        self.pipeline.drain()
        self._repair()
        try:
            region = shm.Region.create(size, slots, kind, generation=self.generation,
                                       n_sets=self.depth)
        except shm.RegionSpaceError as exc:  # calls go inline (docs/workers.md)
            kept = link.region  # widened: the region attached serves on
            how = f"keep their region of {kept.n_sets} slot set(s)" if kept else "travel inline"
            warnings.warn(f"{exc.strerror}: this worker's tensors {how}; free space in "
                          f"{os.path.dirname(exc.filename)} or leave XSTAGE_SHM at auto (memfd)",
                          RuntimeWarning, stacklevel=2)
            return None
        spec: dict[str, Any] = {"kind": kind, "size": size, "slots": slots, "sets": self.depth}
        if self.concurrency > 1:  # an older worker ignores the key: it runs one at a time
            spec["concurrent"] = self.concurrency
        if kind == "named":
            spec["name"] = region.name
        # The doorbell: a pair of eventfds sent with the memfd where both ends can (shm.Doorbell).
        events = shm.eventfd_pair(tuning=self.tuning) if kind == "memfd" and "bell-eventfd" in (
            (self.hello or {}).get("features") or ()) else None
        if events is not None:
            spec["bell"] = "eventfd"
        rid = self.take_id()
        try:
            self._send({"op": "attach", "id": rid, "region": spec}, phase="load")
            if kind == "memfd":
                assert self._ctl is not None
                socket.send_fds(self._ctl, [b"\0"], [region.fd, *(events or ())])
            attached = self.expect(self.recv("load", self.deadlines.load), "attached", rid)
            info = attached.header.get("info") or {}
            granted = info.get("concurrent", 1)
            self.concurrent = granted if type(granted) is int and 1 <= granted <= self.depth else 1
        except BaseException:
            region.close()
            for fd in events or ():
                os.close(fd)
            raise
        finally:
            region.handed_over()
        self.pipeline.reset_sets()
        link.adopt(region, events, dma_reads_region(self.loaded))
        return dict(info) if isinstance(info, dict) else {}
