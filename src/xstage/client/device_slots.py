"""Device tensors in, device tensors out: the client's half (``--ep-option device_tensors=on``).

A torch-cuda stage opened with ``device_tensors=on`` takes CUDA tensors on its own GPU as
inputs. At the first such call the client asks the worker for its device slots
(``xstage_remote.device_slots``): one device buffer of K slot sets, exported once by CUDA IPC
as explicit fields (ints and bytes, never pickled) and opened here with
``torch.multiprocessing.reductions.rebuild_cuda_tensor``. A call copies its inputs device to
device into set s, waits for the copy on the caller's current stream, and publishes the
request in the shared region with ``FLAG_DEVICE_TENSORS`` (ids, doorbell, deadlines and
cancellation stay the region's); its outputs are views of set s's output slots, valid until the
request K submissions later is submitted (at depth 1: the next call). torch is imported only
here, and only when a stage asks for device tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xstage import errors
from xstage_remote import shm
from xstage_remote.device_slots import unpack

if TYPE_CHECKING:
    from xstage.client.host import CallHost

__all__ = ["DeviceSlots", "busy", "carried", "from_loaded", "is_cuda_tensor", "on_device"]


def from_loaded(client: CallHost, loaded: Mapping[str, Any]) -> DeviceSlots | None:
    """The stage's device slots when its worker serves device tensors, else None.

    Read from ``loaded``'s ``info.accelerator.device_tensors``.
    """
    acc = (loaded.get("info") or {}).get("accelerator")
    doc = acc.get("device_tensors") if isinstance(acc, dict) else None
    if not isinstance(doc, dict) or str(doc.get("state", "off")) == "off":
        return None
    return DeviceSlots(client, str((loaded.get("info") or {}).get("device") or "cuda:0"))


def on_device(slots: DeviceSlots | None, inputs: Mapping[str, Any]) -> bool:
    """Whether a call's ``inputs`` take the device path (``slots.check`` them then).

    Raises:
        UsageError: CUDA tensors given to a stage without device tensors, or a mix.
    """
    if slots is not None:
        return slots.takes(inputs)
    if any(is_cuda_tensor(v) for v in inputs.values()):
        raise errors.UsageError(
            "CUDA tensors given to a stage opened without device tensors",
            remedy="open a torch-cuda stage with --ep-option device_tensors=on "
            "(open_stage(..., ep_options={'device_tensors': 'on'})), or pass host arrays "
            "(tensor.cpu().numpy())")
    return False


def is_cuda_tensor(value: Any) -> bool:
    """A torch CUDA tensor, told without importing torch."""
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_cuda", False))


class DeviceSlots:
    """The worker's device slots, opened in this process; which sets hold a device request."""

    def __init__(self, client: CallHost, device: str) -> None:
        self.client = client
        self.device = device
        self.views: list[dict[str, dict[str, Any]]] = []
        self.on_device: dict[int, bool] = {}
        self.info: dict[str, Any] = {}
        self._torch: Any = None
        self._base: Any = None  # the rebuilt buffer: the views keep the mapping alive
        self._accepted: set[tuple[Any, ...]] = set()  # signatures checked (``check``)

    # ------------------------------------------------------------------ a call's inputs
    def takes(self, inputs: Mapping[str, Any]) -> bool:
        """True when every input is a CUDA tensor (the device path); a mix is a usage error."""
        kinds = [is_cuda_tensor(v) for v in inputs.values()]
        if any(kinds) and not all(kinds):
            raise errors.UsageError(
                "a call mixes CUDA tensors and host arrays",
                remedy="pass every input on the stage's GPU (device tensors) or every one on "
                "the host")
        return bool(kinds) and all(kinds)

    def check(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` in the stage's order, each on the slots' device at its dtype and shape.

        A signature seen before (names, devices, dtypes, shapes) is not checked again: calls
        repeat one, and each check reads several torch attributes (~10 µs a call).
        """
        self.open()
        key = tuple((n, str(t.device), t.dtype, tuple(t.shape)) for n, t in inputs.items())
        if key not in self._accepted:
            self._check(inputs)
            if len(self._accepted) > 64:
                self._accepted.clear()
            self._accepted.add(key)
        out = {d["name"]: inputs[d["name"]] for d in self.client.inputs}
        torch, device = self._torch, self._base.device
        stream = torch.cuda.current_stream(device)
        if stream != torch.cuda.default_stream(device):
            # a queued request's copy runs on the pump thread's stream: the inputs the caller's
            # own stream is still computing are finished here, in the caller's thread
            stream.synchronize()
        return out

    def _check(self, inputs: Mapping[str, Any]) -> None:
        declared = self.client.inputs
        if set(inputs) != {d["name"] for d in declared}:
            raise errors.InputError(f"inputs {sorted(inputs)} do not match the stage's "
                                    f"{sorted(d['name'] for d in declared)}")
        for d in declared:
            name, t = d["name"], inputs[d["name"]]
            if str(t.device) != self.device:
                raise errors.UsageError(
                    f"input {name} is on {t.device}; this stage's device slots are on "
                    f"{self.device} (device tensors are shared only on the stage's own GPU)",
                    remedy=f"move it with .to('{self.device}'), or pass a host array")
            dtype = str(t.dtype).replace("torch.", "")
            if dtype != d["dtype"] or list(t.shape) != list(d["shape"]):
                raise errors.InputError(f"input {name} is {dtype}{list(t.shape)}, the stage "
                                        f"takes {d['dtype']}{list(d['shape'])}")

    def inputs(self, s: int) -> dict[str, Any]:
        """Set ``s``'s input slots, to be written in place by the caller.

        A call given these very tensors (the set it is published in) copies nothing: the
        caller's own kernels produced the inputs where the worker reads them.
        """
        self.open()
        return dict(self.views[s]["in"])

    def reserved_inputs(self, s: int) -> dict[str, Any]:
        """Set ``s``'s input slots as tensors of their own (``WorkerClient.device_inputs``).

        New tensor objects over the same device memory: the reservation of set ``s`` ends
        when the caller drops them, which the slots' own tensors (kept here) never are.
        """
        self.open()
        return {name: t.view(t.shape) for name, t in self.views[s]["in"].items()}

    # ------------------------------------------------------------------ the slots
    def open(self) -> None:
        """Ask the worker for its slots once and open them here."""
        if not self.views:
            with self.client.lock:  # a frame on the socket: nothing else drives meanwhile
                if not self.views:
                    self._open()

    def _open(self) -> None:
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        c = self.client
        frame = c.request({"op": "device_slots"}, "device_slots_ready", "load")
        info = dict(frame.header["info"])
        try:
            fields = unpack(info, frame.arrays())
        except ValueError as exc:
            raise errors.RemoteProtocolError(f"worker {c.pid}: {exc}") from exc
        device, handle, size, offset, ref, ref_offset, event, sync = fields
        # torch's own rebuild of a shared CUDA storage, from the explicit fields
        base = rebuild_cuda_tensor(torch.Tensor, (size,), (1,), 0, torch.UntypedStorage,
                                   torch.uint8, device, handle, size, offset, False, ref,
                                   ref_offset, event, sync)
        views: list[dict[str, dict[str, Any]]] = [{"in": {}, "out": {}}
                                                  for _ in range(int(info["sets"]))]
        for slot in info["slots"]:
            raw = base[slot["offset"]:slot["offset"] + slot["nbytes"]]
            views[slot["set"]][slot["role"]][slot["name"]] = \
                raw.view(getattr(torch, slot["dtype"])).view(slot["shape"])
        self._torch, self._base = torch, base
        self.info = {k: v for k, v in info.items() if k != "slots"}
        self.views = views

    def release(self) -> None:
        """Drop this process's handles on the worker's device buffer before it is asked to end.

        A producer that exits while a consumer still maps its memory warns ("Producer process
        has been terminated before all shared CUDA tensors released"). Outputs the caller
        still holds keep their part mapped until they go.
        """
        if not self.views:
            return
        torch = self._torch
        self.views, self._base = [], None
        torch.cuda.ipc_collect()

    def write(self, feeds: Mapping[str, Any], s: int) -> int:
        """Set ``s``'s inputs, device to device; the flag to publish the request with.

        The copy runs on the caller's current stream and is waited for: the worker reads the
        slots from its own stream, in its own process. An input that is set ``s``'s own slot
        (written in place) is not copied.
        """
        slots = self.views[s]["in"]
        for name, t in feeds.items():
            slot = slots[name]
            if t is not slot and t.data_ptr() != slot.data_ptr():
                slot.copy_(t)  # a slot written in place (``inputs``) is not copied onto itself
        # The caller's writes, copies or its own kernels into the slots, finish before the
        # worker reads them: with nothing queued this costs one driver call, no GPU work.
        self._torch.cuda.current_stream(self._base.device).synchronize()
        self.on_device[s] = True
        return shm.FLAG_DEVICE_TENSORS

    def holds(self, s: int, feeds: Mapping[str, Any]) -> bool:
        """Whether set ``s``'s request is a device one (it is noted for its answer)."""
        device = bool(self.views) and bool(feeds) and is_cuda_tensor(next(iter(feeds.values())))
        self.on_device[s] = device
        return device

    def outputs(self, s: int) -> dict[str, Any]:
        """Set ``s``'s output slots (views: valid until set ``s`` is written again)."""
        return dict(self.views[s]["out"])


def carried(device: DeviceSlots | None, feeds: Mapping[str, Any]) -> bool:
    """Whether a request's inputs are device tensors (a stage with device slots)."""
    return device is not None and bool(feeds) and is_cuda_tensor(next(iter(feeds.values())))


def busy(s: int) -> errors.SlotsBusy:
    """A device call finds set ``s`` (next) reserved by another ``device_inputs()``."""
    return errors.SlotsBusy(
        f"slot set {s}, the next one, is reserved by a device_inputs() call whose tensors "
        "have not been called with yet; device tensors cannot go around it inline",
        remedy="call the stage with the tensors device_inputs() gave (or drop them) "
        "before calling with tensors of your own")
