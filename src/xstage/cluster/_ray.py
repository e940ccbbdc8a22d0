"""Ray, imported only when a cluster is asked for; the connection and the cluster's nodes."""

from __future__ import annotations

import os
from typing import Any

from xstage import errors

__all__ = ["NAMESPACE", "connect", "node_view", "nodes", "ray_module"]

#: The Ray namespace of xstage's named actors (stages and per-node ledgers).
NAMESPACE = "xstage"


def ray_module() -> Any:
    """The ``ray`` module.

    Raises:
        UsageError: Ray is not installed in this interpreter.
    """
    try:
        import ray
    except ImportError:
        raise errors.UsageError(
            "cluster='ray' needs Ray, which is not installed in this Python",
            remedy="pip install 'xstage[ray]' (the same Ray and Python versions on every node)",
        ) from None
    return ray


def connect() -> Any:
    """Ray, connected: the session already open in this process, else ``RAY_ADDRESS`` or
    the local cluster (``ray start --head``).

    Raises:
        UsageError: Ray is missing.
        XstageError: no cluster answers at the address (exit 1).
    """
    ray = ray_module()
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level="ERROR", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise errors.XstageError(
            f"no Ray cluster answered at {address}: {exc}",
            remedy="start one (ray start --head, then ray start --address=HEAD:6379 on each "
            "node) or set RAY_ADDRESS to its head's address") from None
    return ray


def nodes(ray: Any) -> list[dict[str, Any]]:
    """The cluster's live nodes: id, host name, address, total resources (by node id)."""
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        out.append({"node_id": node["NodeID"], "hostname": node.get("NodeManagerHostname"),
                    "address": node.get("NodeManagerAddress"),
                    "resources": {k: v for k, v in sorted(node.get("Resources", {}).items())
                                  if not k.startswith("node:")}})
    return sorted(out, key=lambda n: n["node_id"])


def node_view(ray: Any) -> str:
    """The cluster's resource view in one line per node (for a refusal's message)."""
    parts = []
    for node in nodes(ray):
        shown = ", ".join(f"{k}={_amount(v)}" for k, v in node["resources"].items()
                          if k not in ("memory", "object_store_memory"))
        parts.append(f"{node['hostname']} ({node['node_id'][:12]}, {node['address']}): "
                     f"{shown or 'nothing'}")
    return "; ".join(parts) or "no live node"


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
