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

ctl = socket.socket(fileno=int(fds["--ctl-fd"]))


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
    sys.argv = [sys.argv[0]] + args
    worker.main(args)
else:
    sys.exit(f"unknown fault {fault!r}")
