"""``StageRequest``: one frozen value for ``open_stage``'s arguments and ``xstage external``'s flags.

The value cannot be changed once built (nor through a mapping it was given), the CLI and the API
build the same value for the same arguments, it crosses to a cluster node whole, and the record's
``request`` block it serializes to is the one records had before it existed
(``tests/fixtures/records/request-blocks.json``, recorded before the change).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xstage import errors
from xstage.builtin_graphs import builtin_stage
from xstage.cli._output import Output
from xstage.cli.external import stage_request
from xstage.cli.main import build_parser
from xstage.client import Deadlines
from xstage.stage import open_stage
from xstage.stage.admit import Setup
from xstage.stage.request import (
    InputsAsked,
    Resolved,
    StageRequest,
    TensorSeen,
    describe_feeds,
)

BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "request-blocks.json"
SEED = 20260915
BUILTIN_INPUTS = (TensorSeen("x", "float32", (64, 512)),)


def _before(name: str) -> dict:
    return json.loads(BEFORE.read_text(encoding="utf-8"))[name]


def test_the_request_is_frozen_all_the_way_down():
    feeds = {"x": np.zeros((2, 3), np.float32)}
    request = StageRequest.build("m.onnx", ep_options={"a": "1"}, inputs=feeds,
                                 tolerance={"rel_l2": 1e-3}, shapes={"x": [2, 3]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.device = "cpu"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.inputs.source = "npz"  # type: ignore[misc]
    with pytest.raises(TypeError):
        request.arrays["y"] = feeds["x"]  # type: ignore[index]
    for name in ("ep_options", "criteria", "shapes", "dims", "resources"):
        assert isinstance(getattr(request, name), tuple), name
    assert request.shapes == (("x", (2, 3)),)
    resolved = Resolved(describe_feeds(feeds), "worker")
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.reference_arm = "in_process"  # type: ignore[misc]


def test_what_the_caller_changes_afterwards_does_not_reach_the_request():
    """An attack: the caller keeps its dicts and changes them while the stage opens."""
    options, feeds = {"a": "1"}, {"x": np.zeros(2, np.float32)}
    request = StageRequest.build("m.onnx", ep_options=options, inputs=feeds)
    options["b"], feeds["y"] = "2", np.ones(2, np.float32)
    request.ep_option_map()["c"] = "3"  # a fresh dict each time
    assert request.ep_option_map() == {"a": "1"}
    assert list(request.arrays or {}) == ["x"]
    assert request.to_record()["ep_options"] == {"a": "1"}


def test_setup_holds_no_list_and_no_dict_of_the_request():
    """``Setup`` is frozen and nothing in it is appended to: the candidates' details come back
    from ``attempt`` (``Attempt.detail``), the request is the value itself."""
    hints = {f.name: str(f.type) for f in dataclasses.fields(Setup)}
    assert not [n for n, t in hints.items() if t.startswith(("list", "dict"))], hints
    assert hints["request"] == "StageRequest" and hints["resolved"] == "Resolved"


def test_open_stage_takes_exactly_the_requests_arguments():
    """``open_stage``'s public signature is ``StageRequest.build``'s: every argument reaches the
    value, with the same default (so equal arguments build equal requests)."""
    api = inspect.signature(open_stage).parameters
    build = dict(inspect.signature(StageRequest.build).parameters)
    assert [(p.name, p.kind, p.default) for p in api.values()] == [
        (p.name, p.kind, p.default) for p in build.values()]


def test_the_cli_and_the_api_build_equal_requests(tmp_path):
    npz = tmp_path / "in.npz"
    argv = ["external", "--graph", "m.onnx", "--prefer", "npu,cpu", "--min-placement", "0.7",
            "--tolerance", "rel_l2=1e-3,elem=0.5", "--ep-option", "device_type=CPU",
            "--threads", "1", "--graph-opt-level", "ORT_ENABLE_BASIC", "--format", "onnx:fp32",
            "--component", "tower", "--inputs", str(npz), "--reference-arm", "in_process",
            "--timeout", "load=30", "--shape", "x=2x3", "--dim", "batch=4",
            "--throughput", "--depth", "3", "--session-config", "session.intra_op.allow_spinning=0"]
    args = build_parser().parse_args(argv)
    cli = stage_request(args, Path("m.onnx"), Output())
    api = StageRequest.build(
        Path("m.onnx"), prefer=["npu", "cpu"], min_placement=0.7,
        tolerance={"rel_l2": 1e-3, "elem": 0.5}, ep_options={"device_type": "CPU"}, threads=1,
        graph_opt_level="ORT_ENABLE_BASIC", fmt="onnx:fp32", component="tower",
        inputs=str(npz), reference_arm="in_process", deadlines=Deadlines(load=30.0),
        shapes={"x": (2, 3)}, dims={"batch": 4}, depth=3, concurrency=3, record_on_close=False,
        session_config={"session.intra_op.allow_spinning": "0"})
    assert cli == api
    assert cli.to_record() == api.to_record()
    plain = StageRequest.build(Path("m.onnx"), record_on_close=False)
    assert stage_request(build_parser().parse_args(["external"]), Path("m.onnx"), Output()) == plain


@pytest.mark.parametrize("name, kwargs, runs, warmup", [
    ("placed", {}, 20, 3),
    ("criteria", {"prefer": ["cpu"], "tolerance": {"rel_l2": 1e-3, "elem_a": 0.01},
                  "threads": 1}, 3, 1),
])
def test_the_request_block_is_the_one_records_had_before(name, kwargs, runs, warmup):
    request = StageRequest.build(builtin_stage(), **kwargs)
    block = request.to_record(Resolved(BUILTIN_INPUTS, "worker"), runs=runs, warmup=warmup)
    assert block == _before(name)["request"]
    assert list(request.to_record()) == [k for k in block if k != "reference_arm"]


def test_a_refused_record_written_now_has_the_same_request_block(tmp_path):
    """A real ``xstage external`` refused by its budget: the record's ``request`` block is the
    one the same command wrote before the request was a value."""
    before = _before("refused")
    target = tmp_path / "record.json"
    env = {**os.environ, "XSTAGE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "xstage", *before["argv"].split()[1:],
                           f"--json={target}"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2, done.stderr
    doc = json.loads(target.read_text(encoding="utf-8"))
    assert doc["outcome"]["status"] == before["status"] == "refused"
    assert doc["request"] == before["request"]


def test_no_selector_is_recorded_as_the_offload():
    assert StageRequest.build("m.onnx").offload is True
    assert StageRequest.build("m.onnx", device="cpu").offload is False
    assert StageRequest.build("m.onnx", inputs="a.npz").inputs == InputsAsked("npz", "a.npz")
    assert StageRequest.build("m.onnx").inputs == InputsAsked("synthesized", None, SEED)


def test_a_cluster_node_gets_the_whole_request_but_the_placement():
    """``node_arguments`` is what the node's ``open_stage`` is called with: built again there,
    it is this request without the placement's own fields (the node brings its ledger)."""
    request = StageRequest.build(
        "m.onnx", prefer=["npu"], tolerance={"cosine": 0.99}, ep_options={"a": "b"}, threads=1,
        shapes={"x": (1, 2)}, dims={"n": 3}, depth=4, concurrency=2, restart="on_death",
        max_restarts=1, restart_window=5.0, deadlines=Deadlines(call=9.0), cluster="ray",
        resources={"npu": 1}, placement_timeout=7.0, record_on_close=False,
        session_config={"session.intra_op.allow_spinning": "0"})
    assert request.resources == (("npu", 1.0),)
    again = StageRequest.build(request.artifact, **request.node_arguments())
    assert again == dataclasses.replace(request, cluster=None, resources=(),
                                        placement_timeout=60.0, record_on_close=True)
    block = request.to_record()
    assert (block["cluster"], block["resources"]) == ("ray", {"npu": 1.0})


