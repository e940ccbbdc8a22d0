"""What a call gives back: its outputs by name, and the copy that makes one owned.

Shared by the transports (``client/transport.py``, ``client/region.py``), the pipeline and the
call API, which is why it is a module of its own: none of them imports another for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xstage import errors

__all__ = ["USE_DEADLINE", "Outputs", "fill"]


class Outputs(dict):  # type: ignore[type-arg]
    """A call's outputs by name, in graph order.

    ``state_reset`` is true when a stage with state pairs ran this call from the initial state
    (the first call of a worker generation, or the first after ``reset_state()``).
    """

    state_reset = False


class _UseDeadline:
    """The ``timeout=`` default: the client's ``Deadlines.call`` (``None`` means no limit)."""

    def __repr__(self) -> str:
        return "USE_DEADLINE"


#: ``submit(feeds, timeout=USE_DEADLINE)``: the call deadline of the stage's ``Deadlines``.
USE_DEADLINE: Any = _UseDeadline()


def fill(target: np.ndarray | None, value: np.ndarray, name: str, pool: Any = None) -> np.ndarray:
    """Copy ``value`` into ``target`` when given (checked), else into a new owned array.

    ``pool`` (a ``copies.CopyPool``), when given, splits a large copy (and a new array's first
    touch) across threads.
    """
    if target is None:
        if pool is not None:
            return pool.empty_copy(value)  # type: ignore[no-any-return]
        return np.array(value, copy=True, order="C")
    if target.dtype != value.dtype or target.shape != value.shape or not target.flags.c_contiguous:
        raise errors.InputError(
            f"out[{name!r}] is {target.dtype}{tuple(target.shape)}, the output is "
            f"{value.dtype}{tuple(value.shape)}",
            remedy="pass a C-contiguous array of the output's dtype and shape, or no out",
        )
    if pool is not None:
        pool.copyto(target, value)
    else:
        np.copyto(target, value)
    return target
