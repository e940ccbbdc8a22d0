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

Higher-order ops (``cond``, ``while_loop``, ``map``: logged ``hop:<name>``) are control flow:
the ops inside their branches and bodies are logged as ops of their own, so the wrapper is not
counted (its time contains theirs), as ``If``/``Loop``/``Scan`` are not on ONNX routes.

Two fractions, both of which must reach ``min_placement``: the op fraction (on-target ops /
counted ops) and the time fraction (device-kernel time on the target / all op time: the
profiler's device kernel time where the route has one (CUDA), else the host time of the
on-target ops; all op time adds the host time of the ops off the target and of the copies).
Nothing counted is ``unmeasured`` (no evidence), never ``declined``. Outputs that come back
elsewhere than the target refuse the stage with ``outputs_off_device`` whatever the fractions.
The result is the same ``PlacementProof`` the ONNX
routes get, with ``target_ep`` ``torch:<device type>`` and the off-target ops by name in
``cpu_nodes``, so a module that moves part of its work to the CPU and back is caught.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xstage.evidence.proof import PlacementProof

__all__ = ["HOP_PREFIX", "NEUTRAL_OPS", "prove_torch"]

#: How the worker names a higher-order op's own record (``hop:cond``).
HOP_PREFIX = "hop:"

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
    on = off = copies = neutral = control = 0
    on_us = off_us = 0.0
    timed = True
    off_ops: dict[str, list[str]] = {}
    hops: dict[str, int] = {}
    for rec in ops:
        op, n = str(rec["op"]), int(rec["count"])
        ins, outs = list(rec.get("in") or []), list(rec.get("out") or [])
        us = rec.get("time_us")
        timed = timed and isinstance(us, (int, float))
        t = float(us) if isinstance(us, (int, float)) else 0.0
        devices = set(ins) | set(outs)
        if op.startswith(HOP_PREFIX):
            control += n
            hops[op[len(HOP_PREFIX):]] = hops.get(op[len(HOP_PREFIX):], 0) + n
        elif op in NEUTRAL_OPS or not devices:
            neutral += n
        elif op in _COPY_OPS and set(ins) != set(outs):
            copies += n
            off_us += t
        elif all(_on(d, target) for d in devices):
            on += n
            on_us += t
        else:
            off += n
            off_us += t
            where = ",".join(sorted(d for d in devices if not _on(d, target)))
            off_ops.setdefault(op, []).append(f"{op}×{n} on {where}")
    counted = on + off
    op_fraction = on / counted if counted else 0.0
    device_us = kernels.get("device_time_us") if kernels else None
    if isinstance(device_us, (int, float)) and device_us > 0:
        on_us = float(device_us)  # the device's own kernel time, not the launches
    time_fraction = on_us / (on_us + off_us) if timed and on_us + off_us > 0 else None
    stray = [d for d in (output_devices or []) if not _on(d, target)]
    notes = [f"{on} ops on {target}, {off} off it, {copies} host/device copies, {neutral} views "
             f"and metadata ops not counted (torch {torch_version or '?'})"]
    if hops:
        notes.append("control flow (its inner ops counted, not the wrapper): "
                     + ", ".join(f"{k}×{v}" for k, v in sorted(hops.items())))
    if kernels:
        notes.append(f"profiler: {kernels.get('device_kernels')} device kernels, "
                     f"{kernels.get('device_time_us', 0):.0f} µs")
    if time_fraction is None:
        notes.append("no op times logged: the op fraction decides alone")
    if stray:
        notes.append(f"outputs came back on {sorted(set(stray))}, not {target}")
    decided = op_fraction if time_fraction is None else min(op_fraction, time_fraction)
    shared: dict[str, Any] = dict(
        node_fraction=op_fraction if counted else None, nodes_on_target=on, nodes_total=counted,
        plan_copies=copies, copies=copies, time_fraction=time_fraction,
        kernel_time_on_target_us=round(on_us) if time_fraction is not None else None,
        kernel_time_total_us=round(on_us + off_us) if time_fraction is not None else None,
        control_flow_kernels=control,
        cpu_nodes={op: tuple(v) for op, v in sorted(off_ops.items())} if target != "cpu" else {},
        off_target_nodes={"off_target": {op: tuple(v) for op, v in sorted(off_ops.items())}}
        if off_ops else {})
    if not counted:  # nothing counted: no evidence either way
        return PlacementProof(verdict="unmeasured", cause="unmeasured", basis=None, fraction=None,
                              notes=(*notes, "no op was counted (only views, metadata and "
                                     "control flow): unmeasured never passes"), **shared, **base)
    if stray:
        return PlacementProof(verdict="declined", cause="outputs_off_device", basis="execution",
                              fraction=decided, notes=tuple(notes), **shared, **base)
    placed = decided > 0 and decided >= min_placement
    return PlacementProof(
        verdict="placed" if placed else "declined", cause=None if placed else "declined",
        basis="execution", fraction=decided, notes=tuple(notes), **shared, **base)
