"""Placement evidence for torch routes: the warm-up's op log, judged. Pure.

The worker's ``TorchDispatchMode`` logs every op of the profiled warm-up with the devices of
its tensor inputs and outputs, aggregated by (op, input devices, output devices). Here each
kind is sorted into:

* **neutral**: ops that launch no kernel and only view or reshape a tensor (or touch no
  tensor at all, like metadata asserts): not counted on either side;
* **copies**: a ``_to_copy``/``copy_`` whose input and output devices differ (host↔device):
  counted apart, because a copy to the device is how work gets there;
* **on target**: every tensor on the target device type;
* **off target**: anything else — typically ops on the CPU in a CUDA stage.

The fraction is on-target ops / counted ops; outputs that come back elsewhere than the target
decline the stage whatever the fraction. The result is the same ``PlacementProof`` the ONNX
routes get, with ``target_ep`` ``torch:<device type>`` and the off-target ops by name in
``cpu_nodes``, so a module that moves part of its work to the CPU and back is caught.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xstage.evidence.proof import PlacementProof

__all__ = ["NEUTRAL_OPS", "prove_torch"]

#: Ops that only re-describe a tensor (views, shape changes) or check metadata: no kernel.
NEUTRAL_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute", "transpose", "t",
    "squeeze", "unsqueeze", "slice", "select", "split", "split_with_sizes", "unbind", "chunk",
    "narrow", "detach", "alias", "as_strided", "view_as", "flatten", "unflatten", "movedim",
    "_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel", "lift_fresh",
})
_COPY_OPS = frozenset({"_to_copy", "copy_", "to", "_copy_from", "copy"})


def _on(device: str, target: str) -> bool:
    return device.split(":")[0] == target


def prove_torch(*, ops: Sequence[Mapping[str, Any]] | None, output_devices: Sequence[str] | None,
                target_device: str, min_placement: float = 0.5,
                torch_version: str | None = None,
                kernels: Mapping[str, Any] | None = None) -> PlacementProof:
    """Judge a torch stage's warm-up op log (see the module docstring).

    ``target_device`` is the torch device type the route asked for: ``cpu``, ``cuda`` or
    ``privateuseone`` (DirectML).
    """
    target = target_device.split(":")[0]
    name = f"torch:{target}"
    base: dict[str, Any] = dict(target_ep=name, requested_ep=name, session_providers=None,
                                available_providers=None, ort_version=None, min_placement=min_placement,
                                swapped=False, fallback_banner=False)
    if not ops:
        return PlacementProof(verdict="unmeasured", cause="unmeasured", basis=None, fraction=None,
                              notes=("the worker logged no op (profiling did not run)",), **base)
    on = off = copies = neutral = 0
    off_ops: dict[str, list[str]] = {}
    for rec in ops:
        op, n = str(rec["op"]), int(rec["count"])
        ins, outs = list(rec.get("in") or []), list(rec.get("out") or [])
        devices = set(ins) | set(outs)
        if op in NEUTRAL_OPS or not devices:
            neutral += n
        elif op in _COPY_OPS and set(ins) != set(outs):
            copies += n
        elif all(_on(d, target) for d in devices):
            on += n
        else:
            off += n
            where = ",".join(sorted(d for d in devices if not _on(d, target)))
            off_ops.setdefault(op, []).append(f"{op}×{n} on {where}")
    counted = on + off
    fraction = on / counted if counted else 0.0
    stray = [d for d in (output_devices or []) if not _on(d, target)]
    notes = [f"{on} ops on {target}, {off} off it, {copies} host/device copies, {neutral} views "
             f"and metadata ops not counted (torch {torch_version or '?'})"]
    if kernels:
        notes.append(f"profiler: {kernels.get('device_kernels')} device kernels, "
                     f"{kernels.get('device_time_us', 0):.0f} µs")
    if stray:
        notes.append(f"outputs came back on {sorted(set(stray))}, not {target}")
    placed = counted > 0 and fraction > 0 and fraction >= min_placement and not stray
    return PlacementProof(
        verdict="placed" if placed else "declined", cause=None if placed else "declined",
        basis="execution", fraction=fraction, node_fraction=fraction, nodes_on_target=on,
        nodes_total=counted, plan_copies=copies, copies=copies,
        cpu_nodes={op: tuple(v) for op, v in sorted(off_ops.items())} if target != "cpu" else {},
        off_target_nodes={"off_target": {op: tuple(v) for op, v in sorted(off_ops.items())}}
        if off_ops else {},
        notes=tuple(notes), **base)
