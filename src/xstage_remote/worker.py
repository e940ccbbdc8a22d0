"""The worker: one process, one stage, driven by one client over the wire.

Started by the client with the control socket (and, on the same kernel, a doorbell) as
inherited descriptors, or told to connect back over TCP when it runs on the other side of
WSL. Its stdin carries the secret as a first line (never argv) and then stays open: that is
the death pipe. A watchdog thread reads it, and when the client dies and the pipe ends the
worker exits at once, even while the main thread is stuck in a long compile. WSL interop
forwards stdin to a Windows process, so the same rule holds across the two systems. Its fd 1
and fd 2 are the client's log file, so whatever a native runtime prints never reaches the
protocol. Python 3.9 syntax.

Lifecycle: hello → (load → loaded) → (attach → attached)? → run* → shutdown → bye.
"""

import argparse
import os
import platform
import socket
import sys
import threading
import time
import traceback

import numpy as np

from . import PROTOCOL_VERSION, memory, package_hash, wire
from . import shm as shm_mod

__all__ = ["main"]

FEATURES = ["inline", "shm-memfd", "shm-named", "death-stdin", "evidence"]
#: Exit status when the client vanished (stdin ended or the control stream closed).
EXIT_ORPHANED = 70


def _seconds_from_env(name, default):
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


#: How long ``attach`` waits for the region's descriptor after the frame (it is sent at once).
ATTACH_FD_SECONDS = _seconds_from_env("XSTAGE_ATTACH_FD_SECONDS", 10.0)


def _watchdog(fd):
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    os._exit(EXIT_ORPHANED)