@pytest.mark.parametrize("kwargs, match", [
    ({"tolerance": {"nope": 1.0}}, "unknown criterion"),
    ({"min_placement": 1.5}, "outside"),
    ({"depth": 0}, "depth=0"),
    ({"restart": "always"}, "restart="),
    ({"threads": -1}, "--threads -1"),
    ({"cluster": "ray", "report": object()}, r"report=\.\.\.\) does not cross"),
    ({"session_config": {"allow_spinning": "0"}}, "not an onnxruntime config key"),
    ({"session_config": {"session. intra_op": "0"}}, "not an onnxruntime config key"),
    ({"session_config": {"session.intra_op.allow_spinning": True}}, "the value is not a string"),
    ({"session_config": {"ep.context_enable": "1"}}, "a graph file other than the one hashed"),
    ({"session_config": {"session.record_ep_graph_assignment_info": "0"}}, "xstage sets it itself"),
    ({"session_config": [("session.a", "1")]}, "not a mapping"),
])
def test_bad_arguments_are_refused_when_the_request_is_built(kwargs, match):
    with pytest.raises(errors.UsageError, match=match):
        StageRequest.build("m.onnx", **kwargs)


def test_session_config_reaches_the_worker_session_only_and_the_record():
    """The entries go to the worker's session (``config``); the reference arm reads only the
    threads and the optimization level; the request block names them, absent when none."""
    request = StageRequest.build("m.onnx", threads=1, session_config={"session.a.b": 1})
    assert request.session_options() == {"intra_op_num_threads": 1, "config": {"session.a.b": "1"}}
    assert request.to_record()["session_config"] == {"session.a.b": "1"}
    assert "session_config" not in StageRequest.build("m.onnx").to_record()


def test_a_cluster_node_checks_its_own_cpu_count():
    """More threads than this machine's CPUs is a usage error here, not for a node."""
    many = (os.cpu_count() or 1) + 1
    with pytest.raises(errors.UsageError, match="CPU count"):
        StageRequest.build("m.onnx", threads=many)
    assert StageRequest.build("m.onnx", threads=many, cluster="ray").threads == many


def test_the_reference_arm_never_gets_the_session_config(monkeypatch):
    """The entries tune the stage's session; the gate's reference is built as always, in its
    own worker too (which takes ``load`` options as the stage's worker does)."""
    import xstage.stage.open as open_mod

    seen = {}

    class Stop(Exception):
        pass

    def make_reference(art, reference, session, *args, **kwargs):
        seen.update(session)
        raise Stop

    monkeypatch.setattr(open_mod, "make_reference", make_reference)
    with pytest.raises(Stop):
        open_stage(builtin_stage(), route="ort-cpu", threads=1,
                   session_config={"session.intra_op.allow_spinning": "0"})
    assert seen == {"intra_op_num_threads": 1}
