"""What runs on the node: the stage's Ray actor and the node's one ledger.

``StageActor`` opens the stage with the node's own ``open_stage`` (handed over by the caller:
the cluster package never imports the stage's admission path) and serves it. Every answer is
plain data: outputs by name, records, and errors as (type, message, remedy) so that nothing
the client does not know how to rebuild crosses back. ``NodeLedgerActor`` is the node's ledger,
one per node (a named actor), so that every stage on a node is charged to that node's pools
once; ``NodeLedger`` is the stage's view of it.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage._version import __version__
from xstage.home import cache_dir
from xstage.ledger import Budget, Fit, Pool
from xstage.refusal import Refusal, RefusalCode
from xstage.stage.ledger import Holding, Ledger

__all__ = ["NodeLedger", "NodeLedgerActor", "StageActor", "remote_error", "where"]


def where() -> dict[str, Any]:
    """This node and process: Ray node id, host name, address, pid, versions."""
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(),
            "address": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "actor_id": ctx.get_actor_id(), "python": sys.version.split()[0],
            "ray_version": ray.__version__, "xstage_version": __version__}


def _error(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data (the client raises the same class again by name)."""
    return {"type": type(exc).__name__, "message": getattr(exc, "message", None) or str(exc),
            "remedy": getattr(exc, "remedy", None), "generation": getattr(exc, "generation", None),
            "record": getattr(exc, "record", None),
            "refusals": [r.to_dict() for r in getattr(exc, "refusals", ())]}


