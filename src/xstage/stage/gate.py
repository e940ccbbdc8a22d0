"""The numeric gate's inputs: each arm computes them twice, and a stage with state over three calls.

* **Determinism.** The stage's worker and the reference arm each compute the gate's inputs
  twice (the stage: its warm-up call and one more; the reference: twice in one session or one
  worker, so that a random generator is not reseeded between the two). An arm that disagrees
  with itself beyond :data:`xstage.parity.SELF_TOLERANCE` makes the gate fail with cause
  ``nondeterministic``, naming the output and the graph's random ops, unless the caller named
  a tolerance (``xstage.parity.nondeterministic``).
* **State.** A stage with state pairs (``xstage.stage.state``) runs :data:`GATE_CALLS` calls
  from the initial state on both arms, each call's state outputs compared like visible ones
  (the worker hands its state over for the gate only, the wire's ``state`` op); the names are
  ``y`` for the first call and ``y (call n)`` for the later ones.
* **Formats.** Each output is compared under the format it is judged by
  (``Artifact.output_formats``, ``xstage.graph_precision``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xstage import parity
from xstage.stage.reference import quantized_outputs
from xstage.stage.state import StatePair

__all__ = ["GATE_CALLS", "base_name", "judge", "named", "reference_runs", "stage_runs"]

#: Calls from the initial state a stage with state is gated over: an error that a state
#: carries shows from the second call on, and one that it compounds grows with every call
#: (a state pair computed in bf16 passed two calls at the default and failed from the third).
GATE_CALLS = 3

Outputs = dict[str, np.ndarray]


def base_name(name: str) -> str:
    """An output's name without the gate's `` (call n)`` suffix."""
    return name.split(" (call ")[0]


def named(calls: Sequence[Mapping[str, np.ndarray]]) -> Outputs:
    """One arm's calls as the gate names them: the first call's names, then ``name (call n)``."""
    out: Outputs = {}
    for n, call in enumerate(calls, start=1):
        out.update({(k if n == 1 else f"{k} (call {n})"): v for k, v in call.items()})
    return out


#: Bytes compared at a time when an arm's two computations are checked for identity: the
#: comparison's temporary stays this small whatever the output's size.
_CHUNK = 16 << 20


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes (NaN payloads included), compared a chunk at a time."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return all(np.array_equal(x[i:i + _CHUNK], y[i:i + _CHUNK]) for i in range(0, x.size, _CHUNK))


def _agreement(first: Sequence[Mapping[str, np.ndarray]], again: Any) -> parity.Parity | None:
    """An arm's second computation, checked call by call as it comes back.

    ``again`` yields each call's outputs (views valid until the next call), so no second copy
    is ever held. None when every call came back bit for bit the same (the usual case: nothing
    to weigh, the gate's :func:`judge` names it the same verdict as comparing the first with
    itself); else :func:`xstage.parity.self_agreement`'s verdict on the first call that differs
    (named as :func:`named` names it), failed or within :data:`xstage.parity.SELF_TOLERANCE`.
    """
    for n, out in enumerate(again, start=1):
        if all(_identical(v, out[k]) for k, v in first[n - 1].items()):
            continue
        tag = "" if n == 1 else f" (call {n})"
        check = parity.self_agreement({k + tag: v for k, v in first[n - 1].items()},
                                      {k + tag: out[k] for k in first[n - 1]})
        if not check.passed:
            return check
    return None


def _owned(out: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The state outputs fed to the next call, copied out of a view the next call overwrites."""
    return {k: np.array(out[k]) for k in names}


def stage_runs(client: Any, feeds: Mapping[str, np.ndarray], pairs: Sequence[StatePair],
               first: Mapping[str, np.ndarray]) -> tuple[list[Outputs], parity.Parity | None]:
    """The gate's inputs computed twice on the stage's worker (``first``: its warm-up call).

    The first computation is kept (the gate compares it); the second is checked against it as
    each call's outputs come back, read from the region in place. With state:
    :data:`GATE_CALLS` calls from the initial state, each with the state it left, then the same
    again after a reset; the worker is reset once more before it serves.
    """
    if not pairs:
        calls = [dict(first)]
        return calls, _agreement(calls, iter([client.run(feeds, views=True)]))
    calls = [{**first, **client.state_values()}]
    while len(calls) < GATE_CALLS:
        calls.append({**client.run(feeds), **client.state_values()})
    client.reset_state()

    def again() -> Any:  # copies: the state op may reuse the region the views would read
        for _ in range(GATE_CALLS):
            yield {**client.run(feeds), **client.state_values()}

    check = _agreement(calls, again())
    client.reset_state()  # the stage serves from the initial state
    return calls, check


def reference_runs(arm: Any, feeds: Mapping[str, np.ndarray], pairs: Sequence[StatePair],
                   init: Mapping[str, np.ndarray]) -> tuple[list[Outputs], parity.Parity | None]:
    """The gate's inputs computed twice by the reference arm, in one session (or worker).

    The first computation is kept; the second is checked against it call by call, as it comes
    back. With state: :data:`GATE_CALLS` calls from ``init``, each call's state outputs fed back
    as the next call's state inputs, as the worker carries them.
    """
    calls = GATE_CALLS if pairs else 1
    fed = [p.output for p in pairs]
    with arm.runner() as run:
        kept: list[Outputs] = []
        state = dict(init)
        for _ in range(calls):
            out = dict(run({**feeds, **state}))
            kept.append(out)
            state = {p.input: out[p.output] for p in pairs}

        def again() -> Any:
            state = dict(init)
            for _ in range(calls):
                out = run({**feeds, **state}, views=True)
                yield out
                state = {p.input: v for p, v in zip(pairs, _owned(out, fed).values(), strict=True)}

        return kept, _agreement(kept, again())


def judge(setup: Any, calls: Sequence[Mapping[str, np.ndarray]],
          again: parity.Parity | None) -> tuple[parity.Parity, Outputs]:
    """The stage's calls against the reference arm's, after each arm against itself.

    Args:
        setup: the candidate loop's ``Setup`` (artifact, feeds, reference arm, tolerance, state).
        calls: the stage's gate calls (:func:`stage_runs`' first computation).
        again: the stage's second computation of the same calls, checked against its first as
            it came back (None: bit for bit the same).

    Returns:
        The verdict, and the reference's outputs as the gate named them.

    Raises:
        ReferenceOverBudget: the reference arm's worker, started here, does not fit the pool.
    """
    art = setup.artifact
    first, second = setup.reference_calls or reference_runs(setup.reference, setup.feeds,
                                                            setup.state, setup.state_init)
    ours, theirs = named(calls), named(first)
    declared = {o.name: o.shape for o in art.outputs}
    quant = quantized_outputs(art)
    gate = parity.compare(
        ours, theirs, fmt=art.format, reference_kind=setup.reference.kind,
        tolerance=setup.tolerance,
        declared={k: declared[base_name(k)] for k in theirs if base_name(k) in declared},
        quantized={k: quant[base_name(k)] for k in theirs if base_name(k) in quant},
        formats=art.output_formats)
    checks = {arm: check or parity.self_agreement(outputs, outputs)
              for arm, check, outputs in (("stage", again, ours), ("reference", second, theirs))}
    return parity.nondeterministic(gate, checks, art.random_ops,
                                   named=setup.tolerance is not None), theirs
