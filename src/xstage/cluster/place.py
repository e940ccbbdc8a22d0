"""Placement on a cluster: a node with the resources, the stage's actor there, its answer.

``open_on_cluster`` checks what it was asked before anything connects, ships the artifact's
files (and an ``.npz`` of inputs, read here) through Ray's object store, and places the stage's
actor. A request that no live node can ever satisfy is refused at once; one that some node
could satisfy but none does within ``placement_timeout`` is refused then: both as
``device_unreachable_from_this_process`` (cause ``no_node``) with the cluster's resource view.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from xstage import errors
from xstage._version import __version__
from xstage.artifact import Artifact, inspect_artifact
from xstage.cluster import _ray
from xstage.manifest import find_manifest
from xstage.record.build import build_record
from xstage.record.io import host_block, utc_now
from xstage.refusal import Refusal, RefusalCode
from xstage.stage.request import CLUSTERS, StageRequest, check_resources
from xstage.stage.state import declared_state

__all__ = ["CLUSTERS", "PLACEMENT_TIMEOUT_S", "Placement", "open_on_cluster", "parse_resources"]

#: How long a request some node could satisfy may wait for one to be free (seconds).
PLACEMENT_TIMEOUT_S = 60.0
_SERVING = ("restart", "max_restarts", "restart_window")


def parse_resources(items: Sequence[str]) -> dict[str, float]:
    """``--resource npu=1`` (repeatable) → ``{"npu": 1.0}``.

    Raises:
        UsageError: an item that is not NAME=AMOUNT, or a name given twice.
    """
    out: dict[str, float] = {}
    for item in items:
        name, sep, raw = (p.strip() for p in item.partition("="))
        try:
            amount = float(raw) if sep and name else None
        except ValueError:
            amount = None
        if amount is None or name in out:
            raise errors.UsageError(f"--resource {item!r} is not NAME=AMOUNT (or names "
                                    f"{name} twice)", remedy="e.g. --resource npu=1")
        out[name] = amount
    return check_resources(out)


def _bundle(art: Artifact) -> dict[str, bytes]:
    """The artifact's files by their path relative to the graph's folder (manifest included):
    its snapshot's copies, the bytes that were hashed, and the manifest beside the user's graph."""
    bundle = {}
    if art.snapshot is not None:
        for f in art.snapshot.files:
            bundle[f.name] = (art.snapshot.folder / f.name).read_bytes()
    else:
        bundle[art.path.name] = art.path.read_bytes()
    manifest = find_manifest(art.origin)
    if manifest is not None:
        bundle[manifest.name] = manifest.read_bytes()
    return bundle


def _local_inputs(inputs: Any) -> Any:
    """An ``.npz`` path read here (no pickle): the node may not have the file."""
    if not isinstance(inputs, str | os.PathLike):
        return inputs
    try:
        with np.load(inputs, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise errors.InputError(f"cannot read inputs {inputs}: {exc}",
                                remedy="pass an .npz written by numpy.savez") from None


def open_on_cluster(open_fn: Callable[..., Any], request: StageRequest) -> Any:
    """Place the stage on a node with the request's resources; ``open_fn`` is the node's ``open_stage``.

    ``request`` was checked when it was built (``StageRequest.build``: the cluster, the
    resources, the placement timeout, no argument that cannot cross to a node); the node's
    ``open_stage`` gets its ``node_arguments``, an ``.npz`` of inputs read here.

    Raises:
        UsageError: Ray missing or no cluster answering; an ``.npz`` of inputs that cannot be read.
        Refused: no node has the resources (within ``placement_timeout``), or the node's
            ``open_stage`` refused every candidate (its refusals, its record).
        XstageError: the node's ``open_stage`` failed (the same class, message and remedy).
    """
    from xstage.cluster.handle import ClusterStage

    options = request.node_arguments()
    serving = {**{k: options[k] for k in _SERVING},  # the node's worker too
               "record_on_close": request.record_on_close}  # the record is written here
    options["inputs"] = _local_inputs(options["inputs"])
    art = inspect_artifact(request.artifact, fmt=request.fmt, component=request.component)
    ref = options.pop("reference")
    if str(ref) != "auto":
        ref_art = inspect_artifact(ref)
        options["reference_files"] = (_bundle(ref_art), ref_art.sha256, ref_art.path.name)
        ref_art.release()  # its bytes are in the bundle
    ray = _ray.connect()
    placement = Placement(ray, open_fn, art, options, request, request.on_event or (lambda _m: None))
    return ClusterStage(placement, placement.place(), **serving)


class Placement:
    """Everything needed to place the stage again (a restart re-places and re-proves)."""

    def __init__(self, ray: Any, open_fn: Callable[..., Any], art: Artifact,
                 options: dict[str, Any], request: StageRequest,
                 say: Callable[[str], None]) -> None:
        self.ray = ray
        self.open_fn = open_fn
        self.artifact = art
        self.options = options  # the node's open_stage arguments (inputs read, reference shipped)
        self.resources = dict(request.resources)
        self.timeout = float(request.placement_timeout)
        self.say = say
        self.started = utc_now()
        self.files = ray.put(_bundle(art))
        self.request = request.to_record()  # the record's request block (cluster and resources)
        stateful = bool(declared_state(art))
        self.depth = 1 if stateful else request.depth

    def cluster_block(self, where: Mapping[str, Any] | None, **more: Any) -> dict[str, Any]:
        """The record's ``cluster`` block: the node, the request, the client (``more`` added)."""
        where = where or {}
        return {"system": "ray", "ray_version": self.ray.__version__,
                "resources": dict(self.resources), "placement_timeout_s": self.timeout,
                "node_id": where.get("node_id"), "hostname": where.get("hostname"),
                "address": where.get("address"), "actor_id": where.get("actor_id"),
                "python": where.get("python"), "client": {
                    k: host_block()[k] for k in ("hostname", "python")}, **more}

    def place(self) -> tuple[Any, dict[str, Any]]:
        """A new actor on a node with the resources, the stage opened there.

        Raises:
            Refused, XstageError: as ``open_on_cluster``.
        """
        self._feasible()
        ray = self.ray
        from xstage.cluster.actor import StageActor

        rest = dict(self.resources)
        name = f"xstage-stage-{uuid.uuid4().hex[:16]}"
        cls = ray.remote(concurrency_groups={"calls": self.depth, "control": 2})(StageActor)
        actor = cls.options(
            name=name, namespace=_ray.NAMESPACE, num_cpus=rest.pop("CPU", 0),
            num_gpus=rest.pop("GPU", 0), resources=rest, max_restarts=0).remote(name)
        try:
            where = ray.get(actor.where.options(concurrency_group="control").remote(),
                            timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise self._refused(waited=True) from None
        self.say(f"placed on {where['hostname']} (node {where['node_id'][:12]})")
        if where["xstage_version"] != __version__:
            ray.kill(actor)
            raise errors.XstageError(
                f"the node {where['hostname']} runs xstage {where['xstage_version']}, this "
                f"process {__version__}: the proof and the record would not be this version's",
                remedy="install the same xstage version on every node (docs/cluster.md)")
        try:
            opened = ray.get(actor.open.options(concurrency_group="control").remote(
                self.open_fn, self.files, self.artifact.path.name, self.artifact.sha256,
                dict(self.options)))
        except ray.exceptions.RayError as exc:  # the node died, or Ray failed to run the task
            ray.kill(actor)
            first = (str(exc).strip().splitlines() or [""])[-1]
            raise errors.XstageError(
                f"opening the stage on {where['hostname']} (node {where['node_id']}) failed: "
                f"{type(exc).__name__}: {first}",
                remedy="the node's Ray logs say why (its session_latest/logs folder)") from None
        for event in opened["events"]:
            self.say(f"[{where['hostname']}] {event}")
        if opened["status"] != "placed":
            ray.kill(actor)
            raise self._remote_error(opened["error"], where)
        return actor, opened

    def _feasible(self) -> None:
        """Refuse at once when no live node has every resource in the amount asked."""
        for node in _ray.nodes(self.ray):
            have = node["resources"]
            if all(have.get(k, 0) >= v for k, v in self.resources.items()):
                return
        raise self._refused(waited=False)

    def _refused(self, *, waited: bool) -> errors.Refused:
        asked = ", ".join(f"{k}={v:g}" for k, v in self.resources.items()) or "nothing"
        view = _ray.node_view(self.ray)
        message = (f"no node of the Ray cluster was free with {asked} within {self.timeout:g} s"
                   if waited else f"no node of the Ray cluster has {asked}") + f" (nodes: {view})"
        refusal = Refusal(
            code=RefusalCode.DEVICE_UNREACHABLE, cause="no_node", device=None, route=None,
            message=message, remedy="add a node with those resources (ray start --resources "
            "'{\"NAME\": N}'), close the stages that hold them, or ask for what a node has",
            evidence={"resources": dict(self.resources), "waited_s": self.timeout if waited
                      else 0.0, "nodes": _ray.nodes(self.ray)})
        record = build_record(argv=(), started=self.started, request=self.request,
                              status="refused", refusals=[refusal], artifact=self.artifact)
        record["cluster"] = self.cluster_block(None, nodes=_ray.nodes(self.ray))
        return errors.Refused(message, refusals=[refusal], remedy=refusal.remedy, record=record)

    def _remote_error(self, err: Mapping[str, Any], where: Mapping[str, Any]) -> Exception:
        """The node's error as the same class here, its record with the ``cluster`` block."""
        from xstage.cluster.actor import remote_error

        exc = remote_error(err, where)
        if isinstance(exc, errors.XstageError) and err.get("record") is not None:
            exc.record = {**err["record"], "cluster": self.cluster_block(where)}
        return exc
