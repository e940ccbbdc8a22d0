"""``StageRequest``: what the caller asked ``open_stage`` for, one frozen value built once.

``open_stage``'s keyword arguments and the CLI's ``xstage external`` flags both become this value
through :meth:`StageRequest.build`, the one validator (every check that needs only the
arguments, before anything starts). The value is carried unchanged through admission
(``xstage.stage.admit.Setup.request``) and to a cluster's node (:meth:`StageRequest.node_arguments`);
the record's ``request`` block is its serialization (:meth:`StageRequest.to_record`).

What resolving the request found is a separate value, :class:`Resolved` (the inputs' dtypes and
shapes from :func:`describe_feeds`, the reference arm that ran), made by pure functions, never
written into the request. The timing plan (``runs``, ``warmup``) is added by whoever writes the
record (``Stage.measure``, the CLI). The block's keys are those records have always had, so
older readers keep reading it.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors
from xstage.inputs import SEED
from xstage.parity import CRITERIA

if TYPE_CHECKING:
    from xstage.client import Deadlines
    from xstage.device_table import DeviceReport
    from xstage.stage.ledger import Ledger

__all__ = ["CLUSTERS", "MAX_DEPTH", "RESTART_POLICIES", "InputsAsked", "Resolved", "StageRequest",
           "TensorSeen", "check_criteria", "check_resources", "check_session_config",
           "describe_feeds"]

#: The most slot sets a region holds (``xstage_remote.shm.MAX_SETS``).
MAX_DEPTH = 64
#: What a stage does when its worker dies: nothing, or restart it (the next generation).
RESTART_POLICIES = ("never", "on_death")
#: The clusters ``open_stage(cluster=...)`` knows.
CLUSTERS = ("ray",)
#: ``open_stage`` arguments that are objects of this process and cannot stand for a node.
_LOCAL_ONLY = {"report": "the node reads its own device table",
               "ledger": "each node charges its own ledger (docs/cluster.md)"}


@dataclass(frozen=True)
class InputsAsked:
    """Where the inputs come from, as asked.

    Attributes:
        source: ``synthesized`` (from the signature, seeded), ``npz`` (a file) or ``caller``
            (arrays passed to ``open_stage``).
        path: the ``.npz`` file, for ``npz``.
        seed: the synthesizer's seed, for ``synthesized``.
    """

    source: str
    path: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class TensorSeen:
    """One resolved input as the record names it: its dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Resolved:
    """What resolving a request found, before any candidate: the record's half of the inputs.

    Attributes:
        tensors: the checked inputs' dtypes and shapes (:func:`describe_feeds`); empty until
            the inputs are resolved.
        reference_arm: where the gate's reference runs (``worker``, ``in_process``), once built.
    """

    tensors: tuple[TensorSeen, ...] = ()
    reference_arm: str | None = None


def describe_feeds(feeds: Mapping[str, np.ndarray]) -> tuple[TensorSeen, ...]:
    """The resolved inputs' dtypes and shapes, in their order (a pure function of ``feeds``)."""
    return tuple(TensorSeen(name, str(a.dtype), tuple(int(d) for d in a.shape))
                 for name, a in feeds.items())


