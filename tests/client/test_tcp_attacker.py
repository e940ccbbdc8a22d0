"""A local attacker on the TCP connect-back path (docs/security.md).

The attacker is a forked process that drops to another uid (nobody, 65534): the threat is
another local user. It sits in the middle of the worker's connection (``mitm_wrapper.py``
points the worker at it, as if it had won the port) and relays byte-exact, or tampers,
injects, replays or reorders the worker's frames. A byte-exact relay may succeed but only
with the worker's true outputs; every other attack fails closed with a ``ProtocolError``
naming the check; a request replayed to the worker ends the worker with the check in its
log. A second attacker connects to the client's listener first (the worker's interpreter waits
until it has: first by order, not by the scheduler) and tries to pass for the worker; the
listener refuses it, keeps accepting, and the real worker still wins.

Needs root (to become uid 65534); everything is loopback and bounded: the attacker runs
under ``alarm(60)``, the client under short deadlines, and the test kills both at the end.
"""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401  (loaded now: uid 65534 cannot read this interpreter's lib)
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

from xstage import builtin_graphs, errors
from xstage.client import Deadlines, WorkerClient
from xstage_remote import wire

HERE = Path(__file__).parent
NOBODY = 65534
N = 262_144  # float32 elements: 1 MiB in and out, so a result spans several records

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="the attacker must run as another uid: it drops to 65534 with setuid, which "
    "needs root; as an unprivileged user there is no second uid to become",
)


@pytest.fixture(scope="module")
def big_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attacker")
    return builtin_graphs.write(builtin_graphs.slice_graph(N, N), root / "slice-1mib.onnx")


# ------------------------------------------------------------------- the attacker (uid 65534)
def _exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _records(sock: socket.socket, authenticated: bool) -> list[bytearray]:
    """One frame from the worker, cut into its records (each with its trailer)."""
    prefix = _exact(sock, wire.PREFIX.size)
    _, hlen, plen = wire.PREFIX.unpack(prefix)
    if not authenticated:
        return [bytearray(prefix + _exact(sock, hlen + plen))]
    trailer = wire.TRAILER_BYTES
    if wire.PREFIX.size + hlen + plen <= wire.SMALL_FRAME:
        return [bytearray(prefix + _exact(sock, hlen + plen + trailer))]
    recs = [bytearray(prefix + _exact(sock, hlen + trailer))]
    for start in range(0, plen, wire.CHUNK_BYTES):
        recs.append(bytearray(_exact(sock, min(wire.CHUNK_BYTES, plen - start) + trailer)))
    return recs


def _attack(mode: str, frames: list[list[bytearray]], k: int, authenticated: bool) -> list[bytes]:
    """What the attacker sends the client in place of the worker's frame ``k``.

    Frame 0 is ``loaded``, 1 the first call's result, 2 the second's.
    """
    recs = frames[k]
    trailer = wire.TRAILER_BYTES if authenticated else 0
    if mode == "tamper" and k == 1:
        recs[-1][len(recs[-1]) - trailer - 1] ^= 0x01  # one bit of the last output value
    elif mode == "inject" and k == 1:
        forged = [bytearray(r) for r in recs]
        payload_recs = forged[1:] if authenticated else forged
        for r in payload_recs:
            start = 0 if authenticated else len(r) - N * 4
            r[start:len(r) - trailer] = bytes(len(r) - trailer - start)  # zeros, as in the issue
        return [bytes(r) for r in forged]
    elif mode == "replay" and k == 2:
        recs = frames[1]  # the first result again, in place of the second
    elif mode == "reorder" and k == 1:
        if authenticated:
            recs = [recs[0], recs[2], recs[1]] + recs[3:]
        else:  # one record: swap the first two record-sized blocks of the payload
            r = recs[0]
            end = len(r)
            a, b = end - N * 4, end - N * 4 + wire.CHUNK_BYTES if hasattr(wire, "CHUNK_BYTES") \
                else end - N * 4 + (1 << 18)
            block = b - a
            r[a:b], r[b:b + block] = r[b:b + block], r[a:b]
    return [bytes(r) for r in recs]


