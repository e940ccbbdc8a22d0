"""What ``cluster=`` checks before anything connects, and a Python without Ray (no cluster)."""

from __future__ import annotations

import sys

import pytest

import xstage
from xstage import builtin_graphs, errors
from xstage.cluster import parse_resources


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("g") / "mlp.onnx")


def test_without_ray_cluster_ray_is_a_usage_error_naming_the_extra(mlp, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(errors.UsageError) as info:
        xstage.open_stage(mlp, route="ort-cpu", cluster="ray", resources={"npu": 1})
    assert "pip install 'xstage[ray]'" in info.value.remedy


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cluster": "slurm"}, "is not one of ray"),
    ({"cluster": "ray", "resources": {"npu": 0}}, "amount > 0"),
    ({"cluster": "ray", "resources": {"npu": True}}, "amount > 0"),
    ({"cluster": "ray", "placement_timeout": 0}, "placement_timeout"),
    ({"cluster": "ray", "ledger": xstage.Ledger()}, r"ledger=\.\.\.\) does not cross"),
])
def test_bad_cluster_arguments_are_usage_errors_before_connecting(mlp, kwargs, match,
                                                                  monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # nothing may reach Ray
    with pytest.raises(errors.UsageError, match=match):
        xstage.open_stage(mlp, route="ort-cpu", **kwargs)


def test_resource_flags_parse():
    assert parse_resources(["npu=1", "GPU=0.5"]) == {"npu": 1.0, "GPU": 0.5}
    for bad in (["npu"], ["npu=x"], ["npu=1", "npu=2"], ["=1"], ["npu=-1"]):
        with pytest.raises(errors.UsageError):
            parse_resources(bad)


def test_the_node_ledger_takes_what_the_ledger_takes():
    """``admit`` calls ``reserve`` on whichever ledger it was given: the node's view must accept
    every argument the local ledger does (a GPU stage's ``also=`` once reached it unaccepted)."""
    import inspect

    from xstage.cluster.actor import NodeLedger
    from xstage.stage.ledger import Ledger

    for name in ("reserve", "release", "holdings"):
        local = inspect.signature(getattr(Ledger, name)).parameters
        node = inspect.signature(getattr(NodeLedger, name)).parameters
        assert list(node) == list(local), name


def test_the_node_leaves_the_options_it_was_handed_as_they_were(tmp_path, monkeypatch):
    """StageActor.open unpacks the reference's files into a path of its own copy of the options:
    the mapping it received (Ray's deserialized copy, or a caller's in a local mode) is not
    changed under whoever holds it."""
    import hashlib

    from xstage.cluster import actor

    monkeypatch.setenv("XSTAGE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(actor, "node_ledger", lambda name: None)
    monkeypatch.setattr(actor, "where", dict)  # Ray's node address is cached once read
    seen = {}

    def open_fn(path, **kwargs):
        seen.update(kwargs)
        raise errors.UsageError("stop here")

    files = {"g.onnx": b"graph"}
    ref = ({"r.onnx": b"reference"}, hashlib.sha256(b"reference").hexdigest(), "r.onnx")
    options = {"route": "ort-cpu", "reference_files": ref}
    handed = dict(options)
    out = actor.StageActor("n").open(open_fn, files, "g.onnx", hashlib.sha256(b"graph").hexdigest(), options)
    assert out["status"] == "error" and options == handed
    assert seen["reference"].endswith("r.onnx") and "reference_files" not in seen
