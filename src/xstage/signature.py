"""A stage's declared signature, and the check every call's inputs must pass.

One check for the library's first look at the inputs (before any worker starts) and for every
call a worker client makes: names exactly, dtypes exactly (never a silent cast), fixed
dimensions exactly, symbolic ones any size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from xstage import errors
from xstage_remote import wire

__all__ = ["check_inputs", "wire_order"]


def _field(decl: Any, key: str) -> Any:
    return decl[key] if isinstance(decl, Mapping) else getattr(decl, key)


def wire_order(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``inputs`` with every big-endian (or non-native) array converted to little-endian.

    The wire is little-endian (docs/wire.md), and both arms of the numeric gate must compute
    on the same values: the conversion happens once, here, at the boundary. Arrays already in
    order pass through uncopied.
    """
    out = {}
    for name, arr in inputs.items():
        order = arr.dtype.byteorder
        if order == ">" or (order == "=" and not np.little_endian):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        out[name] = arr
    return out


def not_a_mapping(inputs: object, names: Iterable[str] = ()) -> errors.InputError:
    """The ``InputError`` for inputs that are not a mapping of input name to array."""
    named = ", ".join(sorted(names))
    return errors.InputError(
        f"inputs must be a mapping of input name to array, not {type(inputs).__name__}",
        remedy="call the stage with {name: array, ...}" + (f" naming {named}" if named else ""))


def check_inputs(inputs: Mapping[str, np.ndarray], declared: Sequence[Any]) -> dict[str, np.ndarray]:
    """Raise ``InputError`` naming what was expected when ``inputs`` do not fit ``declared``.

    Returns the inputs in wire byte order (``wire_order``): a big-endian array of a declared
    dtype converts, any dtype off the wire's whitelist is refused by name.

    ``declared`` holds objects or mappings with ``name``, ``dtype`` (a wire tag) and ``shape``
    (ints for fixed dimensions, strings for symbolic ones).
    """
    by_name = {_field(d, "name"): d for d in declared}
    if not isinstance(inputs, Mapping):  # st([x]), st(None): say what a call takes
        raise not_a_mapping(inputs, by_name)
    if set(inputs) != set(by_name):
        missing = sorted(set(by_name) - set(inputs))
        extra = sorted(set(inputs) - set(by_name))
        raise errors.InputError(
            "inputs do not match the stage: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected {extra}" if extra else ""),
            remedy=f"the stage takes {sorted(by_name)}",
        )
    for name, decl in by_name.items():
        arr = inputs[name]
        try:
            tag = wire.tag_of_dtype(arr.dtype)
        except wire.ProtocolError:
            tag = str(arr.dtype)
        want = _field(decl, "dtype")
        if tag != want:
            raise errors.InputError(
                f"input {name!r} is {tag}, the stage expects {want}",
                remedy=f"convert it yourself (arr.astype(np.{want})): xstage never casts silently",
            )
        shape = tuple(_field(decl, "shape"))
        ok = len(shape) == arr.ndim and all(
            not isinstance(d, int) or d == n for d, n in zip(shape, arr.shape, strict=True))
        if not ok:
            raise errors.InputError(
                f"input {name!r} has shape {tuple(arr.shape)}, the stage expects {shape}",
                remedy="symbolic dimensions (names) accept any size; fixed ones must match",
            )
    return wire_order(inputs)
