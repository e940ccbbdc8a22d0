"""A worker that misbehaves on purpose: fault injection only (crash, garbage, hang).

Started through a wrapper "interpreter" with the same argv the real worker gets; the fault
comes from XSTAGE_FAULT. Every fault that needs a valid hello uses the real one.
"""

import os
import socket
import sys
import time

argv = sys.argv[1:]
root = argv[argv.index("-c") + 2]
sys.path.insert(0, root)
if "worker" not in argv:  # probe mode (route resolution): the real thing
    from xstage_remote.__main__ import main as real_main

    real_main(argv[argv.index("-c") + 3:])
    sys.exit(0)
args = argv[argv.index("worker") + 1:]
fds = dict(zip(args[0::2], args[1::2], strict=False))
fault = os.environ.get("XSTAGE_FAULT", "")
print("fault worker starting:", fault, flush=True)

from xstage_remote import wire, worker  # noqa: E402

# Same kernel: the inherited control socket (the faults that speak on it run there only).
ctl = socket.socket(fileno=int(fds["--ctl-fd"])) if "--ctl-fd" in fds else None


def secret():
    """The session secret: the first line of stdin (the real worker reads it itself)."""
    return sys.stdin.buffer.readline().strip().decode()



if fault == "no-hello":
    time.sleep(3600)
elif fault == "garbage":
    ctl.sendall(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    time.sleep(3600)
elif fault == "bad-hash":
    h = worker.hello(secret())
    h["package_hash"] = "0" * 64
    wire.send_frame(ctl, h)
    time.sleep(3600)
elif fault == "bad-auth":
    wire.send_frame(ctl, worker.hello("not-the-secret"))
    time.sleep(3600)
elif fault == "crash-after-hello":
    wire.send_frame(ctl, worker.hello(secret()))
    wire.recv_frame(ctl)
    print("fault worker: crashing on purpose", flush=True)
    os._exit(3)
elif fault == "wrong-reply":
    wire.send_frame(ctl, worker.hello(secret()))
    frame = wire.recv_frame(ctl)
    wire.send_frame(ctl, {"op": "pong", "id": frame.id + 41})
    time.sleep(3600)
elif fault == "crash-on-run":
    def crash(self, *a, **k):
        print("fault worker: dying in the call", flush=True)
        os._exit(9)

    worker.Worker.on_run = crash
    worker.Worker.on_shm_call = crash
    worker.main(args)
elif fault in ("hang-on-run", "garbage-descriptor"):
    def hang(self, *a, **k):
        time.sleep(3600)

    def bad_desc(self, seq, s=0):
        # Claim an output shape that does not match its byte count.
        self.region.describe("out", self.runtime.outputs[0]["name"], (1 << 20, 1 << 20), 8)
        self.region.publish_response(seq, 0, 0)
        self.bell.ring()

    if fault == "hang-on-run":
        worker.Worker.on_run = hang
        worker.Worker.on_shm_call = hang
    else:
        worker.Worker.on_shm_call = bad_desc
    sys.argv = [sys.argv[0]] + args
    worker.main(args)
elif fault in ("abort-on-load", "sigkill-on-warmup", "segv-on-warmup") or fault.startswith("exit-on-load"):
    # A runtime that ends its own process on a graph it claimed (OpenVINO's abort on a Loop), or
    # the kernel's out-of-memory killer: the real worker until the op, then a death, its last
    # words on stderr as a runtime's would be.
    import signal

    def die(self, *a, **k):
        sys.stderr.write(f"fault worker: [OpenVINO-EP] fatal error in the op ({fault})\n")
        sys.stderr.flush()
        if fault == "abort-on-load":
            os.abort()
        elif fault == "sigkill-on-warmup":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "segv-on-warmup":
            os.kill(os.getpid(), signal.SIGSEGV)
        os._exit(int(fault.rsplit("=", 1)[1]) if "=" in fault else 1)

    if fault.endswith("on-load") or fault.startswith("exit-on-load"):
        worker.Worker.on_load = die
    else:
        worker.Worker.on_run = die
        worker.Worker.on_shm_call = die
    worker.main(args)
elif fault in ("orphan-on-run", "child-at-start"):
    # A worker that starts a process of its own holding the inherited control socket (and the
    # death pipe, as any child does): "orphan-on-run" then dies as it takes its first run, so
    # the socket stays open after its death; "child-at-start" serves on with the child beside
    # it (a killed client must take both down). Each pid is stamped in XSTAGE_FAULT_STAMPS as
    # ``pid-<n>`` (the stamps fixture's reaper) and the child's also as ``child-<n>``.
    import subprocess

    stamps = os.environ["XSTAGE_FAULT_STAMPS"]
    keep = [int(fds[k]) for k in ("--ctl-fd", "--bell-fd") if k in fds]

    def stamp(what, pid):
        with open(os.path.join(stamps, f"{what}-{pid}"), "w") as f:
            f.write(f"{pid}\n")

    def orphan():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)",
                                  "fault_worker.py-child"], pass_fds=keep)
        stamp("pid", child.pid)
        stamp("child", child.pid)

    stamp("pid", os.getpid())
    if fault == "child-at-start":
        orphan()
    else:
        def die(self, *a, **k):
            orphan()
            print("fault worker: dying with a child holding the socket", flush=True)
            os._exit(9)

        worker.Worker.on_run = die
        worker.Worker.on_shm_call = die
        worker.Worker._run_binary = die
    sys.argv = [sys.argv[0]] + args
    worker.main(args)
