"""Per-route setup of an execution provider: small option builders, one per route.

A hook gets the route's default options, the artifact format, the device it will drive and
what the user passed with ``--ep-option``, and returns the options to ask onnxruntime for.
User options always win; a hook only fills what the user left unsaid and says why in the
``notes`` it returns (they go into the record).

Only ``ort-cpu`` and ``ort-openvino`` run on a machine of this project; the other hooks are
written from their EPs' documentation and are marked unverified (``VERIFIED``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["VERIFIED", "ep_options_for"]

Hook = Callable[[dict[str, str], str, str | None, Mapping[str, str]], list[str]]


def _openvino(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """OpenVINO computes fp32 graphs in bf16 on CPUs with AMX (and where bf16 is native)
    unless told otherwise — 12% relative L2 error on a detector with every node placed. For an
    fp32 artifact, ask for f32 inference unless the user chose a precision themselves."""
    device_type = user.get("device_type") or opts.get("device_type") or "CPU"  # the one that runs
    if fmt.endswith(":fp32") and "load_config" not in user and "precision" not in user:
        target = device_type.split(".")[0].split(":")[0]
        opts["load_config"] = json.dumps({target: {"INFERENCE_PRECISION_HINT": "f32"}})
        return [f"INFERENCE_PRECISION_HINT=f32 on {target} for an fp32 artifact "
                "(OpenVINO otherwise may compute in bf16)"]
    return []


def _vitisai(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """The AMD NPU takes A16W8 only; caching compiled graphs avoids minutes per start."""
    notes = []
    if fmt != "onnx:a16w8":
        notes.append(f"VitisAI on XDNA2 declines {fmt} graphs (only A16W8 is taken): expect a refusal")
    if "cache_dir" not in user:
        notes.append("no cache_dir: the NPU compiles the graph on every start")
    return notes


def _dml(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """DirectML picks an adapter by index, and index 0 is often the discrete card on a
    laptop: the device's adapter index comes from the probe (``device_options``)."""
    known = "device_id" in opts or "device_id" in user
    return [] if known else ["no adapter index known: DirectML will use adapter 0"]


def _cuda(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    """``gpu_discrete:nvidia:<i>`` → ``device_id=<i>``."""
    if device and device.count(":") == 2 and "device_id" not in user:
        opts["device_id"] = device.rsplit(":", 1)[1]
    return []


def _none(opts: dict[str, str], fmt: str, device: str | None, user: Mapping[str, str]) -> list[str]:
    return []


_HOOKS: dict[str, Hook] = {
    "ort-cpu": _none,
    "ort-openvino": _openvino,
    "ort-vitisai": _vitisai,
    "ort-dml": _dml,
    "ort-cuda": _cuda,
    "ort-tensorrt": _cuda,
    "ort-qnn": _none,
    "ort-coreml": _none,
}

#: Hooks that ran on a machine of this project.
VERIFIED = frozenset({"ort-cpu", "ort-openvino"})


def ep_options_for(
    route: str, fmt: str, device: str | None, base: Mapping[str, Any], user: Mapping[str, str] | None
) -> tuple[dict[str, str], list[str]]:
    """The EP options for ``route`` and the notes explaining what the hook added."""
    user = dict(user or {})
    opts = {k: str(v) for k, v in base.items()}
    notes = _HOOKS.get(route, _none)(opts, fmt, device, user)
    opts.update(user)
    return opts, notes
