"""A stage on another node's device, through a cluster (Ray): docs/cluster.md.

``open_stage(..., cluster="ray", resources={"npu": 1})`` hands itself to ``open_on_ray``: a Ray
actor starts on a node that has the resources and runs that node's own ``open_stage`` (its
routes, interpreters, device table and ledger), so the proof and the gate are made where the
stage runs. The caller gets a ``ClusterStage`` with ``Stage``'s API. Nothing here imports
``ray`` until a cluster is asked for (``pip install 'xstage[ray]'``).
"""

from __future__ import annotations

from xstage.cluster.place import CLUSTERS, PLACEMENT_TIMEOUT_S, open_on_cluster, parse_resources

__all__ = ["CLUSTERS", "PLACEMENT_TIMEOUT_S", "open_on_cluster", "parse_resources"]
