"""A candidate whose worker died while it loaded or warmed up: a refusal of that candidate, or an error.

A runtime may end its own process on a graph it claimed (OpenVINO aborts on some ``Loop``
bodies; a kernel's out-of-memory killer sends SIGKILL). That says nothing against the graph
when the reference arm runs it, so the rule (docs/external.md, "A candidate that crashes"):

1. The candidate *is* the reference arm (``ort-cpu``, ``torch-cpu``): the death is an error
   (``WorkerDied``, exit 1). Nothing else could run it.
2. Otherwise a worker of the reference arm loads the same artifact and runs the same inputs
   once, unprofiled. If it does, the candidate is refused ``execution_provider_declined_graph``
   / ``ep_compile_failed``, with the worker's last log lines (its stderr) in the evidence, and the
   candidate loop goes on. A SIGKILL is recorded as a possible out-of-memory kill.
3. If the reference arm cannot run it either (it dies, raises, or is missing here), the first
   death stands as an error (``WorkerDied``, exit 1): the graph, not the EP, is in doubt.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xstage import errors
from xstage.routes import reference_spec
from xstage.routes.launch import load_options, open_worker
from xstage.routes.status import RouteStatus

if TYPE_CHECKING:
    from xstage.planner import Candidate
    from xstage.stage.setup import Setup

__all__ = ["TAIL_LINES", "CandidateDied", "death", "reference_runs"]

#: The worker's last log lines kept in the refusal's evidence (its stderr: the runtime's abort
#: message is there).
TAIL_LINES = 20


class CandidateDied(Exception):
    """A candidate's worker died in ``phase`` (load, warm-up or evidence): carries the death."""

    def __init__(self, died: errors.WorkerDied, phase: str, log: object) -> None:
        super().__init__(died.message)
        self.died, self.phase, self.log = died, phase, log


def death(died: errors.WorkerDied) -> dict[str, Any]:
    """How the worker ended, as data: exit status or signal, and whether it may be the OOM killer."""
    status = died.exit_status
    sig = -status if isinstance(status, int) and status < 0 else None
    name = None
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = None
    return {"exit_status": status if sig is None else None, "signal": sig, "signal_name": name,
            "possible_oom_kill": sig == getattr(signal, "SIGKILL", 9),
            "log_tail": "\n".join((died.log_tail or "").splitlines()[-TAIL_LINES:])}


def _reference_route(setup: Setup) -> RouteStatus | None:
    """The reference arm's route for the artifact's runtime, as the plan's table resolved it."""
    if setup.report is None:
        return None
    runtime = setup.artifact.runtime
    try:
        return setup.report.route(reference_spec(runtime).name)
    except KeyError:
        return None


def reference_runs(cand: Candidate, setup: Setup) -> Mapping[str, Any]:
    """Rule 2: a reference-arm worker loads ``setup.artifact`` and runs ``setup.feeds`` once.

    Returns what it found (the route, and the outputs' names). Raises the candidate's rule 1
    or 3 case as ``LookupError`` naming why no check could clear the artifact.
    """
    if cand.route.spec.reference_arm:
        raise LookupError(f"{cand.route.name} is the reference arm: nothing else runs the stage")
    status = _reference_route(setup)
    if status is None or not status.resolved:
        why = getattr(status, "reason", None) or "it is not resolved here"
        raise LookupError(f"the reference arm could not be started to check the artifact: {why}")
    art = setup.artifact
    options = load_options(status, session=setup.session, fmt=art.format,
                           output_names=[o.name for o in art.outputs])
    if setup.state:
        options["state"] = [pair.option() for pair in setup.state]
    client = open_worker(status, deadlines=setup.deadlines)
    try:
        client.load(art.path, runtime=options.get("runtime", "ort"), options=options)
        outputs = client.run(setup.feeds, phase="warmup")
    except errors.WorkerError as exc:
        raise LookupError(f"the reference arm {status.name} could not run it either: "
                          f"{exc.message}") from exc
    finally:
        client.close()
    return {"route": status.name, "loaded": True, "ran": True, "outputs": sorted(outputs)}
