"""How a torch-cuda worker serves calls: the shared region as pinned memory, one dedicated
stream, CUDA graphs for fixed shapes. Python 3.9 syntax; torch is the runtime.

* **Pinned region.** The worker's shared region (``shm.Region``) is registered with CUDA
  (``cudaHostRegister`` through ``torch.cuda.cudart()``, else the process's own
  ``libcudart`` through ctypes), so a slot's bytes go to the device by DMA and outputs land
  in their slots by DMA, without a staging copy. Without it the same copies run from
  pageable memory (correct, slower); the record says which.
* **One stream, one sync.** Every copy in, the program (or its graph's replay) and every copy
  out are queued on one stream of the worker's own; the call waits once, at the end.
* **CUDA graphs.** After the profiled eager warm-up (the proof's evidence), the program is
  captured once at the warm-up's shapes and replayed from then on; the warm-up call answers
  with the replay's outputs, so the numeric gate judges what serves. A call whose shapes
  differ runs eager. A capture that fails leaves the stage eager, with a note. Options
  ``cuda_graphs`` and ``pinned_region`` (``on``/``off``, default on) turn each off.
* **Device tensors** (``device_tensors=on``, default off): K sets of device input and output
  slots, exported once by CUDA IPC (``device_slots.py``); a call flagged
  ``FLAG_DEVICE_TENSORS`` copies device to device from the input slots into the graph's
  static inputs (or runs eager on the slots), and from its outputs into the output slots.
"""

import ctypes
import time

import numpy as np

__all__ = ["CudaServing", "register_host", "switch"]

_ON = ("on", "1", "true", "yes")
_OFF = ("off", "0", "false", "no")


def switch(value, name):
    """``on``/``off`` (also 1/0, true/false, yes/no, a bool); None is on. Anything else is an
    error naming the option."""
    if value is None or value is True:
        return True
    if value is False:
        return False
    text = str(value).strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ValueError("%s=%r: expected on or off" % (name, value))


def _cudart_ctypes():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart64_13.dll",
                 "cudart64_12.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def register_host(torch, ptr, size):
    """Page-lock ``size`` bytes at ``ptr`` for DMA. Returns (how, error): ``how`` names the
    binding that succeeded (None when none did), ``error`` the reasons the others failed."""
    errors = []
    try:
        cudart = torch.cuda.cudart()
        code = cudart.cudaHostRegister(ptr, size, 0)
        if int(getattr(code, "value", code)) == 0:
            return "torch.cuda.cudart().cudaHostRegister", None
        errors.append("torch.cuda.cudart: cudaError %s" % (code,))
    except Exception as exc:  # a build without the binding
        errors.append("torch.cuda.cudart: %s: %s" % (type(exc).__name__, exc))
    lib = _cudart_ctypes()
    if lib is None:
        errors.append("ctypes: no libcudart found")
        return None, "; ".join(errors)
    code = lib.cudaHostRegister(ctypes.c_void_p(ptr), ctypes.c_size_t(size), ctypes.c_uint(0))
    if code == 0:
        return "ctypes libcudart.cudaHostRegister", None
    errors.append("ctypes libcudart: cudaError %d" % code)
    return None, "; ".join(errors)


def unregister_host(torch, ptr, how):
    if how is None:
        return
    try:
        if how.startswith("torch"):
            torch.cuda.cudart().cudaHostUnregister(ptr)
        else:
            lib = _cudart_ctypes()
            if lib is not None:
                lib.cudaHostUnregister(ctypes.c_void_p(ptr))
    except Exception:  # the mapping is going away anyway
        pass