def _middle(listener: socket.socket, mode: str) -> None:
    """Accept the wrapper's note of the real port, then the worker; relay with ``mode``."""
    tell, _ = listener.accept()
    real_port = int(tell.makefile().readline())
    tell.close()
    worker, _ = listener.accept()
    client = socket.create_connection(("127.0.0.1", real_port))

    def upstream() -> None:  # client → worker: byte-exact, or the first run sent twice
        try:
            if mode == "replay-to-worker":
                worker.sendall(_records(client, False)[0])  # auth
                first_run = b""
                for k in range(3):  # 0 load, 1 first run, 2 the client's next request
                    data = b"".join(_records(client, True))
                    if k == 2:
                        # The client sends its next request only once it has read the first
                        # run's answer whole (a call is synchronous), so the copy goes now, in
                        # place of that request: the worker that ends on the copy can no
                        # longer cut the answer short, and this side holds no unread byte
                        # whose close would reset the client's connection.
                        worker.sendall(first_run)
                    else:
                        worker.sendall(data)
                        first_run = data
            while data := client.recv(1 << 20):
                worker.sendall(data)
        except (EOFError, OSError):
            pass
        finally:
            # Half-close: the worker sees the end of the client's bytes, and the other thread,
            # still relaying the worker's last reply, keeps its socket (a close here raced it).
            with contextlib.suppress(OSError):
                worker.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    hello = _records(worker, False)
    client.sendall(hello[0])
    authenticated = b'"nonce"' in hello[0]
    if authenticated:
        client.sendall(_records(worker, False)[0])  # auth_ok
    frames: list[list[bytearray]] = []
    try:
        while True:
            frames.append(_records(worker, authenticated))
            for data in _attack(mode, frames, len(frames) - 1, authenticated):
                client.sendall(data)
    except (EOFError, OSError):
        pass


#: The write end of a pipe to the test: "first" says there once both its connections are made.
_READY: dict[str, int] = {}