elif fault == "stop-on-run":
    # The real worker (ort runtime), made to stop itself (SIGSTOP) as it starts computing its
    # run number XSTAGE_FAULT_AT (1-based; inline and region calls alike, a request withdrawn
    # before it started counted too), after taking the request and reading its inputs; with
    # XSTAGE_FAULT_EVERY=1 every run after that one too (XSTAGE_FAULT_STOP=0: never). A
    # stopped worker is an event the test can see (psutil's status): the request has arrived
    # and started, and no answer can come until the test sends SIGCONT, so an interrupt, a kill
    # or a deadline lands mid-call by order, not by a race with the compute. With
    # XSTAGE_FAULT_STAMPS (a folder) it also writes ``started-<n>`` as run n's compute starts
    # (before stopping), ``computed-<n>`` when it ends and ``answered-<n>`` once run n is
    # answered (a reply larger than the socket's buffer is answered only as the caller reads
    # it): the test knows where the worker is without waiting on a clock.
    import signal

    from xstage_remote import ort_runtime

    at = int(os.environ.get("XSTAGE_FAULT_AT", "1"))
    every = os.environ.get("XSTAGE_FAULT_EVERY") == "1"
    stops = os.environ.get("XSTAGE_FAULT_STOP", "1") == "1"
    # XSTAGE_FAULT_GEN: stop only in the worker of that generation (a restart's admission)
    if os.environ.get("XSTAGE_FAULT_GEN") not in (None, fds.get("--generation", "1")):
        stops = False
    stamps = os.environ.get("XSTAGE_FAULT_STAMPS")
    runs = {"seen": 0, "depth": 0, "computing": 0}

    def stamp(what, n):
        if stamps:
            with open(os.path.join(stamps, f"{what}-{n}"), "w") as f:
                f.write(f"{os.getpid()}\n")

    stamp("pid", os.getpid())  # for the test's reaper: a stopped worker cannot see its client go

    def counting(real):
        def serve(self, *a, **k):
            runs["depth"] += 1
            try:
                if runs["depth"] > 1:  # on_run hands a binary run to _run_binary: one run
                    return real(self, *a, **k)
                runs["seen"] += 1
                n = runs["computing"] = runs["seen"]
                real(self, *a, **k)
                stamp("answered", n)
            finally:
                runs["depth"] -= 1
                runs["computing"] = 0

        return serve

    def stopping(real):
        def compute(self, *a, **k):
            n = runs["computing"]
            if n:
                runs["computing"] = 0  # one stop per run
                stamp("started", n)
                if stops and (n == at or (every and n > at)):
                    os.kill(os.getpid(), signal.SIGSTOP)
                try:
                    return real(self, *a, **k)
                finally:
                    stamp("computed", n)
            return real(self, *a, **k)

        return compute

    worker.Worker.on_run = counting(worker.Worker.on_run)
    worker.Worker.on_shm_call = counting(worker.Worker.on_shm_call)
    worker.Worker._run_binary = counting(worker.Worker._run_binary)
    ort_runtime.OrtRuntime.run = stopping(ort_runtime.OrtRuntime.run)
    ort_runtime.OrtRuntime.run_into = stopping(ort_runtime.OrtRuntime.run_into)
    sys.argv = [sys.argv[0]] + args
    worker.main(args)
elif fault == "wrong-in-set":
    # The real worker, but what it computes in slot set XSTAGE_FAULT_SET comes back with its
    # first float output off by one: a set whose binding or slots went wrong.
    import numpy as np

    from xstage_remote import ort_runtime

    wrong_set = int(os.environ["XSTAGE_FAULT_SET"])
    real_run_into = ort_runtime.OrtRuntime.run_into

    def run_into(self, feeds, out_views, slot_set=0):
        left = real_run_into(self, feeds, out_views, slot_set)
        if slot_set == wrong_set:
            view = next(v for v in out_views.values() if v is not None and v.dtype.kind == "f")
            view += np.ones((), view.dtype)
        return left

    ort_runtime.OrtRuntime.run_into = run_into
    sys.argv = [sys.argv[0]] + args
    worker.main(args)
else:
    sys.exit(f"unknown fault {fault!r}")