def _values(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _key(arrays):
    return [(tuple(a.shape), a.dtype.str) for a in arrays]


class CudaServing(object):
    """The serving half of a torch-cuda runtime (module docstring)."""

    def __init__(self, torch, device, graphs=True, pinned=True, device_tensors=False):
        self.torch = torch
        self.device_tensors = device_tensors
        self.slots = None  # DeviceSlots, once the client asks for them
        self.device = device
        self.graphs = graphs
        self.pinned = pinned
        self.stream = torch.cuda.Stream(device)
        self.graph = None
        self._key = None
        self.static_in = None
        self.static_out = None
        self._region = None  # (base array, pointer, how)
        self._hosts = {}  # id(numpy view) -> (view, torch tensor over it)
        self._shm = None  # the attached shm.Region (its slot table and ``fill``)
        self._pf_seq = None  # streamed inputs: the request seq the prefetched bytes belong to
        self._pf = {}  # input index -> bytes of its static input already queued for DMA
        self.info = {"stream": "dedicated", "sync_per_call": 1,
                     "cuda_graph": {"state": "pending" if graphs else "off"},
                     "pinned_region": {"state": "pending" if pinned else "off"}}
        if not graphs:
            self.info["cuda_graph"]["why"] = "turned off (cuda_graphs=off)"
        if not pinned:
            self.info["pinned_region"]["why"] = "turned off (pinned_region=off)"
        self.info["device_tensors"] = {"state": "off"} if not device_tensors else {
            "state": "on", "note": "device slots are allocated at the first device-tensor call"}

    # ----------------------------------------------------------------- the region
    def attach_region(self, region):
        """Register ``region``'s mapping with CUDA (once per region; the old one unregistered)."""
        self.detach_region()
        self._hosts = {}
        self._shm = region
        if not self.pinned:
            return
        base = np.frombuffer(region.mm, dtype=np.uint8)
        ptr = int(base.ctypes.data)
        t0 = time.perf_counter()
        how, error = register_host(self.torch, ptr, int(base.nbytes))
        doc = {"bytes": int(base.nbytes), "register_ms": round((time.perf_counter() - t0) * 1e3, 3)}
        if how is None:
            doc.update(state="failed", why=error)
            self._region = None
        else:
            probe = self.torch.from_numpy(base[:1])
            doc.update(state="registered", via=how, is_pinned=bool(probe.is_pinned()))
            self._region = (base, ptr, how)
        self.info["pinned_region"] = doc

    def detach_region(self):
        self._shm, self._pf_seq, self._pf = None, None, {}
        if self._region is not None:
            _, ptr, how = self._region
            self.torch.cuda.synchronize(self.device)
            unregister_host(self.torch, ptr, how)
            self._region = None
        self._hosts = {}

    def _host(self, array):
        """A torch tensor over ``array``'s bytes (cached for the region's views, which live as
        long as the region)."""
        hit = self._hosts.get(id(array))
        if hit is not None and hit[0] is array:
            return hit[1]
        tensor = self.torch.from_numpy(array)
        if self._region is not None and len(self._hosts) < 4096:
            self._hosts[id(array)] = (array, tensor)
        return tensor

    # ----------------------------------------------------------------- capture
    def capture(self, module, args, arrays):
        """Capture ``module`` at ``args``' shapes (after the eager warm-up; ``arrays`` are the
        host inputs they came from); returns the replay's outputs for ``args`` (device tensors,
        cloned), or None when there is no graph."""
        torch = self.torch
        doc = self.info["cuda_graph"]
        if not self.graphs:
            return None
        t0 = time.perf_counter()
        before = int(torch.cuda.memory_reserved(self.device))
        try:
            static_in = [a.clone() for a in args]
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.no_grad(), torch.cuda.stream(self.stream):
                for _ in range(2):  # cuBLAS/cuDNN choose their algorithms off the capture
                    module(*static_in)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph, stream=self.stream):
                static_out = _values(module(*static_in))
            with torch.cuda.stream(self.stream):
                graph.replay()
                replayed = [v.clone() for v in static_out]
            self.stream.synchronize()
        except Exception as exc:
            try:
                torch.cuda.synchronize(self.device)
            except Exception:
                pass
            self.graph = None
            doc.update(state="failed", why="%s: %s" % (type(exc).__name__, str(exc)[:400]),
                       note="CUDA graph capture failed; the stage serves eager (%s)"
                       % type(exc).__name__)
            return None
        self.graph, self.static_in, self.static_out = graph, static_in, static_out
        self._key = _key(arrays)
        pool = max(int(torch.cuda.memory_reserved(self.device)) - before, 0)
        doc.update(state="captured", capture_ms=round((time.perf_counter() - t0) * 1e3, 3),
                   shapes=[list(a.shape) for a in args], pool_bytes=pool,
                   gated="the warm-up call answers with the replay's outputs")
        return replayed

    def note_eager_difference(self, eager, replayed):
        """The largest difference between the eager warm-up and the replay, per the record."""
        worst = 0.0
        for a, b in zip(eager, replayed):
            if a.is_floating_point() and a.shape == b.shape:
                d = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
                worst = d if d != d else max(worst, d)  # a NaN stays a NaN
            elif not self.torch.equal(a, b):
                self.info["cuda_graph"]["eager_vs_replay_max_abs"] = "a non-float output differs"
                return
        # a NaN (or inf) has no JSON number: say it in words
        self.info["cuda_graph"]["eager_vs_replay_max_abs"] = \
            worst if worst == worst and worst != float("inf") else "not finite (%r)" % worst

    # ----------------------------------------------------------------- calls
    @property
    def streams_inputs(self):
        """A captured graph reading a pinned region: its static inputs can be filled by DMA
        while the caller is still copying (``prefetch``)."""
        return self.graph is not None and self._region is not None and self._shm is not None

    def prefetch(self, s, fill, names):
        """Queue the DMA of the bytes of set ``s``'s next request that the caller has
        announced in ``fill`` (shm.py's "Streamed inputs") into the graph's static input.

        ``names``: the program's inputs in order. Bytes already queued for the same request
        are not queued again; a new request (``seq``) starts afresh.
        """
        if not self.streams_inputs:
            return
        seq, i, upto = fill >> 48, (fill >> 32) & 0xFFFF, fill & 0xFFFFFFFF
        if seq != self._pf_seq:
            self._pf_seq, self._pf = seq, {}
        slots = self._shm.slots
        slot = slots[i] if i < len(slots) else None
        if slot is None or slot.get("set", 0) != s or slot["role"] != "in" \
                or slot["name"] not in names:
            return
        j = names.index(slot["name"])
        dst = self.static_in[j]
        done = self._pf.get(j, 0)
        if not done < upto <= dst.numel() * dst.element_size():
            return
        src = self._host(self._shm.view("in", slot["name"], np.dtype(np.uint8),
                                        (slot["capacity"],), s))
        torch = self.torch
        with torch.cuda.stream(self.stream):
            dst.view(-1).view(torch.uint8)[done:upto].copy_(src[done:upto], non_blocking=True)
        self._pf[j] = upto
        doc = self.info["pinned_region"]
        doc["streamed_bytes"] = doc.get("streamed_bytes", 0) + upto - done

    def _prefetched(self, s):
        """The bytes per input already queued for set ``s``'s request (taken: the next
        request starts afresh), or {} when they belong to another request."""
        got, self._pf, seq, self._pf_seq = self._pf, {}, self._pf_seq, None
        if not got or s is None or self._shm is None or (self._shm.fill(s) >> 48) != seq:
            return {}
        return got

    def _fits_graph(self, arrays):
        return self.graph is not None and _key(arrays) == self._key

    def call(self, module, arrays, views, s=None):
        """One call: ``arrays`` (host inputs in the program's order) in, the outputs into
        ``views`` (a numpy array or None per output). Returns the outputs that had no view
        (index -> numpy array); one stream, one synchronization. ``s``: the region's set the
        inputs are in (bytes ``prefetch`` queued for it are not copied again)."""
        torch = self.torch
        rest = []
        done = self._prefetched(s) if self._pf else {}
        with torch.cuda.stream(self.stream):
            if self._fits_graph(arrays):
                for j, (static, a) in enumerate(zip(self.static_in, arrays)):
                    have = done.get(j, 0)
                    if not have:
                        static.copy_(self._host(a), non_blocking=True)
                    elif have < a.nbytes:  # the rest of a streamed input
                        static.view(-1).view(torch.uint8)[have:].copy_(
                            self._host(a).view(-1).view(torch.uint8)[have:], non_blocking=True)
                self.graph.replay()
                values = self.static_out
            else:
                args = [self._host(a).to(self.device, non_blocking=True) for a in arrays]
                with torch.no_grad():
                    values = _values(module(*args))
            for i, value in enumerate(values):
                view = views[i] if i < len(views) else None
                if view is not None and tuple(view.shape) == tuple(value.shape) \
                        and self._host(view).dtype == value.dtype:
                    self._host(view).copy_(value, non_blocking=True)
                else:
                    rest.append((i, value.to("cpu", non_blocking=True)))
        self.stream.synchronize()
        return dict((i, t.numpy()) for i, t in rest)

    # ----------------------------------------------------------------- device tensors
    def open_device_slots(self, inputs, outputs, n_sets):
        """Allocate (once) ``n_sets`` sets of device slots and return their export frame."""
        from .device_slots import DeviceSlots

        if not self.device_tensors:
            raise ValueError("device tensors are off for this stage: open it with "
                             "--ep-option device_tensors=on")
        if self.slots is None or self.slots.n_sets != n_sets:
            self.slots = DeviceSlots(self.torch, self.device, inputs, outputs, n_sets)
            self.info["device_tensors"] = {
                "state": "exported", "sets": n_sets, "bytes": int(self.slots.buffer.numel()),
                "via": "UntypedStorage._share_cuda_ (CUDA IPC), fields sent as bytes"}
        return self.slots.describe()

    def call_device(self, module, s):
        """One call on set ``s``'s device slots: no host copy; one stream, one sync."""
        if self.slots is None:
            raise RuntimeError("a device-tensor call before the device slots were opened")
        torch = self.torch
        ins, outs = self.slots.views[s]["in"], self.slots.views[s]["out"]
        with torch.cuda.stream(self.stream):
            if self.graph is not None:
                for static, t in zip(self.static_in, ins):
                    static.copy_(t, non_blocking=True)
                self.graph.replay()
                values = self.static_out
            else:
                with torch.no_grad():
                    values = _values(module(*ins))
            for slot, value in zip(outs, values):
                slot.copy_(value, non_blocking=True)
        self.stream.synchronize()

    def close(self):
        self.slots = None
        self.detach_region()
        self.graph = self.static_in = self.static_out = None
