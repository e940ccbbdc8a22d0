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


def stage_runs(client: Any, feeds: Mapping[str, np.ndarray], pairs: Sequence[StatePair],
               first: Mapping[str, np.ndarray]) -> tuple[list[Outputs], list[Outputs]]:
    """The gate's inputs computed twice on the stage's worker (``first``: its warm-up call).

    With state: :data:`GATE_CALLS` calls from the initial state, each with the state it left,
    then the same again after a reset; the worker is reset once more before it serves.
    """
    if not pairs:
        return [dict(first)], [dict(client.run(feeds))]
    runs: list[list[Outputs]] = [[{**first, **client.state_values()}], []]
    for k, run in enumerate(runs):
        while len(run) < GATE_CALLS:
            out = client.run(feeds)
            run.append({**out, **client.state_values()})
        if k == 0:
            client.reset_state()
    client.reset_state()  # the stage serves from the initial state
    return runs[0], runs[1]


def reference_runs(arm: Any, feeds: Mapping[str, np.ndarray], pairs: Sequence[StatePair],
                   init: Mapping[str, np.ndarray]) -> tuple[list[Outputs], list[Outputs]]:
    """The gate's inputs computed twice by the reference arm, in one session (or worker).

    With state: :data:`GATE_CALLS` calls from ``init``, each call's state outputs fed back as
    the next call's state inputs, as the worker carries them; every output is kept.
    """
    calls = GATE_CALLS if pairs else 1
    with arm.runner() as run:
        runs = []
        for _ in range(2):
            state = dict(init)
            seq = []
            for _ in range(calls):
                out = dict(run({**feeds, **state}))
                seq.append(out)
                state = {p.input: out[p.output] for p in pairs}
            runs.append(seq)
    return runs[0], runs[1]


def judge(setup: Any, calls: Sequence[Mapping[str, np.ndarray]],
          again: Sequence[Mapping[str, np.ndarray]]) -> tuple[parity.Parity, Outputs]:
    """The stage's calls against the reference arm's, after each arm against itself.

    Args:
        setup: the candidate loop's ``Setup`` (artifact, feeds, reference arm, tolerance, state).
        calls: the stage's gate calls (:func:`stage_runs`' first computation).
        again: the stage's second computation of the same calls.

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
    checks = {"stage": parity.self_agreement(ours, named(again)),
              "reference": parity.self_agreement(theirs, named(second))}
    return parity.nondeterministic(gate, checks, art.random_ops,
                                   named=setup.tolerance is not None), theirs
