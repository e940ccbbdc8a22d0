"""``xstage external --sweep NAME=DIMS;DIMS…`` and ``--batch 1,2,4,8``: one admission per shape.

Parsing here is pure; ``external`` opens, times and writes one record per point. Rules:

1. ``--sweep x=1x3x224x224;2x3x224x224`` names one input's shapes, one point each; repeated for
   several inputs, every ``--sweep`` lists the same number of points (the i-th of each together).
2. ``--batch 1,2,4`` sets the first dimension of every input whose first dimension is not fixed:
   a named one through ``--dim``'s mechanism, an unnamed one (``?``) through a full shape when its
   other dimensions are fixed. A graph with no such input is a usage error naming ``--sweep``.
3. ``--sweep`` and ``--batch`` exclude each other; a point's shape wins over ``--shape`` and
   ``--dim`` for the inputs it names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xstage.errors import UsageError

__all__ = ["SWEEP_COLUMNS", "Point", "batch_points", "check_points", "parse_batches", "sweep_points",
           "sweep_rows"]

#: The sweep table's columns, one row per shape.
SWEEP_COLUMNS = ("shape", "outcome", "placed on", "proof", "parity", "round trip p50", "compute p50",
                 "throughput")


@dataclass(frozen=True)
class Point:
    """One shape of a sweep: its label, the shapes and dimensions it fixes, its batch."""

    label: str
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    batch: int | None = None


def _dims(text: str, flag: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.strip().lower().split("x"))
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not D1xD2x…",
                         remedy="e.g. --sweep x=1x3x224x224;2x3x224x224") from None
    if not shape or any(d < 1 for d in shape):
        raise UsageError(f"{flag}: {text!r} needs dimensions of at least 1")
    return shape


def sweep_points(items: Sequence[str]) -> list[Point]:
    """Rule 1.

    Raises:
        UsageError: an item that is not ``NAME=DIMS;DIMS…``, an input named twice, or lists of
            different lengths.
    """
    per_input: dict[str, list[tuple[int, ...]]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or not name or not rest.strip():
            raise UsageError(f"--sweep {item!r} is not NAME=DIMS;DIMS…",
                             remedy="e.g. --sweep x=1x8;2x8;4x8")
        if name in per_input:
            raise UsageError(f"--sweep names {name} twice",
                             remedy="list all its shapes in one --sweep, ';'-separated")
        per_input[name] = [_dims(part, f"--sweep {name}") for part in rest.split(";") if part.strip()]
    lengths = {len(v) for v in per_input.values()}
    if len(lengths) > 1:
        raise UsageError("every --sweep must list the same number of shapes (the i-th of each run together): "
                         + ", ".join(f"{k} has {len(v)}" for k, v in per_input.items()))
    count = lengths.pop() if lengths else 0
    return [Point(label=" ".join(f"{k}={'x'.join(map(str, v[i]))}" for k, v in per_input.items()),
                  shapes={k: v[i] for k, v in per_input.items()}) for i in range(count)]


def check_points(points: Sequence[Point], inputs: Sequence[tuple[str, tuple[int | str, ...]]]) -> None:
    """Every ``--sweep`` point against the artifact's declared ``(name, shape)`` inputs, before
    any of them runs: a shape for an input the graph lacks, or one whose rank or fixed
    dimensions differ, would otherwise stop the sweep at that point, after the points before it
    had run.

    Raises:
        UsageError: naming ``--sweep``, the input and the declared shape.
    """
    declared = dict(inputs)
    for point in points:
        for name, shape in point.shapes.items():
            if name not in declared:
                raise UsageError(f"--sweep names {name!r}, which is not an input",
                                 remedy=f"inputs: {', '.join(sorted(declared))}")
            want = declared[name]
            if len(shape) != len(want) or any(isinstance(d, int) and d != s
                                               for d, s in zip(want, shape, strict=False)):
                raise UsageError(
                    f"--sweep {name}={'x'.join(map(str, shape))} contradicts the declared "
                    f"{list(want)}", remedy="keep the fixed dimensions; sweep the free ones")


def parse_batches(text: str) -> list[int]:
    """``1,2,4,8`` → [1, 2, 4, 8].

    Raises:
        UsageError: an item that is not a whole number ≥ 1, or one named twice.
    """
    out: list[int] = []
    for item in (p.strip() for p in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise UsageError(f"--batch {text!r}: {item!r} is not a whole number >= 1",
                             remedy="e.g. --batch 1,2,4,8")
        if int(item) in out:
            raise UsageError(f"--batch {text!r} names {item} twice")
        out.append(int(item))
    return out


def batch_points(batches: Sequence[int], inputs: Sequence[tuple[str, tuple[int | str, ...]]]) -> list[Point]:
    """Rule 2 over the artifact's declared ``(name, shape)`` inputs.

    Raises:
        UsageError: no input's first dimension is free, or an unnamed one whose other dimensions
            are not fixed either.
    """
    named: list[str] = []
    unnamed: list[tuple[str, tuple[int, ...]]] = []
    for name, shape in inputs:
        if not shape or isinstance(shape[0], int):
            continue
        if shape[0] != "?":
            named.append(str(shape[0]))
        elif all(isinstance(d, int) for d in shape[1:]):
            unnamed.append((name, tuple(int(d) for d in shape[1:])))
        else:
            raise UsageError(f"--batch: input {name}'s dimensions are unnamed and not fixed {list(shape)}",
                             remedy=f"sweep its whole shape: --sweep {name}=DIMS;DIMS…")
    if not named and not unnamed:
        raise UsageError("--batch: no input of this graph has a free first dimension "
                         f"({', '.join(f'{n} {list(s)}' for n, s in inputs)})",
                         remedy="sweep whole shapes with --sweep NAME=DIMS;DIMS…")
    return [Point(label=f"batch {b}", dims={n: b for n in named},
                  shapes={n: (b, *rest) for n, rest in unnamed}, batch=b) for b in batches]


def _ms(timings: Mapping[str, Any], block: str) -> str:
    value = (timings.get(block) or {}).get("p50_ms")
    return f"{value:.3f} ms" if isinstance(value, int | float) else "-"


def _throughput(timings: Mapping[str, Any], batch: int | None) -> str:
    """Measured requests/s at a depth (``--throughput``), else one in flight: 1 / p50."""
    tp = timings.get("throughput")
    if isinstance(tp, Mapping) and isinstance(tp.get("requests_per_s"), int | float):
        rps, where = float(tp["requests_per_s"]), f"depth {tp.get('depth')}"
    else:
        p50 = (timings.get("round_trip") or {}).get("p50_ms")
        if not isinstance(p50, int | float) or p50 <= 0:
            return "-"
        rps, where = 1e3 / p50, "1 in flight"
    text = f"{rps:.1f} req/s"
    if batch:
        text += f" = {rps * batch:.1f} items/s"
    return f"{text} ({where})"


def sweep_rows(points: Sequence[Point], docs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The sweep table (``SWEEP_COLUMNS``): one row per point and its record."""
    rows = []
    for point, doc in zip(points, docs, strict=True):
        chosen = (doc.get("plan") or {}).get("chosen") or {}
        proof, parity = doc.get("proof") or {}, doc.get("parity") or {}
        timings = doc.get("timings") or {}
        fraction = proof.get("fraction")
        refusals = doc["outcome"].get("refusals") or []
        rows.append([
            point.label, doc["outcome"]["status"] + (f" ({refusals[-1].get('code')})" if refusals and
                                                      doc["outcome"]["status"] != "placed" else ""),
            f"{chosen.get('device')} via {chosen.get('route')}" if chosen else "-",
            str(proof.get("verdict", "-")) + (f" {fraction:.0%}" if isinstance(fraction, float) else ""),
            str(parity.get("verdict", "-")), _ms(timings, "round_trip"), _ms(timings, "compute"),
            _throughput(timings, point.batch)])
    return rows
