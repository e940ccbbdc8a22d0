"""Device tensors in, device tensors out (torch-cuda, ``--ep-option device_tensors=on``).

The worker allocates one device buffer holding K slot sets (one per slot set of the shared
region) of the stage's inputs and outputs at their fixed shapes, once, and exports its CUDA IPC
handle once: the fields of ``UntypedStorage._share_cuda_()`` sent as explicit values (ints,
and bytes as uint8 arrays in the frame), never pickled. The client rebuilds the storage from
those fields (``UntypedStorage._new_shared_cuda``), copies a call's device inputs into set s
device to device, publishes the request in the region with ``FLAG_DEVICE_TENSORS``, and gets
views of set s's output slots back. The control path (ids, doorbell, deadlines, cancel) stays
the region's; only the tensor bytes skip the host. Python 3.9 syntax; numpy and torch only.

``layout`` and ``pack``/``unpack`` are pure (numpy only), so the framing is tested without a GPU.
"""

import numpy as np

__all__ = ["ALIGN", "FIELDS", "BYTES_FIELDS", "DeviceSlots", "layout", "pack", "unpack"]

#: Each slot starts on this many bytes (cudaMalloc's own alignment is 256).
ALIGN = 512

#: ``UntypedStorage._share_cuda_()``'s eight fields, in its order (torch >= 2.0).
FIELDS = ("device", "handle", "size_bytes", "offset_bytes", "ref_counter_handle",
          "ref_counter_offset", "event_handle", "event_sync_required")
#: The fields that are bytes: they travel as uint8 arrays in the frame.
BYTES_FIELDS = ("handle", "ref_counter_handle", "event_handle")


def _nbytes(spec):
    n = int(np.dtype(spec["dtype"]).itemsize)
    for d in spec["shape"]:
        n *= int(d)
    return n


def layout(inputs, outputs, n_sets):
    """Every slot of ``n_sets`` sets: ``{set, role, name, dtype, shape, offset, nbytes}``, and
    the buffer's size. Shapes must be fixed (a torch stage's are)."""
    slots, at = [], 0
    for s in range(n_sets):
        for role, specs in (("in", inputs), ("out", outputs)):
            for spec in specs:
                shape = list(spec["shape"])
                if not all(isinstance(d, int) and d >= 0 for d in shape):
                    raise ValueError("device tensors need fixed shapes: %s %s is %s"
                                     % (role, spec["name"], shape))
                n = _nbytes(spec)
                slots.append({"set": s, "role": role, "name": spec["name"],
                              "dtype": spec["dtype"], "shape": shape, "offset": at, "nbytes": n})
                at += (n + ALIGN - 1) // ALIGN * ALIGN or ALIGN
    return slots, at


def pack(fields):
    """``_share_cuda_()``'s tuple -> (a JSON-able dict of its ints and bools, the bytes fields
    as uint8 arrays keyed ``ipc_<field>``). A bytes field torch leaves None (the event handle,
    when it synchronized the stream instead) is listed in ``none_fields``."""
    if len(fields) != len(FIELDS):
        raise ValueError("_share_cuda_() returned %d fields, expected %d (%s)"
                         % (len(fields), len(FIELDS), ", ".join(FIELDS)))
    header, arrays = {}, {}
    for name, value in zip(FIELDS, fields):
        if name in BYTES_FIELDS and value is None:
            header.setdefault("none_fields", []).append(name)
            arrays["ipc_" + name] = np.zeros(0, dtype=np.uint8)
        elif name in BYTES_FIELDS:
            if not isinstance(value, (bytes, bytearray)):
                raise ValueError("_share_cuda_() field %s is %s, expected bytes"
                                 % (name, type(value).__name__))
            arrays["ipc_" + name] = np.frombuffer(bytes(value), dtype=np.uint8).copy()
        elif name == "event_sync_required":
            header[name] = bool(value)
        else:
            header[name] = int(value)
    return header, arrays


def unpack(header, arrays):
    """The inverse of ``pack``: the eight fields in ``_new_shared_cuda``'s order."""
    out = []
    nones = header.get("none_fields") or []
    for name in FIELDS:
        if name in nones and name in BYTES_FIELDS:
            out.append(None)
        elif name in BYTES_FIELDS:
            value = arrays.get("ipc_" + name)
            if value is None:
                raise ValueError("device slots: the IPC field %s is missing" % name)
            out.append(np.ascontiguousarray(value, dtype=np.uint8).tobytes())
        elif name == "event_sync_required":
            out.append(bool(header[name]))
        else:
            value = header.get(name)
            if type(value) is not int:
                raise ValueError("device slots: the IPC field %s is %r, expected an integer"
                                 % (name, value))
            out.append(value)
    return tuple(out)


class DeviceSlots(object):
    """The worker's device slots: one buffer, K sets, views per (set, role, name)."""

    def __init__(self, torch, device, inputs, outputs, n_sets):
        self.torch = torch
        self.n_sets = n_sets
        self.slots, self.size = layout(inputs, outputs, n_sets)
        self.buffer = torch.zeros(max(self.size, ALIGN), dtype=torch.uint8, device=device)
        self.views = [{"in": [], "out": []} for _ in range(n_sets)]
        for slot in self.slots:
            raw = self.buffer[slot["offset"]:slot["offset"] + slot["nbytes"]]
            dtype = getattr(torch, slot["dtype"])
            self.views[slot["set"]][slot["role"]].append(raw.view(dtype).view(slot["shape"]))
        torch.cuda.synchronize(device)
        self.fields = self.buffer.untyped_storage()._share_cuda_()

    def describe(self):
        """The frame that exports the slots: (header info, arrays)."""
        header, arrays = pack(self.fields)
        header.update(slots=self.slots, buffer_bytes=int(self.buffer.numel()), sets=self.n_sets,
                      via="UntypedStorage._share_cuda_")
        return header, arrays
