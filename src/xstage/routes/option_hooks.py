"""The execution-provider option builders a route spec names as its ``ep_hook``.

A hook gets the route's default options (to fill in place), the artifact format, the device it
will drive and what the user passed with ``--ep-option``, and returns notes saying what it
added and why (they go into the record). User options always win: ``hooks.ep_options_for``
applies them after the hook. Pure functions: they import nothing of xstage, so ``specs`` can
point at them and ``hooks`` can read the specs without a cycle.

Only the ``ort-cpu`` and ``ort-openvino`` hooks ran on a machine of this project (their specs
say ``verified``); the others are written from their EPs' documentation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

__all__ = ["DeviceOverride", "Hook", "cuda", "dml", "format_options", "none", "openvino", "vitisai"]

Hook = Callable[[dict[str, str], str, str | None, Mapping[str, str]], list[str]]


class DeviceOverride(Exception):
    """A user EP option that selects another device than the planned one (a usage error).

    Attributes:
        option: the ``--ep-option`` key (``device_type``).
        value: what the user gave.
        selects: the xstage device class it selects (``cpu``, ``gpu``, ``npu``), or the
            several it lists.
        planned: the xstage device the plan chose.
    """

    def __init__(self, option: str, value: str, selects: tuple[str, ...], planned: str) -> None:
        super().__init__(f"--ep-option {option}={value} selects {', '.join(selects)}, "
                         f"not the planned {planned}")
        self.option, self.value, self.selects, self.planned = option, value, selects, planned


def _device_kind(device: str) -> str:
    kind = device.split(":")[0].lower()
    return "gpu" if kind.startswith("gpu") else kind


def _openvino_name(device: str | None) -> str:
    """The OpenVINO device name of an xstage device: ``npu:intel:0`` → ``NPU``, a GPU → ``GPU``,
    the CPU or none → ``CPU``."""
    kind = _device_kind(device) if device else "cpu"
    return kind.upper() if kind in ("gpu", "npu") else "CPU"


def _openvino_kinds(device_type: str) -> tuple[str, ...]:
    """``GPU.1`` → (``gpu``,); ``HETERO:GPU,CPU`` / ``AUTO:NPU,CPU`` → every device listed."""
    text = device_type.split(":", 1)[1] if ":" in device_type else device_type
    return tuple(p.strip().split(".")[0].split("(")[0].lower() for p in text.split(",") if p.strip())


def openvino(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """OpenVINO computes fp32 graphs in bf16 on CPUs with AMX (and where bf16 is native)
    unless told otherwise — 12% relative L2 error on a detector with every node placed. For an
    fp32 artifact, ask for f32 inference unless the user chose a precision themselves."""
    if "device_type" in user and device:  # the user's device_type must select the planned device
        kinds = _openvino_kinds(user["device_type"])
        if not kinds or any(k != _device_kind(device) for k in kinds):
            raise DeviceOverride("device_type", user["device_type"], kinds or ("nothing",), device)
    # The one that runs: the user's, the probe's, else the planned device's kind (a plugin EP is
    # bound to its device by the EP-device API and has no device_type among its options).
    device_type = user.get("device_type") or opts.get("device_type") or _openvino_name(device)
    if fmt.endswith(":fp32") and "load_config" not in user and "precision" not in user:
        target = device_type.split(".")[0].split(":")[0]
        opts["load_config"] = json.dumps({target: {"INFERENCE_PRECISION_HINT": "f32"}})
        return [f"INFERENCE_PRECISION_HINT=f32 on {target} for an fp32 artifact "
                "(OpenVINO otherwise may compute in bf16)"]
    return []


def vitisai(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """The AMD NPU takes A16W8 only; caching compiled graphs avoids minutes per start."""
    notes = []
    if fmt != "onnx:a16w8":
        notes.append(f"VitisAI on XDNA2 declines {fmt} graphs (only A16W8 is taken): expect a refusal")
    if "cache_dir" not in user:
        notes.append("no cache_dir: the NPU compiles the graph on every start")
    return notes


def dml(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """DirectML picks an adapter by index, and index 0 is often the discrete card on a laptop:
    the adapter is matched to the device by identity (``xstage.host.adapters``) and bound through
    its EP device, or, with no EP-device API, ``device_id`` comes from the only GPU there is. A
    user ``device_id`` still wins, as every user option does; the note says so, and the record's
    attestation judges the adapter the EP bound."""
    if "device_id" in user and "device_id" not in opts:
        return [f"--ep-option device_id={user['device_id']} names a DXGI adapter by index, beside the "
                f"adapter chosen by identity for {device}"]
    return []


def cuda(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """``gpu_discrete:nvidia:<i>`` → ``device_id=<i>``; a user ``device_id`` for another card
    than the planned one is a usage error (``DeviceOverride``)."""
    if device and device.count(":") == 2:
        index = device.rsplit(":", 1)[1]
        wanted = user.get("device_id")
        if wanted is not None and wanted != index:
            raise DeviceOverride("device_id", wanted, (f"{device.rsplit(':', 1)[0]}:{wanted}",),
                                 device)
        if wanted is None:
            opts["device_id"] = index
    return []


def none(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """A route whose EP needs nothing beyond its spec's options and the user's."""
    return []


def format_options(per_format: Mapping[str, Mapping[str, str]]) -> Hook:
    """A plugin table's hook: the options its ``format_options`` give a session of the artifact's
    format, each unless the user set it (ggml's ``weights=f32`` for ``onnx:fp32``: ggml otherwise
    stores fp32 weights as f16, measured rel_l2 5.5e-4 on an MLP, over the fp32 gate's 1e-4)."""
    def hook(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
        notes = []
        for key, value in (per_format.get(fmt) or {}).items():
            if key not in user:
                opts[key] = str(value)
                notes.append(f"{key}={value} for an {fmt} artifact (the plugin table's format_options)")
        return notes

    return hook