def _first(mode: str) -> None:
    """Connect to the client's listener before the worker (its port is in the worker's
    argv, readable by anyone) and try to pass for it: one silent connection, one that says
    a hello of its own and answers the client's challenge with a made-up proof. The worker's
    interpreter waits until this says it is connected (``_first_wrapper``): first by order."""
    port = None
    test = os.getppid()  # the test's process, which starts the worker (the wrapper) too
    for _ in range(20000):
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (comm) state ppid ..."
                    parent = int(f.read().rpartition(b")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent != test:  # another test's or another session's worker: not ours
                continue
            if b"--connect" in argv and argv.index(b"--connect") + 1 < len(argv):
                port = int(argv[argv.index(b"--connect") + 1].rpartition(b":")[2])
                break
        if port is not None:
            break
        time.sleep(0.001)
    if port is None:
        return
    silent = socket.create_connection(("127.0.0.1", port))
    liar = socket.create_connection(("127.0.0.1", port))
    fake = {"op": "hello", "id": 0, "v": 1, "features": ["inline"], "worker": {"pid": 1},
            "package_hash": "0" * 64, "auth": "0" * 64, "nonce": wire.new_nonce()}
    wire.send_frame(liar, fake)
    if "w" in _READY:
        os.write(_READY["w"], b"connected")
    try:
        wire.recv_frame(liar)  # the client's auth
        wire.send_frame(liar, {"op": "auth_ok", "id": 0, "proof": "00" * 32})
        liar.recv(1)
    except (EOFError, OSError, wire.ProtocolError):
        pass
    time.sleep(30)
    silent.close()


def _spawn_attacker(mode: str) -> tuple[int, int]:
    """Fork the attacker, drop it to uid 65534; return (pid, its listening port)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            signal.alarm(60)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            assert os.getuid() == NOBODY and os.geteuid() == NOBODY
            if mode == "first":
                listener.close()
                _first(mode)
            else:
                _middle(listener, mode)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    listener.close()
    return pid, port


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


@pytest.fixture
def wrapper(tmp_path: Path) -> str:
    script = tmp_path / "mitm-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "mitm_wrapper.py"}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


#: Liveness bounds, not speed ones: generous, so a loaded machine still passes.
DEADLINES = Deadlines(spawn=120, hello=120, load=300, warmup=300, call=120, shutdown=5)


def _calls(w: WorkerClient) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(N).astype(np.float32) for _ in range(2)]
    return [(x, w.run({"x": x})["y"]) for x in inputs]


# ------------------------------------------------------------------- the tests
def test_a_byte_exact_relay_gets_the_workers_true_outputs(big_slice: Path, wrapper: str) -> None:
    pid, port = _spawn_attacker("relay")
    env = dict(os.environ, XSTAGE_ATTACK_PORT=str(port))
    try:
        with WorkerClient(wrapper, transport="tcp", env=env, deadlines=DEADLINES) as w:
            w.load(big_slice)
            for x, y in _calls(w):
                np.testing.assert_array_equal(y, x)  # the worker's true outputs: y = x[:N]
    finally:
        _end(pid)


@pytest.mark.parametrize(("mode", "check"), [
    ("tamper", "frame integrity check failed (mac)"),
    ("inject", "frame integrity check failed (mac)"),
    ("replay", "frame sequence check failed (replay)"),
    ("reorder", "frame sequence check failed (reorder)"),
])
def test_an_attacker_in_the_middle_fails_closed(big_slice: Path, wrapper: str, mode: str,
                                                check: str) -> None:
    pid, port = _spawn_attacker(mode)
    env = dict(os.environ, XSTAGE_ATTACK_PORT=str(port))
    returned: list[tuple[np.ndarray, np.ndarray]] = []
    try:
        w = WorkerClient(wrapper, transport="tcp", env=env, deadlines=DEADLINES)
        try:
            w.start()
            w.load(big_slice)
            rng = np.random.default_rng(7)
            raised = None
            try:
                for _ in range(2):
                    x = rng.standard_normal(N).astype(np.float32)
                    returned.append((x, w.run({"x": x})["y"]))
            except errors.RemoteProtocolError as exc:
                raised = exc
            altered = [int(np.count_nonzero(y.view(np.uint32) != x.view(np.uint32)))
                       for x, y in returned]
            assert raised is not None, (
                f"{mode}: no error; the calls returned with {altered} values altered")
            assert check in str(raised)
        finally:
            w.close()
    finally:
        _end(pid)
    for x, y in returned:  # what did come back is the worker's, never the attacker's
        np.testing.assert_array_equal(y, x)


def _first_wrapper(tmp_path: Path, ready: int) -> str:
    """An interpreter that starts the worker only once the attacker said it connected: a
    thread here reads the attacker's pipe and writes the stamp the wrapper waits for."""
    stamp = tmp_path / "attacker-connected"

    def relay() -> None:
        if os.read(ready, 64):
            stamp.write_text("")

    threading.Thread(target=relay, daemon=True).start()
    script = tmp_path / "after-attacker-python"
    script.write_text(f'#!/bin/sh\ncase "$*" in *--connect*)\n  i=0\n'  # the worker; not a probe
                      f'  while [ ! -e "{stamp}" ]; do\n    sleep 0.01; i=$((i+1))\n'
                      f'    [ $i -gt 12000 ] && exit 97\n  done\nesac\nexec "{sys.executable}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_peer_that_connects_first_does_not_win(big_slice: Path, tmp_path: Path) -> None:
    ready_r, ready_w = os.pipe()
    _READY["w"] = ready_w  # inherited by the forked attacker
    try:
        pid, _ = _spawn_attacker("first")
    finally:
        del _READY["w"]
        os.close(ready_w)
    python = _first_wrapper(tmp_path, ready_r)
    try:
        with WorkerClient(python, transport="tcp", deadlines=DEADLINES) as w:
            w.load(big_slice)
            for x, y in _calls(w):
                np.testing.assert_array_equal(y, x)
            # The attacker got in first, by order: the client refused its made-up proof and
            # kept listening for the worker.
            print("refused before the worker won:", w.refused_peers)
            assert any("proof" in r for r in w.refused_peers), w.refused_peers
            assert all("proof" in r or "Peer" in r or "hash" in r for r in w.refused_peers)
    finally:
        _end(pid)


def test_a_request_replayed_to_the_worker_ends_it_with_the_check_named(big_slice: Path,
                                                                        wrapper: str) -> None:
    """The other direction: the attacker sends the client's first run twice, the copy in
    place of the client's next request (by order: the client has read the answer whole). The
    worker runs it once, answers, refuses the copy (status 65, the check in its log), and the
    client's next call fails with that log; no call returns anything but the worker's own
    outputs."""
    pid, port = _spawn_attacker("replay-to-worker")
    env = dict(os.environ, XSTAGE_ATTACK_PORT=str(port))
    try:
        w = WorkerClient(wrapper, transport="tcp", env=env, deadlines=DEADLINES)
        try:
            w.start()
            w.load(big_slice)
            x = np.arange(N, dtype=np.float32)
            np.testing.assert_array_equal(w.run({"x": x})["y"], x)
            with pytest.raises(errors.WorkerDied) as info:
                w.run({"x": x + 1})
            assert info.value.exit_status == 65
            assert "frame sequence check failed (replay)" in info.value.log_tail
        finally:
            w.close()
    finally:
        _end(pid)
