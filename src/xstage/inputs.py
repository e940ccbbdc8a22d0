"""A stage's inputs: read from an ``.npz`` (no pickle), or made from its declared signature.

Synthesized inputs use a fixed seed so two runs (and the reference arm) see the same data:
floats are standard normal, integers lie in [0, 8) (safe as indices and lengths in most
graphs), bools are random. A dimension still symbolic after ``--shape``/``--dim`` is an error
naming the flag — never a guess.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.artifact import IOSpec

__all__ = ["SEED", "load_npz", "parse_dims", "parse_shapes", "resolve_feeds", "synthesize"]

SEED = 20260915


def parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=1x3x640x640`` → {NAME: (1, 3, 640, 640)} (split on the last ``=``)."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
            if any(d < 0 for d in shape):
                raise ValueError
        except ValueError:
            raise errors.UsageError(
                f"--shape {item!r} is not NAME=D1xD2x...", remedy="e.g. --shape images=1x3x640x640"
            ) from None
        out[name] = shape
    return out


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """``NAME=N`` → {NAME: N} for symbolic dimension names."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name or not value.isdigit():
            raise errors.UsageError(f"--dim {item!r} is not NAME=N", remedy="e.g. --dim batch=1")
        out[name] = int(value)
    return out


def load_npz(path: str | Path, declared: Sequence[IOSpec], *,
             flag: str = "--inputs") -> dict[str, np.ndarray]:
    """Inputs from an ``.npz``; names must be exactly the stage's (checked later for dtypes).

    ``flag`` is the command's flag that named the file (``--inputs``; quantize's
    ``--calibration``), so the message blames a flag the command has.

    Raises:
        UsageError: the file is missing or not a pickle-free npz, or names do not match.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise errors.UsageError(
            f"{flag} {path}: not a readable .npz without pickled objects ({exc})",
            remedy="save inputs with np.savez(path, name=array, ...) and plain numeric arrays",
        ) from exc
    names = [d.name for d in declared]
    if set(arrays) != set(names):
        raise errors.InputError(
            f"{flag} {path} holds {sorted(arrays)}, the stage takes {sorted(names)}",
            remedy="name each array after the graph input it feeds",
        )
    return {n: arrays[n] for n in names}


def synthesize(
    declared: Sequence[IOSpec],
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = SEED,
    data_flag: str = "--inputs FILE.npz",
) -> dict[str, np.ndarray]:
    """Deterministic inputs for the declared signature.

    ``data_flag`` is how the command takes real data instead (``--inputs FILE.npz``; quantize's
    ``--calibration DIR``): the remedies name it.

    Raises:
        UsageError: a dimension is still unknown, a ``--shape`` names no input or contradicts
            a fixed dimension, or an input's dtype cannot be synthesized.
    """
    shapes = dict(shapes or {})
    dims = dict(dims or {})
    known = {d.name for d in declared}
    for name in shapes:
        if name not in known:
            raise errors.UsageError(f"--shape names {name!r}, which is not an input",
                                    remedy=f"inputs: {', '.join(sorted(known))}")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in declared:
        if spec.name in shapes:
            shape = shapes[spec.name]
            fixed_ok = len(shape) == len(spec.shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(spec.shape, shape, strict=True))
            if not fixed_ok:
                raise errors.UsageError(
                    f"--shape {spec.name}={'x'.join(map(str, shape))} contradicts the declared "
                    f"{tuple(spec.shape)}", remedy="fixed dimensions must keep their values")
        else:
            resolved = []
            for d in spec.shape:
                if isinstance(d, int):
                    resolved.append(d)
                elif d in dims:
                    resolved.append(dims[d])
                else:
                    hint = f"--dim {d}=N" if d != "?" else f"--shape {spec.name}=D1x..."
                    raise errors.UsageError(
                        f"input {spec.name!r} has an unknown dimension {d!r} "
                        f"(declared {tuple(spec.shape)})",
                        remedy=f"fix it with {hint}, or pass {data_flag}")
            shape = tuple(resolved)
        _check_size(spec, shape, data_flag)
        out[spec.name] = _random(rng, spec, shape, data_flag)
    return out


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def _check_size(spec: IOSpec, shape: tuple[int, ...], data_flag: str) -> None:
    """Refuse, before allocating, an input larger than half this machine's memory.

    Synthesizing needs the array (and a float64 draw of one block), so such an input would
    end in a raw ``MemoryError`` (or the OOM killer) before any budget is checked.
    """
    count = 1
    for d in shape:
        count *= int(d)
    need = count * 8  # up to 8 bytes an element (the limit as it was)
    memory = _memory_bytes()
    limit = memory // 2 if memory else 1 << 40
    if need > limit:
        raise errors.UsageError(
            f"input {spec.name!r} of shape {tuple(shape)} would take {need:,} bytes to "
            f"synthesize, more than half this machine's memory ({limit * 2:,} bytes)",
            remedy=f"give smaller sizes with --shape/--dim, or pass {data_flag}")


#: Values drawn at once when synthesizing: a large input is filled block by block, so the
#: float64 draw never holds more than one block beside the array (the values are the same as
#: one draw of the whole count: the generator's stream is consumed in the same order).
_DRAW_BLOCK = 1 << 20


def _filled(shape: tuple[int, ...], dtype: Any, draw: Callable[[int], np.ndarray]) -> np.ndarray:
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for at in range(0, flat.size, _DRAW_BLOCK):
        flat[at:at + _DRAW_BLOCK] = draw(min(_DRAW_BLOCK, flat.size - at))
    return out


def _random(rng: np.random.Generator, spec: IOSpec, shape: tuple[int, ...], data_flag: str) -> np.ndarray:
    if spec.dtype in ("float32", "float64", "float16"):
        return _filled(shape, spec.dtype, rng.standard_normal)
    if spec.dtype == "bfloat16":
        import ml_dtypes

        return _filled(shape, ml_dtypes.bfloat16, rng.standard_normal)
    if spec.dtype == "bool":
        return _filled(shape, bool, lambda n: rng.integers(0, 2, size=n))
    if spec.dtype.startswith(("int", "uint")):
        return _filled(shape, spec.dtype, lambda n: rng.integers(0, 8, size=n))
    raise errors.UsageError(
        f"input {spec.name!r} has dtype {spec.dtype}, which cannot be synthesized",
        remedy=f"pass {data_flag}")


def resolve_feeds(declared: Sequence[IOSpec],
                  inputs: Mapping[str, Any] | str | os.PathLike[str] | None = None, *,
                  shapes: Mapping[str, tuple[int, ...]] | None = None,
                  dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """The inputs a caller gave: arrays as they are, an ``.npz`` loaded, or ``None``
    synthesized at ``shapes``/``dims`` (the same rules everywhere inputs are taken)."""
    if inputs is None:
        return synthesize(declared, shapes=shapes, dims=dims)
    if isinstance(inputs, str | os.PathLike):
        return load_npz(inputs, declared)
    if not isinstance(inputs, Mapping):
        raise errors.InputError(
            f"inputs must be a mapping of input name to array, an .npz path or None, not "
            f"{type(inputs).__name__}", remedy="inputs={name: array, ...} naming "
            + ", ".join(d.name for d in declared))
    return {k: np.asarray(v) for k, v in inputs.items()}