@dataclass(frozen=True)
class StageRequest:
    """What one ``open_stage`` (or ``xstage external``) asked for; ``open_stage``'s arguments.

    Mappings are kept as tuples of pairs, in the caller's order; the properties give them back
    as fresh dicts. ``offload`` is as planned: true also when no selector was given. Equality
    compares what the record and a node see: the caller's arrays and the objects of this
    process (``report``, ``ledger``, ``on_event``) are carried but not compared.
    """

    artifact: str
    inputs: InputsAsked
    device: str | None = None
    prefer: tuple[str, ...] | None = None
    route: str | None = None
    offload: bool = False
    min_placement: float = 0.5
    #: relative L2: the bare number, or the criteria's ``rel_l2`` where named
    tolerance: float | None = None
    #: the criteria named (checked), or None for a bare number or the defaults
    criteria: tuple[tuple[str, float], ...] | None = None
    reference: str | os.PathLike[str] = "auto"  # as given: "auto", or a path
    reference_arm: str = "worker"
    shapes: tuple[tuple[str, Any], ...] = ()
    dims: tuple[tuple[str, Any], ...] = ()
    fmt: str | None = None
    component: str | None = None
    ep_options: tuple[tuple[str, str], ...] = ()
    threads: int | None = None
    graph_opt_level: str | None = None
    #: onnxruntime session config entries for the worker's session (``--session-config``)
    session_config: tuple[tuple[str, str], ...] = ()
    deadlines: Deadlines | None = None
    depth: int = 2
    concurrency: int = 1
    restart: str = "never"
    max_restarts: int = 3
    restart_window: float = 60.0
    record_on_close: bool = True
    cluster: str | None = None
    resources: tuple[tuple[str, float], ...] = ()
    placement_timeout: float = 60.0
    #: the caller's arrays (``inputs.source == "caller"``), a read-only view of a copy
    arrays: Mapping[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    report: DeviceReport | None = field(default=None, compare=False, repr=False)
    ledger: Ledger | None = field(default=None, compare=False, repr=False)
    on_event: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(
        cls, artifact: str | os.PathLike[str], *, device: str | None = None,
        prefer: Sequence[str] | None = None, route: str | None = None, offload: bool = False,
        min_placement: float = 0.5, tolerance: float | Mapping[str, float] | None = None,
        reference: str | os.PathLike[str] = "auto", reference_arm: str = "worker",
        inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
        shapes: Mapping[str, tuple[int, ...]] | None = None, dims: Mapping[str, int] | None = None,
        fmt: str | None = None, component: str | None = None,
        ep_options: Mapping[str, str] | None = None, threads: int | None = None,
        graph_opt_level: str | None = None, session_config: Mapping[str, str] | None = None,
        deadlines: Deadlines | None = None,
        report: DeviceReport | None = None, ledger: Ledger | None = None,
        on_event: Callable[[str], None] | None = None, depth: int = 2, concurrency: int = 1,
        restart: str = "never",
        max_restarts: int = 3, restart_window: float = 60.0, record_on_close: bool = True,
        cluster: str | None = None, resources: Mapping[str, float] | None = None,
        placement_timeout: float = 60.0,
    ) -> StageRequest:
        """The request for ``open_stage``'s arguments (its docstring says what each means), checked.

        Raises:
            UsageError: a tolerance mapping with an unknown criterion or a bad value;
                ``min_placement``, ``threads``, ``depth``, ``concurrency`` or the restart policy
                out of range (``_check_numbers``, ``_check_restart``); a session config entry
                xstage cannot pass (``check_session_config``); with ``cluster``: an
                unknown cluster, bad resources or ``placement_timeout``, or an argument that
                cannot cross to a node.
        """
        from_file = isinstance(inputs, str | os.PathLike)
        criteria = check_criteria(tolerance) if isinstance(tolerance, Mapping) else None
        _check_numbers(min_placement, threads, depth, concurrency, here=cluster is None)
        _check_restart(restart, max_restarts, restart_window)
        config = check_session_config(session_config)
        wanted = _check_cluster(cluster, resources, placement_timeout,
                                {"report": report, "ledger": ledger})
        return cls(
            artifact=os.fspath(artifact),
            inputs=InputsAsked(
                source="synthesized" if inputs is None else ("npz" if from_file else "caller"),
                path=os.fspath(inputs) if from_file else None,  # type: ignore[arg-type]
                seed=SEED if inputs is None else None),
            arrays=(MappingProxyType(dict(inputs)) if isinstance(inputs, Mapping)
                    else None if inputs is None or from_file else inputs),  # type: ignore[arg-type]
            # No selector is an offload (the reference arm last): the request says what was planned.
            device=device, prefer=tuple(prefer) if prefer else None, route=route,
            offload=bool(offload) or (device is None and not prefer and route is None),
            min_placement=min_placement,
            tolerance=criteria.get("rel_l2") if criteria is not None else tolerance,  # type: ignore[arg-type]
            criteria=tuple(criteria.items()) if criteria is not None else None,
            reference=reference, reference_arm=reference_arm,
            shapes=tuple((k, tuple(v) if isinstance(v, list | tuple) else v)
                         for k, v in (shapes or {}).items()),
            dims=tuple((dims or {}).items()), fmt=fmt, component=component,
            ep_options=tuple((ep_options or {}).items()), threads=threads,
            graph_opt_level=graph_opt_level, session_config=tuple(config.items()),
            deadlines=deadlines, depth=depth,
            concurrency=concurrency, restart=restart, max_restarts=max_restarts,
            restart_window=restart_window, record_on_close=record_on_close, cluster=cluster,
            resources=tuple(wanted.items()), placement_timeout=placement_timeout,
            report=report, ledger=ledger, on_event=on_event)

    @property
    def gate_tolerance(self) -> float | dict[str, float] | None:
        """The numeric gate's override: the criteria named, else the bare number, else None."""
        return dict(self.criteria) if self.criteria is not None else self.tolerance

    @property
    def input_value(self) -> Mapping[str, np.ndarray] | str | None:
        """The inputs as ``open_stage`` takes them: the arrays, the ``.npz`` path, or None."""
        return self.arrays if self.inputs.source == "caller" else self.inputs.path

    def ep_option_map(self) -> dict[str, str]:
        """The user's ``--ep-option`` values, a fresh dict."""
        return dict(self.ep_options)

    def session_options(self) -> dict[str, Any]:
        """The onnxruntime session options of the worker's session.

        Threads and the optimization level both arms use (the worker's and the reference's);
        ``config``, the session config entries, the worker's session only (they tune how it
        runs, and the gate compares it with a reference built as always).
        """
        session: dict[str, Any] = {}
        if self.threads:
            session["intra_op_num_threads"] = self.threads
        if self.graph_opt_level:
            session["graph_optimization_level"] = self.graph_opt_level
        if self.session_config:
            session["config"] = dict(self.session_config)
        return session

    def reference_session_options(self) -> dict[str, Any]:
        """The session options of the gate's reference arm.

        The threads and the optimization level, never the session config entries (they tune
        the stage's session only).
        """
        return {k: v for k, v in self.session_options().items() if k != "config"}

    def node_arguments(self) -> dict[str, Any]:
        """``open_stage``'s keyword arguments for a cluster node's own ``open_stage``.

        The placement's own (``artifact``, ``cluster``, ``resources``, ``placement_timeout``)
        and the objects of this process (``report``, ``ledger``, ``on_event``,
        ``record_on_close``) are left out: the node brings its own. ``inputs`` is what was
        given (an ``.npz`` is read by ``xstage.cluster.place``, not here).
        """
        return {"device": self.device, "prefer": list(self.prefer) if self.prefer else None,
                "route": self.route, "offload": self.offload,
                "min_placement": self.min_placement, "tolerance": self.gate_tolerance,
                "reference": self.reference, "reference_arm": self.reference_arm,
                "inputs": (dict(self.arrays) if isinstance(self.arrays, Mapping)  # picklable
                           else self.input_value),
                "shapes": dict(self.shapes) or None,
                "dims": dict(self.dims) or None, "fmt": self.fmt, "component": self.component,
                "ep_options": self.ep_option_map(), "threads": self.threads,
                "graph_opt_level": self.graph_opt_level,
                "session_config": dict(self.session_config) or None, "deadlines": self.deadlines,
                "depth": self.depth, "concurrency": self.concurrency, "restart": self.restart,
                "max_restarts": self.max_restarts, "restart_window": self.restart_window}

    def to_record(self, resolved: Resolved | None = None, *, runs: int = 0,
                  warmup: int = 0) -> dict[str, Any]:
        """The record's ``request`` block: this request, what resolving it found, the timing plan.

        ``tolerance_criteria`` only where criteria were named, ``reference_arm`` once the arm
        was built, ``cluster`` and ``resources`` for a cluster stage (the schema's optional keys).
        """
        resolved = resolved if resolved is not None else Resolved()
        block: dict[str, Any] = {
            **({"tolerance_criteria": dict(self.criteria)} if self.criteria is not None else {}),
            "device": self.device, "prefer": list(self.prefer) if self.prefer else None,
            "route": self.route, "offload": self.offload, "min_placement": self.min_placement,
            "tolerance": self.tolerance, "ep_options": self.ep_option_map(),
            "threads": self.threads, "graph_opt_level": self.graph_opt_level,
            "runs": runs, "warmup": warmup,
            "inputs": {"source": self.inputs.source, "path": self.inputs.path,
                       "seed": self.inputs.seed, "tensors": {
                           t.name: {"dtype": t.dtype, "shape": list(t.shape)}
                           for t in resolved.tensors}}}
        if self.session_config:
            block["session_config"] = dict(self.session_config)
        if resolved.reference_arm is not None:
            block["reference_arm"] = resolved.reference_arm
        if self.cluster is not None:
            block.update(cluster=self.cluster, resources=dict(self.resources))
        return block


def check_criteria(tolerance: Mapping[str, float]) -> dict[str, float]:
    """A tolerance mapping checked before anything starts: known criteria, sane values.

    Raises:
        UsageError: an unknown criterion (the message lists the known ones), a value that is
            not a finite number, a negative one, a cosine outside [-1, 1] or elem above 1.
    """
    out: dict[str, float] = {}
    for key, value in tolerance.items():
        if key not in CRITERIA:
            raise errors.UsageError(f"--tolerance: unknown criterion {key!r}",
                                    remedy=f"name one of {', '.join(CRITERIA)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise errors.UsageError(f"--tolerance {key}={value!r} is not a finite number")
        low, high = (-1.0, 1.0) if key == "cosine" else (0.0, 1.0 if key == "elem" else math.inf)
        if not low <= value <= high:
            raise errors.UsageError(f"--tolerance {key}={value!r} is outside [{low:g}, {high:g}]")
        out[key] = float(value)
    return out


def check_resources(resources: Mapping[str, float] | None) -> dict[str, float]:
    """Resource names to amounts > 0.

    Raises:
        UsageError: a name that is not a string, or an amount that is not a number > 0.
    """
    out: dict[str, float] = {}
    for name, amount in (resources or {}).items():
        if not isinstance(name, str) or not name or isinstance(amount, bool) \
                or not isinstance(amount, int | float) or not 0 < amount < float("inf"):
            raise errors.UsageError(f"resources: {name!r}={amount!r} is not a name and an "
                                    "amount > 0", remedy='e.g. resources={"npu": 1}')
        out[name] = float(amount)
    return out


def _check_cluster(cluster: str | None, resources: Mapping[str, float] | None,
                   placement_timeout: float, local: Mapping[str, object]) -> dict[str, float]:
    """The placement's own arguments, checked before anything connects; the resources wanted.

    Raises:
        UsageError: an unknown cluster, bad resources or ``placement_timeout``, or an object of
            this process (``report``, ``ledger``) that cannot stand for a node.
    """
    if cluster is None:
        return check_resources(resources)
    if cluster not in CLUSTERS:
        raise errors.UsageError(f"cluster={cluster!r} is not one of {', '.join(CLUSTERS)}")
    wanted = check_resources(resources)
    if isinstance(placement_timeout, bool) or not isinstance(placement_timeout, int | float) \
            or not 0 < placement_timeout < float("inf"):
        raise errors.UsageError(f"placement_timeout={placement_timeout!r} is not a number of "
                                "seconds > 0")
    for key, why in _LOCAL_ONLY.items():
        if local.get(key) is not None:
            raise errors.UsageError(f"open_stage({key}=...) does not cross to a node: {why}",
                                    remedy=f"leave {key} out with cluster={cluster!r}")
    return wanted


def _check_numbers(min_placement: float, threads: int | None, depth: int = 2,
                   concurrency: int = 1, *, here: bool = True) -> None:
    """The numeric arguments checked before anything runs.

    Raises:
        UsageError: ``min_placement`` outside [0, 1]; ``threads`` below 0 (0: the runtime's
            default) or, for a stage opened ``here`` (not on a cluster's node, which checks its
            own), above this machine's CPU count (more threads than CPUs only slows a stage:
            2048 took 76 s); ``depth`` not a whole number in 1..64; ``concurrency`` not a whole
            number in 1..``depth``.
    """
    if not 0.0 <= min_placement <= 1.0:
        raise errors.UsageError(f"--min-placement {min_placement} is outside [0, 1]")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise errors.UsageError(f"depth={depth!r} is outside 1..{MAX_DEPTH}",
                                remedy="give the number of requests to keep in flight, e.g. 2")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) \
            or not 1 <= concurrency <= depth:
        raise errors.UsageError(f"concurrency={concurrency!r} is outside 1..{depth} (the depth)",
                                remedy="compute at most as many requests at once as are in flight")
    if threads is None:
        return
    cpus = os.cpu_count() or 1
    whole = not isinstance(threads, bool) and isinstance(threads, int) and threads >= 0
    if not whole or (here and threads > cpus):
        raise errors.UsageError(
            f"--threads {threads} is outside 0..{cpus} (this machine's CPU count)",
            remedy=f"give a whole number from 1 to {cpus}, or 0 for the runtime's default")


#: Session config entries xstage sets itself, or that make onnxruntime write or read a graph
#: file other than the one hashed (an EP context model): the bytes that ran are the bytes
#: hashed (docs/throughput.md, "Compile caches"). Prefixes end with a dot.
SESSION_CONFIG_REFUSED = ("ep.context_", "session.record_ep_graph_assignment_info",
                          "session.model_external_initializers_file_folder_path",
                          "session.optimized_model_external_initializers_file_name",
                          "session.load_model_format", "session.save_model_format")


def check_session_config(config: Mapping[str, str] | None) -> dict[str, str]:
    """The onnxruntime session config entries (``--session-config KEY=VALUE``), checked.

    onnxruntime takes any key and ignores the ones it does not know, so only the form is
    checked here: a dotted key (``session.intra_op.allow_spinning``), a string value. The
    record's ``worker.runtime.session_config`` says what the session holds.

    Raises:
        UsageError: not a mapping of strings, a key without a dot or with spaces, or a key
            xstage sets itself or that reads or writes another graph file.
    """
    if not config:
        return {}
    if not isinstance(config, Mapping):
        raise errors.UsageError(f"session_config={config!r} is not a mapping of KEY to VALUE",
                                remedy='e.g. {"session.intra_op.allow_spinning": "0"}')
    out: dict[str, str] = {}
    for key, value in config.items():
        if not isinstance(key, str) or "." not in key.strip(".") or any(c.isspace() for c in key):
            raise errors.UsageError(
                f"session config key {key!r} is not an onnxruntime config key",
                remedy="give a dotted key from onnxruntime's session options config keys, "
                "e.g. session.intra_op.allow_spinning=0")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise errors.UsageError(f"session config {key}={value!r}: the value is not a string",
                                    remedy=f'give it as text, e.g. "{key}": "0"')
        if key.startswith(SESSION_CONFIG_REFUSED):
            raise errors.UsageError(
                f"session config {key} is not passed through: xstage sets it itself, or it makes "
                "onnxruntime read or write a graph file other than the one hashed",
                remedy="leave it out (a route's compile cache keeps compiled blobs: "
                "docs/throughput.md, \"Compile caches\")")
        out[key] = str(value)
    return out


def _check_restart(restart: str, max_restarts: int, window: float) -> None:
    """The restart policy checked before anything runs.

    Raises:
        UsageError: ``restart`` not one of ``RESTART_POLICIES``; ``max_restarts`` not a whole
            number >= 0; ``restart_window`` not a number of seconds > 0.
    """
    if restart not in RESTART_POLICIES:
        raise errors.UsageError(f"restart={restart!r} is not one of "
                                f"{', '.join(RESTART_POLICIES)}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise errors.UsageError(f"max_restarts={max_restarts!r} is not a whole number >= 0")
    if isinstance(window, bool) or not isinstance(window, (int, float)) \
            or not 0 < window < float("inf"):
        raise errors.UsageError(f"restart_window={window!r} is not a number of seconds > 0")