class Worker:
    def __init__(self, sock, bell, generation=1, channel=None):
        self.sock = sock
        self.generation = generation
        self.channel = channel  # authenticated records (TCP connect-back), else plain frames
        self.bell = shm_mod.Doorbell(bell) if bell is not None else None
        self.runtime = None
        self.region = None
        self.in_slots = []
        self.out_views = {}

    # ---------------------------------------------------------------- replies
    def send(self, header, arrays=None):
        header = wire.with_generation(header, self.generation)
        if self.channel is not None:
            self.channel.send(header, arrays)
        else:
            wire.send_frame(self.sock, header, arrays)

    def recv(self):
        if self.channel is not None:
            return self.channel.recv()
        return wire.recv_frame(self.sock)

    def check_generation(self, frame):
        """A request for another generation is fatal: it was meant for another worker."""
        gen = frame.header.get(wire.GEN_FIELD)
        if gen != self.generation:
            raise wire.ProtocolError("request %s #%d carries gen %r, this worker is generation %d"
                                     % (frame.op, frame.id, gen, self.generation))

    def send_error(self, rid, exc):
        self.send({"op": "error", "id": rid, "kind": type(exc).__name__,
                   "message": str(exc) or type(exc).__name__,
                   "traceback": traceback.format_exc()})

    # ---------------------------------------------------------------- ops
    def on_load(self, frame):
        options = frame.header.get("options") or {}
        runtime = frame.header["runtime"]
        if runtime == "ort":
            from . import ort_runtime

            self.runtime = ort_runtime.load(frame.header["path"], options)
        elif runtime == "torch":
            from . import torch_runtime

            self.runtime = torch_runtime.load(frame.header["path"], options)
        else:
            raise ValueError("unknown runtime %r (this worker has: ort, torch)" % runtime)
        self.send({"op": "loaded", "id": frame.id, "inputs": self.runtime.inputs,
                   "outputs": self.runtime.outputs, "info": self.runtime.info})

    def on_attach(self, frame):
        spec = frame.header["region"]
        size, slots = spec.get("size"), spec.get("slots")
        if self.bell is None:
            raise wire.ProtocolError("attach: this worker has no doorbell (connected over TCP)")
        if spec.get("kind") == "memfd":
            # The descriptor follows the frame at once; a client that never sends it must not
            # hold this worker forever.
            self.sock.settimeout(ATTACH_FD_SECONDS)
            try:
                _, fds, _, _ = socket.recv_fds(self.sock, 1, 1)
            except socket.timeout:
                raise wire.ProtocolError("attach: no region descriptor within %gs of the frame"
                                         % ATTACH_FD_SECONDS) from None
            finally:
                self.sock.settimeout(None)
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise wire.ProtocolError("attach: expected one descriptor, got %d" % len(fds))
            target = fds[0]
        elif spec.get("kind") == "named":
            target = spec.get("name")
            if not isinstance(target, str):
                raise wire.ProtocolError("attach: named region without a name")
        else:
            raise wire.ProtocolError("attach: unknown region kind %r" % (spec.get("kind"),))
        region = shm_mod.Region.attach(target, size, slots, self.generation)
        if self.region is not None:  # a resized region replaces the old one
            self.region.close()
            if hasattr(self.runtime, "unbind"):
                self.runtime.unbind()
        self.region = region
        self.bell.bind(self.region, shm_mod.OFF_WORKER_ASLEEP, shm_mod.OFF_CLIENT_ASLEEP,
                       spin=shm_mod.WORKER_SPIN_SECONDS)
        self.in_slots = [s for s in slots if s["role"] == "in"]
        self.out_views = {}
        known = {o["name"]: o for o in self.runtime.outputs}
        for s in slots:
            if s["role"] == "out" and s["name"] not in known:
                raise wire.ProtocolError("attach: slot for unknown output %r" % s["name"])
        for name, decl in known.items():
            shape = decl["shape"]
            if self.region.has("out", name) and all(isinstance(d, int) for d in shape):
                self.out_views[name] = self.region.view(
                    "out", name, wire.dtype_of_tag(decl["dtype"]), tuple(shape))
            else:
                self.out_views[name] = None
        self.send({"op": "attached", "id": frame.id, "info": {"kind": self.region.kind}})

    def on_evidence(self, frame):
        """What the runtime collected for the proof; the profile travels as a uint8 tensor."""
        if self.runtime is None:
            raise RuntimeError("evidence before load")
        arrays = {}
        text = getattr(self.runtime, "profile_text", None)
        if text is not None:
            arrays[wire.PROFILE_TENSOR] = np.frombuffer(text, dtype=np.uint8)
        info = dict(getattr(self.runtime, "evidence", {}) or {})
        info["memory"] = memory.detail()
        self.send({"op": "evidence_data", "id": frame.id, "info": info}, arrays)

    def check_feeds(self, feeds):
        declared = {i["name"]: i for i in self.runtime.inputs}
        if set(feeds) != set(declared):
            raise ValueError("inputs %s do not match the stage's %s"
                             % (sorted(feeds), sorted(declared)))

    def on_run(self, frame):
        if self.runtime is None:
            raise RuntimeError("run before load")
        feeds = frame.arrays()
        self.check_feeds(feeds)
        t0 = time.perf_counter_ns()
        outputs = self.runtime.run(feeds)
        worker_ns = time.perf_counter_ns() - t0
        rss, peak = memory.read()
        self.send({"op": "result", "id": frame.id,
                   "timing": {"worker_ns": worker_ns, "rss": rss, "peak": peak}},
                  outputs)

    def on_shm_call(self, seq):
        region = self.region
        if region.req_gen() != self.generation:
            raise wire.ProtocolError("shared-region request #%d carries gen %d, this worker is "
                                     "generation %d" % (seq, region.req_gen(), self.generation))
        try:
            feeds = {}
            for s in self.in_slots:
                dtype, shape = region.read_desc("in", s["name"])
                feeds[s["name"]] = region.view("in", s["name"], dtype, shape)
            t0 = time.perf_counter_ns()
            rest = self.runtime.run_into(feeds, self.out_views)
            worker_ns = time.perf_counter_ns() - t0
            inline = {}
            for name, view in self.out_views.items():
                if view is not None:
                    region.describe("out", name, view.shape, view.nbytes)
            for name, value in rest.items():
                value = np.ascontiguousarray(value)
                if not region.write("out", name, value):
                    inline[name] = value
            rss, peak = memory.read()
            if inline:
                # Outputs too large for their slots travel inline, all of them at once.
                allout = {}
                for o in self.runtime.outputs:
                    n = o["name"]
                    allout[n] = inline[n] if n in inline else (
                        rest[n] if n in rest else np.array(self.out_views[n]))
                self.send({"op": "result", "id": seq,
                           "timing": {"worker_ns": worker_ns, "rss": rss, "peak": peak}}, allout)
                region.publish_response(seq, shm_mod.STATUS_INLINE, worker_ns, rss, peak)
            else:
                region.publish_response(seq, shm_mod.STATUS_OK, worker_ns, rss, peak)
        except Exception as exc:
            self.send_error(seq, exc)
            region.publish_response(seq, shm_mod.STATUS_ERROR, 0)
        self.bell.ring()

    # ---------------------------------------------------------------- loop
    def serve(self):
        handlers = {"load": self.on_load, "attach": self.on_attach, "run": self.on_run,
                    "evidence": self.on_evidence}
        while True:
            if self.region is not None:
                region = self.region
                last = region.resp_id()
                state = self.bell.wait(
                    lambda r=region, w=last: r.req_id() != w, None, watch=[self.sock],
                    spin=shm_mod.WORKER_SPIN_SECONDS)
                if state == "ready":
                    self.on_shm_call(region.req_id())
                    continue
                if state == "closed":
                    return EXIT_ORPHANED
            try:
                frame = self.recv()
            except wire.PeerClosed:
                return EXIT_ORPHANED
            op = frame.op
            self.check_generation(frame)
            if op == "shutdown":
                self.send({"op": "bye", "id": frame.id})
                return 0
            if op == "ping":
                info = memory.detail()
                if self.bell is not None and self.bell.policy is not None:
                    info["doorbell"] = self.bell.summary()  # the wait policy's decisions
                self.send({"op": "pong", "id": frame.id, "info": info})
                continue
            handler = handlers.get(op)
            try:
                if handler is None:
                    raise wire.ProtocolError("op %s is not a request a worker serves" % op)
                handler(frame)
            except Exception as exc:
                self.send_error(frame.id, exc)


