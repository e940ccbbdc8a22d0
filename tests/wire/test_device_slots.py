"""Device tensors' framing without a GPU (docs/torch.md, "Device tensors in, device tensors out"):
the slot layout, the CUDA IPC fields as bytes (never pickled), the option, the ledger's device
slots and the client's refusals.

The GPU half (the handle opened in another process, the calls) is ``tests/gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest

from xstage import errors
from xstage.client import device_slots as client_slots
from xstage_remote import device_slots, shm, wire

IN = [{"name": "x", "dtype": "float32", "shape": [3, 5]}]
OUT = [{"name": "y", "dtype": "float16", "shape": [7]}, {"name": "s", "dtype": "int64", "shape": []}]


def test_the_layout_aligns_every_slot_and_repeats_per_set():
    slots, size = device_slots.layout(IN, OUT, 2)
    assert [(s["set"], s["role"], s["name"]) for s in slots] == [
        (0, "in", "x"), (0, "out", "y"), (0, "out", "s"), (1, "in", "x"), (1, "out", "y"),
        (1, "out", "s")]
    assert [s["nbytes"] for s in slots[:3]] == [60, 14, 8]
    assert all(s["offset"] % device_slots.ALIGN == 0 for s in slots)
    assert size == 6 * device_slots.ALIGN
    ends = [s["offset"] + s["nbytes"] for s in slots]
    assert all(e <= nxt["offset"] for e, nxt in zip(ends, slots[1:], strict=False))  # no overlap


def test_the_layout_needs_fixed_shapes():
    with pytest.raises(ValueError, match="fixed shapes: in x"):
        device_slots.layout([{"name": "x", "dtype": "float32", "shape": ["batch", 4]}], OUT, 1)


def _fields():
    # UntypedStorage._share_cuda_()'s eight fields, as torch 2.x returns them
    return (0, b"\x01" * 64 + b"\x00\x07", 1 << 21, 512, b"/torch_123_456_0", 3, b"\x09" * 64, True)


def test_the_ipc_fields_travel_as_bytes_through_a_frame():
    header, arrays = device_slots.pack(_fields())
    assert set(arrays) == {"ipc_handle", "ipc_ref_counter_handle", "ipc_event_handle"}
    assert all(a.dtype == np.uint8 for a in arrays.values())
    assert header == {"device": 0, "size_bytes": 1 << 21, "offset_bytes": 512,
                      "ref_counter_offset": 3, "event_sync_required": True}
    assert device_slots.unpack(header, arrays) == _fields()
    frame = b"".join(bytes(b) for b in wire.encode_frame(
        wire.with_generation({"op": "device_slots_ready", "id": 4, "info": header}, 1), arrays))
    parsed = wire.parse_frame(frame)  # the strict reader the client uses
    assert device_slots.unpack(parsed.header["info"], parsed.arrays()) == _fields()


def test_an_event_handle_torch_left_none_comes_back_none():
    fields = (*_fields()[:6], None, False)  # torch synchronized its stream instead of an event
    header, arrays = device_slots.pack(fields)
    assert header["none_fields"] == ["event_handle"] and arrays["ipc_event_handle"].size == 0
    assert device_slots.unpack(header, arrays) == fields


def test_a_field_of_the_wrong_kind_is_named():
    bad = list(_fields())
    bad[1] = "not bytes"
    with pytest.raises(ValueError, match="field handle is str, expected bytes"):
        device_slots.pack(tuple(bad))
    with pytest.raises(ValueError, match="returned 7 fields, expected 8"):
        device_slots.pack(_fields()[:7])
    header, arrays = device_slots.pack(_fields())
    del arrays["ipc_event_handle"]
    with pytest.raises(ValueError, match="event_handle is missing"):
        device_slots.unpack(header, arrays)
    header, arrays = device_slots.pack(_fields())
    header["size_bytes"] = "2097152"
    with pytest.raises(ValueError, match="size_bytes is '2097152', expected an integer"):
        device_slots.unpack(header, arrays)


def test_the_request_flag_is_its_own_bit():
    assert shm.FLAG_DEVICE_TENSORS & shm.FLAG_RESET_STATE == 0
    assert {"device_slots", "device_slots_ready"} <= set(wire.OPS)


# ---------------------------------------------------------------------- the client's refusals
class _FakeCuda:
    """What the client reads of a CUDA tensor, without torch (its type's module is torch's)."""

    is_cuda = True

    def __init__(self, device="cuda:0", dtype="torch.float32", shape=(3, 5)):
        self.device, self.dtype, self.shape = device, dtype, shape


_FakeCuda.__module__ = "torch"


class _Client:
    inputs = IN  # CallHost.inputs: the caller's inputs


def _slots():
    slots = client_slots.DeviceSlots(_Client(), "cuda:0")  # type: ignore[arg-type]
    slots.views = [{"in": {"x": None}, "out": {}}]  # opened (the GPU half opens it for real)
    cuda = type("cuda", (), {"current_stream": staticmethod(lambda d: "default"),
                             "default_stream": staticmethod(lambda d: "default")})
    slots._torch = type("torch", (), {"cuda": cuda})
    slots._base = type("base", (), {"device": "cuda:0"})
    return slots


def test_cuda_tensors_to_a_stage_without_device_tensors_are_a_usage_error():
    assert client_slots.on_device(None, {"x": np.zeros((3, 5), np.float32)}) is False
    with pytest.raises(errors.UsageError) as bad:
        client_slots.on_device(None, {"x": _FakeCuda()})
    assert "without device tensors" in str(bad.value)
    assert "device_tensors=on" in bad.value.remedy


def test_a_mix_of_cuda_tensors_and_host_arrays_is_a_usage_error():
    with pytest.raises(errors.UsageError, match="mixes CUDA tensors and host arrays"):
        _slots().takes({"x": _FakeCuda(), "z": np.zeros(1)})
    assert _slots().takes({"x": np.zeros(1)}) is False
    assert _slots().takes({"x": _FakeCuda()}) is True


def test_a_tensor_on_another_gpu_is_a_usage_error_naming_both():
    with pytest.raises(errors.UsageError) as bad:
        _slots().check({"x": _FakeCuda(device="cuda:1")})
    assert "cuda:1" in str(bad.value) and "cuda:0" in str(bad.value)
    assert ".to('cuda:0')" in bad.value.remedy


def test_a_tensor_of_another_dtype_or_shape_is_an_input_error():
    with pytest.raises(errors.InputError, match=r"float16\[3, 5\], the stage takes float32"):
        _slots().check({"x": _FakeCuda(dtype="torch.float16")})
    with pytest.raises(errors.InputError, match=r"float32\[5, 3\]"):
        _slots().check({"x": _FakeCuda(shape=(5, 3))})
    with pytest.raises(errors.InputError, match="do not match"):
        _slots().check({"w": _FakeCuda()})
    assert list(_slots().check({"x": _FakeCuda()})) == ["x"]


def test_from_loaded_reads_the_workers_switch():
    def loaded(state):
        return {"info": {"device": "cuda:0", "accelerator": {"device_tensors": {"state": state}}}}

    assert client_slots.from_loaded(_Client(), loaded("off")) is None  # type: ignore[arg-type]
    assert client_slots.from_loaded(_Client(), {"info": {}}) is None  # type: ignore[arg-type]
    on = client_slots.from_loaded(_Client(), loaded("on"))  # type: ignore[arg-type]
    assert on is not None and on.device == "cuda:0" and not on.views  # opened at the first call
