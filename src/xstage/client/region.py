"""The shared-region transport: K slot sets in shared memory, a doorbell, and frames besides.

A worker on this kernel gets a region once its stage is loaded and the signature sizes every
slot (``plan``; ``WorkerClient.fit_region`` sizes symbolic ones from real tensors): each call
writes its inputs into a set's slots, publishes the request in the set's control block and
rings the doorbell; the worker answers in the same set (docs/wire.md). ``SharedRegion`` is an
``InlineFrames`` too (``client/transport.py``): a call whose inputs have no slot or do not fit
one, an output without a slot, and every frame that is not a call travel inline on the control
socket, so the region transport owns its fallback. The pipeline (``client/pipeline.py``)
decides which set a request takes; this module moves its bytes.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xstage import errors
from xstage.client import copies
from xstage.client.outputs import fill
from xstage.client.transport import InlineFrames
from xstage_remote import shm, wire
from xstage_remote.tuning import TransportTuning

__all__ = ["SharedRegion", "capacity", "heads_up_default"]


def heads_up_default(seconds: float) -> int:
    """``seconds`` (the tuning's ``heads_up_seconds``) in ns with 4 CPUs or more, else 0.

    On the 2-vCPU VM a heads-up's ring made the caller 60 µs slower (the woken worker took
    the caller's CPU, the other was asleep) for a worker woken ~3 µs earlier; with CPUs to
    spare the woken worker lands on an idle one (``benchmarks/heads_up.py``).
    """
    return int(seconds * 1e9) if copies.allowed_cpus() >= 4 else 0


def capacity(decl: Mapping[str, Any]) -> int | None:
    """The bytes a declared tensor takes, or None where a dimension is not fixed."""
    n = wire.DTYPES[decl["dtype"]][1]
    for d in decl["shape"]:
        if not isinstance(d, int):
            return None
        n *= d
    return int(n)


class SharedRegion(InlineFrames):
    """The shared region's slot sets (once attached), its doorbell, and frames besides.

    ``region`` is None until a load's signature sizes one (then calls go inline);
    ``expected_s`` is the moving average of the worker's compute time per call, which the
    doorbell waits by; ``copies`` splits large copies in and out (``client/copies.py``).
    """

    kind = "region"

    def __init__(self, ctl: socket.socket, bell: socket.socket, pool: copies.CopyPool,
                 tuning: TransportTuning | None = None) -> None:
        super().__init__(ctl)
        #: The client's knobs (``xstage_remote.tuning``): the doorbell's policy, the region's ceiling.
        self.tuning = tuning or TransportTuning()
        self.bell = shm.Doorbell(bell, tuning=self.tuning)
        self.copies = pool
        self.expected_s = 0.0
        #: Bytes seen per tensor name (``fit``): a symbolic slot is sized from them.
        self.observed: dict[str, int] = {}
        #: The caller's inputs (the loaded signature's, state inputs left out).
        self.inputs: list[dict[str, Any]] = []
        self._names_of: list[dict[str, Any]] | None = None  # the outputs _out_names lists
        self._out_names: list[str] = []

    # ------------------------------------------------------------------ the interface
    def cancel(self, rid: int, s: int) -> bool:
        """Withdraw request ``rid`` of set ``s`` if the worker has not taken it.

        Raises:
            ValueError: the region was closed (the worker is gone).
        """
        region = self.region
        return region is not None and bool(region.withdraw(rid, s))

    def close(self) -> None:
        """Unmap the region and close the doorbell (its socket included)."""
        if self.region is not None:
            self.region.close()
            self.region = None
        self.bell.close_eventfds()
        self.bell.sock.close()

    def stats(self) -> dict[str, Any]:
        """The doorbell policy's decisions so far, on this side (``waitpolicy``)."""
        return self.bell.summary()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ sizing
    def plan(self, depth: int) -> tuple[Any, int]:
        """(slots, size) of a region for the loaded signature, or (None, 0) if none fits."""
        def cap(d: Mapping[str, Any]) -> int | None:
            declared = capacity(d)
            seen = self.observed.get(d["name"])
            if declared is None:
                return seen
            return max(declared, seen or 0)

        return shm.plan_layout(  # type: ignore[no-any-return]
            [(d["name"], d["dtype"], cap(d)) for d in self.inputs],
            [(d["name"], d["dtype"], cap(d)) for d in self.outputs],
            sets=depth,
            max_bytes=self.tuning.max_region_bytes,
        )

    def fits_seen(self) -> bool:
        """Whether the attached region's slots hold every tensor seen or declared."""
        region = self.region
        if region is None:
            return False
        for role, decls in (("in", self.inputs), ("out", self.outputs)):
            for d in decls:
                need = self.observed.get(d["name"], capacity(d))
                if need is None:
                    continue
                have = region.capacity(role, d["name"])
                if have is None or have < need:
                    return False
        return True

    def adopt(self, region: shm.Region, events: Sequence[int] | None, dma: bool) -> None:
        """The region the worker just attached replaces the old one; the doorbell binds it.

        ``dma``: the worker's device reads the inputs from the region (large inputs are
        written in announced chunks, ``shm.py``); else large copies go on the copy threads.
        """
        if self.region is not None:
            self.region.close()  # the worker let go of it when it attached the new one
        self.region = region
        if dma:
            region.stream_fill = True
        elif self.copies.threads:
            region.use_copier(self.copies)
        self.bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
        if events is not None:  # the worker waits on the first and rings the second
            self.bell.use_eventfds(events[1], events[0])

    def slot_shapes(self, shapes: Mapping[str, Sequence[int]] | None
                    ) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
        """Each input's (dtype, shape) for ``input_slots``, checked against its slot.

        Raises:
            UsageError: a dimension neither fixed nor given, or a shape too large for its slot.
        """
        region = self.region
        assert region is not None
        wanted = {}
        for d in self.inputs:
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

    # ------------------------------------------------------------------ a call's bytes
    @staticmethod
    def fits(region: shm.Region, feeds: Mapping[str, np.ndarray]) -> bool:
        """Every input has a slot it fits in ``region``."""
        for name, arr in feeds.items():
            cap = region.capacity("in", name)
            if cap is None or arr.nbytes > cap:
                return False
        return True

    def write_inputs(self, region: shm.Region, feeds: Mapping[str, Any], s: int,
                     device: Any) -> int | None:
        """Set ``s``'s inputs into the region, or into the device slots; the flags to publish.

        Device tensors (``device_slots.py``) go to the worker's device slots of set ``s``. None
        when a host input has no slot or does not fit it (``Region.write`` checks).
        """
        if device is not None and device.holds(s, feeds):
            return device.write(feeds, s)  # type: ignore[no-any-return]
        for name, arr in feeds.items():
            if not region.write("in", name, arr, s):
                return None
        return 0

    def fill_output(self, target: np.ndarray | None, value: np.ndarray, name: str) -> np.ndarray:
        """A region output copied out (``fill``), a large one on the copy threads."""
        return fill(target, value, name, self.copies)

    def read_outputs(self, region: shm.Region, s: int, out: Mapping[str, np.ndarray],
                     result: dict[str, np.ndarray], views: bool = False,
                     device: Any = None) -> None:
        """Set ``s``'s outputs into ``result``, each descriptor checked before its copy.

        A name the caller gave an ``out`` array for is copied into it; with ``views``, the
        others are read-only views of their slots (no copy). Where set ``s``'s outputs are on
        the worker's device (``device``, ``device_slots.py``), they are views of its device
        slots instead.

        Raises:
            wire.ProtocolError: a descriptor the worker wrote is out of its slot's bounds.
        """
        if device is not None and device.on_device.get(s):
            result.update(device.outputs(s))
            return
        fill_output = self.fill_output
        if self._names_of is not self.outputs:  # the names, once per load
            self._names_of, self._out_names = self.outputs, [d["name"] for d in self.outputs]
        whole = self.copies.min_bytes  # a copy this large is split (``copies.CopyPool``)
        for name in self._out_names:
            view = region.output(name, s)  # the descriptor checked (cached by its bytes)
            target = out.get(name) if out else None
            if target is not None:
                result[name] = fill_output(target, view, name)
            elif views:
                ro = view.view()
                ro.flags.writeable = False
                result[name] = ro
            elif view.nbytes < whole:  # a slot view is C-contiguous: its copy is owned, C order
                result[name] = view.copy()
            else:
                result[name] = fill_output(None, view, name)
