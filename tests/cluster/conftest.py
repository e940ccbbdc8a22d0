"""One local Ray cluster for the module: every node on 127.0.0.1, one with ``fake_npu``.

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take the loopback address as each node's
address (``ray._private.services.get_node_ip_address``), and ``RAY_USAGE_STATS_ENABLED=0`` keeps
Ray from reporting usage: no test sends traffic to any other address (the fixture checks every
node's address). The nodes run with their own ``XSTAGE_HOME`` (the client side keeps the
suite's per-test one), so what a node writes (unpacked artifacts, its ledger) is its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: The environment every node starts with (Ray's workers inherit it); the variables are read
#: when ray is imported, so the fixture sets them first (and the constant again after).
NODE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}


@dataclass
class LocalCluster:
    """The running cluster: its address, and which node holds the fake NPU."""

    address: str
    npu_node: str
    head_node: str
    ray: Any


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    node_home = tmp_path_factory.mktemp("node-home")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in NODE_ENV.items():
            mp.setenv(key, value)
        ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'xstage[ray]'")
        from ray._private import ray_constants, services
        from ray.cluster_utils import Cluster

        # Read once when ray is first imported: set again in case it was imported before.
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        assert services.get_node_ip_address() == "127.0.0.1"  # before anything starts
        mp.setenv("XSTAGE_HOME", str(node_home))
        mp.setenv("XSTAGE_CONFIG", str(node_home / "no-user-config.toml"))
        mp.setenv("PYTHONPATH", os.pathsep.join(
            [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
        try:
            cluster.add_node(num_cpus=1, resources={"fake_npu": 2},
                             node_ip_address="127.0.0.1")
            cluster.wait_for_nodes(timeout=120)
            ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
            nodes = [n for n in ray.nodes() if n["Alive"]]
            assert cluster.address.startswith("127.0.0.1:"), cluster.address
            assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}, nodes
            npu = [n["NodeID"] for n in nodes if n["Resources"].get("fake_npu")]
            head = [n["NodeID"] for n in nodes if not n["Resources"].get("fake_npu")]
            assert len(npu) == 1 and len(head) == 1, nodes
            yield LocalCluster(cluster.address, npu[0], head[0], ray)
        finally:
            ray.shutdown()
            cluster.shutdown()