def unpack(files: Mapping[str, bytes], sha256: str) -> Path:
    """The artifact's files written under this node's ``XSTAGE_HOME/cache/cluster/<sha256>``.

    Written once per content (a temp folder renamed into place); the graph's identity is checked
    again by ``open_stage`` when it hashes the files.
    """
    root = cache_dir() / "cluster"
    final = root / sha256
    if not final.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".unpack-"))
        for rel, data in files.items():
            target = (tmp / rel).resolve()
            if tmp.resolve() not in target.parents:
                raise errors.ArtifactError(f"artifact file {rel!r} escapes its folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        try:
            tmp.rename(final)
        except OSError:  # another actor unpacked the same content first
            pass
    return final


def remote_error(err: Mapping[str, Any], where: Mapping[str, Any]) -> Exception:
    """An error the node sent as data, raised again here as its own class where it can be."""
    kind, message, remedy = err["type"], err["message"], err.get("remedy")
    if kind == "Refused":
        refusals = [Refusal(code=RefusalCode(r["code"]), cause=r["cause"], device=r["device"],
                            route=r["route"], message=r["message"], remedy=r["remedy"],
                            evidence=r.get("evidence") or {}) for r in err["refusals"]]
        return errors.Refused(message, refusals=refusals, remedy=remedy, record=err.get("record"))
    if kind == "StageClosed":
        return errors.StageClosed(message)
    cls = getattr(errors, kind, None)
    if kind == "WorkerDied":
        return errors.WorkerDied(message, exit_status=None, remedy=remedy,
                                 generation=err.get("generation"))
    if isinstance(cls, type) and issubclass(cls, errors.WorkerError):
        return errors.WorkerError(f"{kind}: {message}", remedy=remedy,
                                  generation=err.get("generation"))
    if isinstance(cls, type) and issubclass(cls, errors.XstageError):
        try:
            return cls(message, remedy=remedy)
        except TypeError:
            pass
    return errors.XstageError(f"{kind} on {where.get('hostname')}: {message}", remedy=remedy)


class NodeLedgerActor:
    """The node's ledger: pools read on this node, holdings of every stage open on it.

    A holding names the stage actor that took it; holdings whose actor is gone are given back
    before each reservation (a client that died without closing leaks nothing for long).
    """

    def __init__(self) -> None:
        self._ledger = Ledger()
        self._owners: dict[int, str] = {}

    def reserve(self, budget: Budget, label: str, devices: Sequence[Any],
                owner: str, also: Sequence[Budget] = ()) -> tuple[Holding | None, Fit]:
        """``Ledger.reserve`` on the node, on behalf of the stage actor named ``owner``."""
        self._prune()
        holding, fit = self._ledger.reserve(budget, label, devices, also=also)
        if holding is not None:
            self._owners[holding.token] = owner
        return holding, fit

    def release(self, holding: Holding | None) -> None:
        """``Ledger.release``."""
        if holding is not None:
            self._owners.pop(holding.token, None)
            self._ledger.release(holding)

    def release_token(self, token: int) -> None:
        """Give back the holding ``token`` (the client's word that its actor died)."""
        for held in self._ledger.holdings():
            if held.token == token:
                self.release(held)

    def holdings(self) -> list[tuple[Holding, str]]:
        """Every holding and the stage actor it belongs to."""
        return [(h, self._owners.get(h.token, "")) for h in self._ledger.holdings()]

    def pools(self) -> list[Pool]:
        """``Ledger.pools``."""
        return self._ledger.pools()

    def _prune(self) -> None:
        import ray

        from xstage.cluster._ray import NAMESPACE

        for held in self._ledger.holdings():
            owner = self._owners.get(held.token)
            if not owner:
                continue
            try:
                ray.get_actor(owner, namespace=NAMESPACE)
            except ValueError:  # that stage's actor is gone
                self.release(held)


class NodeLedger(Ledger):
    """A stage actor's view of its node's ``NodeLedgerActor`` (what ``admit`` reserves from)."""

    def __init__(self, actor: Any, owner: str, node_id: str) -> None:
        super().__init__()
        self._actor = actor
        self._owner = owner
        self.node_id = node_id

    def reserve(self, budget: Budget, label: str, devices: Sequence[Any] = (),
                also: Sequence[Budget] = ()) -> tuple[Holding | None, Fit]:
        """Reserve on the node's ledger (``also``: the stage's budgets in other pools, as
        ``Ledger.reserve``)."""
        import ray

        return ray.get(self._actor.reserve.remote(budget, label, tuple(devices), self._owner,
                                                  tuple(also)))

    def release(self, holding: Holding | None) -> None:
        """Give back on the node's ledger (idempotent)."""
        import ray

        if holding is not None:
            ray.get(self._actor.release.remote(holding))

    def holdings(self, pool: str | None = None) -> list[Holding]:
        """The node's holdings (in ``pool``, or all)."""
        import ray

        return [h for h, _ in ray.get(self._actor.holdings.remote())
                if pool is None or h.budget.pool == pool]

    def held_bytes(self, pool: str) -> int:
        """Bytes held in ``pool`` on the node."""
        return sum(h.budget.budget_bytes for h in self.holdings(pool))

    def pools(self) -> list[Pool]:
        """The node's pools."""
        import ray

        return list(ray.get(self._actor.pools.remote()))


def node_ledger(owner: str) -> NodeLedger:
    """This node's ledger (the named actor, made on first use, pinned to this node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from xstage.cluster._ray import NAMESPACE

    node_id = ray.get_runtime_context().get_node_id()
    actor = ray.remote(NodeLedgerActor).options(
        name=f"xstage-ledger-{node_id}", namespace=NAMESPACE, get_if_exists=True,
        lifetime="detached", num_cpus=0, max_concurrency=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    return NodeLedger(actor, owner, node_id)


class StageActor:
    """One stage on this node: opened by the node's ``open_stage``, then served."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._stage: Any = None
        self._ledger: NodeLedger | None = None

    def where(self) -> dict[str, Any]:
        """:func:`where` (the client's first call: the actor is placed once it answers)."""
        return where()

    def open(self, open_fn: Callable[..., Any], files: Mapping[str, bytes], graph: str,
             sha256: str, options: dict[str, Any]) -> dict[str, Any]:
        """Open the stage here; ``placed`` with its record, else ``refused``/``error``."""
        events: list[str] = []
        try:
            folder = unpack(files, sha256)
            options = dict(options)  # the caller's mapping stays as it was handed over
            ref = options.pop("reference_files", None)
            if ref is not None:
                options["reference"] = str(unpack(ref[0], ref[1]) / ref[2])
            self._ledger = node_ledger(self._name)
            self._stage = open_fn(folder / graph, ledger=self._ledger, on_event=events.append,
                                  record_on_close=False, **options)
        except (errors.XstageError, errors.StageClosed) as exc:
            return {"status": "refused" if isinstance(exc, errors.Refused) else "error",
                    "error": _error(exc), "events": events, "where": where()}
        stage = self._stage
        holding = stage.holding
        return {"status": "placed", "record": stage.record(), "events": events, "where": where(),
                "device": stage.device, "route": stage.route, "depth": stage.depth,
                "inputs": dict(stage.inputs), "holding": holding.token if holding else None,
                "pool": holding.budget.pool if holding else None}

    def call(self, inputs: Mapping[str, np.ndarray], timeout: Any) -> tuple[Any, ...]:
        """One request: ``("ok", outputs, timing)`` or ``("error", error)``."""
        from xstage.client.pipeline import USE_DEADLINE

        try:
            fut = self._stage.submit(inputs, timeout=USE_DEADLINE if timeout == "deadline"
                                     else timeout)
            out = fut.result()
            return "ok", dict(out), dict(fut.timing), fut.generation
        except (errors.XstageError, errors.StageClosed) as exc:
            return "error", _error(exc)

    def record(self) -> dict[str, Any]:
        """The node's record of the stage so far."""
        return self._stage.record()

    def health(self) -> dict[str, Any]:
        """The node's ``Stage.health()``."""
        return self._stage.health()

    def waits(self) -> dict[str, Any]:
        """The node's ``Stage.waits()``."""
        return self._stage.waits()

    def pid(self) -> int:
        """This actor's process id (the tests kill it)."""
        return os.getpid()

    def close(self) -> None:
        """Close the stage (its worker ends, its holding goes back to the node's ledger)."""
        if self._stage is not None:
            self._stage.close()
