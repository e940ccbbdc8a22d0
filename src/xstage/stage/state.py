"""State pairs: an output a stage feeds back as an input on its next call, kept in the worker.

A manifest declares them (``xstage.manifest``: ``state: [{input, output, init}]``); this module
checks them against the artifact's signature (one fixed shape and dtype per pair), reads the
initial values (zeros, or a ``.npy`` beside the manifest, never unpickled), and says what the
ledger needs: the bytes the worker holds. The gate's calls over the state are
``xstage.stage.gate``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xstage import errors
from xstage.artifact import Artifact
from xstage.manifest import find_manifest, state_pairs

__all__ = ["StatePair", "declared_state", "initial_values", "state_bytes"]


@dataclass(frozen=True)
class StatePair:
    """``output`` of one call is ``input`` of the next; ``init`` is "zeros" or a file name."""

    input: str
    output: str
    init: str
    path: str | None  # the init file, absolute; None for zeros

    def option(self) -> dict[str, Any]:
        """The pair as the worker's ``load`` options carry it."""
        spec: dict[str, Any] = {"input": self.input, "output": self.output,
                                "init": "zeros" if self.path is None else "file"}
        if self.path is not None:
            spec["path"] = self.path
        return spec

    def to_dict(self) -> dict[str, str]:
        """The record's view of the pair."""
        return {"input": self.input, "output": self.output, "init": self.init}


def declared_state(art: Artifact) -> tuple[StatePair, ...]:
    """The artifact's state pairs, checked against its inputs and outputs.

    Raises:
        ArtifactError: a pair whose input and output differ in dtype or shape, or whose shape
            is not fixed (the worker holds one buffer per pair).
    """
    if not art.manifest.get("state"):
        return ()
    where = find_manifest(art.origin)
    ins = {spec.name: spec for spec in art.inputs}
    outs = {spec.name: spec for spec in art.outputs}
    pairs = []
    for raw in state_pairs(art.manifest, where):
        i, o = ins.get(raw["input"]), outs.get(raw["output"])
        if i is None or o is None:
            raise errors.ArtifactError(
                f"manifest {where}: state pair {raw['output']!r} -> {raw['input']!r} names no "
                f"output and input of {art.path.name}",
                remedy="fix the manifest's state, or re-export the stage")
        if i.dtype != o.dtype or list(i.shape) != list(o.shape) \
                or not all(isinstance(d, int) for d in i.shape):
            raise errors.ArtifactError(
                f"manifest {where}: state pair {o.name!r} -> {i.name!r} is {o.dtype}{list(o.shape)}"
                f" -> {i.dtype}{list(i.shape)}: a pair needs one fixed shape and dtype",
                remedy="export the state input and output with the same fixed shape and dtype")
        pairs.append(StatePair(i.name, o.name, raw["init"], raw["path"]))
    return tuple(pairs)


def initial_values(pairs: Sequence[StatePair], art: Artifact) -> dict[str, np.ndarray]:
    """Each state input's initial value (``np.load(allow_pickle=False)`` for a file).

    Raises:
        ArtifactError: an init file that cannot be read or holds another dtype or shape.
    """
    ins = {spec.name: spec for spec in art.inputs}
    out = {}
    for pair in pairs:
        spec = ins[pair.input]
        dtype, shape = np.dtype(spec.dtype), tuple(int(d) for d in spec.shape)
        if pair.path is None:
            out[pair.input] = np.zeros(shape, dtype)
            continue
        try:
            value = np.load(pair.path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise errors.ArtifactError(f"state init {pair.path} is not a readable .npy: {exc}",
                                       remedy="write it with np.save (no object arrays)") from exc
        if value.dtype != dtype or value.shape != shape:
            raise errors.ArtifactError(
                f"state init {pair.path} holds {value.dtype}{list(value.shape)}, the input "
                f"{pair.input!r} is {dtype}{list(shape)}",
                remedy="save the initial state with the input's dtype and shape")
        out[pair.input] = value
    return out


def state_bytes(pairs: Sequence[StatePair], art: Artifact) -> int:
    """What the worker holds for the state: each pair's value and its initial copy."""
    ins = {spec.name: spec for spec in art.inputs}
    total = 0
    for pair in pairs:
        spec = ins[pair.input]
        total += int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    return 2 * total