def hello(secret, nonce=None, generation=1):
    pid = os.getpid()
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except Exception:
        pass
    header = {"op": "hello", "id": 0, "gen": generation, "v": PROTOCOL_VERSION, "features": FEATURES,
              "package_hash": package_hash(), "auth": wire.auth_token(secret, pid),
              "worker": {"pid": pid, "executable": sys.executable,
                         "implementation": platform.python_implementation(),
                         "platform": sys.platform, "machine": platform.machine(),
                         "versions": versions}}
    if nonce is not None:
        header["nonce"] = nonce
    return header


def handshake(sock, secret, generation=1):
    """The worker's half of the TCP handshake (docs/security.md); returns the Channel.

    Sends the hello with a fresh nonce, checks the client's proof over both nonces and this
    hello, answers with its own proof; every frame after that is authenticated.
    """
    header = hello(secret, wire.new_nonce(), generation)
    wire.send_frame(sock, header)
    frame = wire.recv_frame(sock, max_payload=0)
    if frame.op != "auth" or frame.id != 0:
        raise wire.ProtocolError("handshake: expected auth #0, the client sent %s #%d"
                                 % (frame.op, frame.id))
    digest = wire.transcript(header, frame.header["nonce"])
    wire.check_proof(secret, "client", digest, frame.header["proof"])
    wire.send_frame(sock, {"op": "auth_ok", "id": 0,
                           "proof": wire.proof(secret, "worker", digest)})
    return wire.Channel(sock, secret, digest, "worker")


def main(argv):
    parser = argparse.ArgumentParser(prog="xstage_remote worker")
    parser.add_argument("--ctl-fd", type=int, help="inherited control socket (same kernel)")
    parser.add_argument("--bell-fd", type=int, help="inherited doorbell socket (same kernel)")
    parser.add_argument("--connect", help="host:port to connect back to (across kernels)")
    parser.add_argument("--generation", type=int, default=1,
                        help="this worker's generation (1 for a stage's first worker)")
    args = parser.parse_args(argv)
    stdin = os.fdopen(0, "rb", buffering=0, closefd=False)
    line = b""
    while not line.endswith(b"\n"):
        chunk = stdin.read(1)
        if not chunk:
            break
        line += chunk
    secret = line.strip().decode("ascii", "replace")
    if not secret:
        sys.stderr.write("xstage worker: no secret on stdin; refusing to start\n")
        sys.exit(64)
    threading.Thread(target=_watchdog, args=(0,), daemon=True, name="xstage-watchdog").start()
    if not 1 <= args.generation <= wire.MAX_GENERATION:
        sys.stderr.write("xstage worker: --generation %d is outside [1, 2^32)\n" % args.generation)
        sys.exit(64)
    try:
        if args.connect:
            host, _, port = args.connect.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel = handshake(sock, secret, args.generation)  # under the 60 s connect timeout
            sock.settimeout(None)
            worker = Worker(sock, None, args.generation, channel)
        else:
            sock = socket.socket(fileno=args.ctl_fd)
            bell = socket.socket(fileno=args.bell_fd) if args.bell_fd is not None else None
            worker = Worker(sock, bell, args.generation)
            worker.send(hello(secret, generation=args.generation))
        code = worker.serve()
    except wire.PeerClosed:
        code = EXIT_ORPHANED
    except (wire.ProtocolError, OSError) as exc:
        sys.stderr.write("xstage worker: %s: %s\n" % (type(exc).__name__, exc))
        code = 65
    shm_mod.write_traces()  # XSTAGE_WAIT_TRACE only
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
