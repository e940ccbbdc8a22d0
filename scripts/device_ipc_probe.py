"""Does a CUDA IPC export as explicit fields work on this torch? (device tensors)

    PYTHONPATH=src python scripts/device_ipc_probe.py

This process allocates device slots as a torch-cuda worker does (``xstage_remote.device_slots``),
sends ``_share_cuda_()``'s fields through a real wire frame (bytes as uint8 tensors, never
pickled) to a child process, which rebuilds the buffer with
``torch.multiprocessing.reductions.rebuild_cuda_tensor``, reads what this process wrote and
writes an answer back. Prints each step and the fields' kinds; exit status 0 when both
directions saw the other's bytes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor
from xstage_remote import device_slots, wire
frame = wire.parse_frame(open(sys.argv[1], "rb").read())
info = frame.header["info"]
f = device_slots.unpack(info, frame.arrays())
dev, handle, size, offset, ref, ref_off, event, sync = f
base = rebuild_cuda_tensor(torch.Tensor, (size,), (1,), 0, torch.UntypedStorage, torch.uint8,
                           dev, handle, size, offset, False, ref, ref_off, event, sync)
slot = [s for s in info["slots"] if s["role"] == "in" and s["set"] == 0][0]
x = base[slot["offset"]:slot["offset"] + slot["nbytes"]].view(torch.float32)
print("child: read", float(x.sum()), "expected", float(slot["nbytes"] // 4 * 3), flush=True)
out = [s for s in info["slots"] if s["role"] == "out" and s["set"] == 0][0]
y = base[out["offset"]:out["offset"] + out["nbytes"]].view(torch.float32)
y.fill_(7.0)
torch.cuda.synchronize()
print("child: wrote 7s into", out["name"], flush=True)
"""


def main() -> int:
    import torch

    from xstage_remote import device_slots, wire

    print(f"torch {torch.__version__}, cuda {torch.version.cuda}", flush=True)
    dev = torch.device("cuda:0")
    slots = device_slots.DeviceSlots(torch, dev, [{"name": "x", "dtype": "float32",
                                                   "shape": [64, 1024]}],
                                     [{"name": "y", "dtype": "float32", "shape": [64, 256]}], 2)
    print("fields:", [type(v).__name__ for v in slots.fields], "event_sync_required",
          slots.fields[-1], flush=True)
    slots.views[0]["in"][0].fill_(3.0)
    torch.cuda.synchronize()
    info, arrays = slots.describe()
    data = b"".join(bytes(b) for b in wire.encode_frame(
        wire.with_generation({"op": "device_slots_ready", "id": 1, "info": info}, 1), arrays))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frame.bin"
        path.write_bytes(data)
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                              text=True, timeout=120)
    print(done.stdout.strip(), done.stderr.strip()[-2000:], sep="\n", flush=True)
    got = float(slots.views[0]["out"][0].sum())
    want = 7.0 * 64 * 256
    print(f"parent: the child's output slot sums to {got} (expected {want})", flush=True)
    return 0 if done.returncode == 0 and got == want else 1


if __name__ == "__main__":
    sys.exit(main())
