"""``xstage devices --cluster ray``: every live node's own device table and routes."""

from __future__ import annotations

from typing import Any

from xstage.cluster import _ray
from xstage.device_table import DeviceReport, devices

__all__ = ["NODE_TIMEOUT_S", "cluster_devices"]

#: Seconds one node may take to build its device table (its route probes run there).
NODE_TIMEOUT_S = 300.0


def _node_report(refresh: bool) -> tuple[dict[str, Any], DeviceReport]:
    """Runs on the node: where it is, and its device table."""
    from xstage.cluster.actor import where

    return where(), devices(refresh=refresh)


def cluster_devices(refresh: bool = False) -> list[tuple[dict[str, Any], DeviceReport]]:
    """Each live node (id, host name, address, resources) with its own ``DeviceReport``.

    Raises:
        UsageError: Ray is missing, or no cluster answers.
    """
    ray = _ray.connect()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(_node_report)
    live = _ray.nodes(ray)
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["node_id"], soft=False)).remote(refresh) for node in live]
    out = []
    for node, (where, report) in zip(live, ray.get(refs, timeout=NODE_TIMEOUT_S), strict=True):
        out.append(({**node, "python": where["python"], "ray_version": where["ray_version"],
                     "xstage_version": where["xstage_version"]}, report))
    return out
