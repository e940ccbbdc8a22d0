"""``xstage bisect`` without workers: usage errors (exit 64), a missing route (exit 2 with its
record, nothing probed), and the bisect record's own schema."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import onnx
import pytest
from chains import chain
from oracles import FIXTURES

from xstage import errors
from xstage.bisect import bisect
from xstage.bisect.record import read_bisect_record, validate_bisect_record


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xstage", "bisect", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, COLUMNS="160", **(env or {})))


@pytest.fixture
def graph(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(chain(4, [1]), path)
    return path


@pytest.mark.parametrize(("args", "says"), [
    ((), "one of the arguments --route --device is required"),
    (("--route", "ort-cpu", "--max-probes", "0"), "--max-probes 0 must be a whole number >= 1"),
    (("--route", "ort-cpu", "--min-region", "0"), "--min-region 0 must be a whole number >= 1"),
    (("--route", "ort-cpu", "--deadline", "0"), "--deadline 0.0 must be a number of seconds > 0"),
    (("--route", "ort-cpu", "--route", "nope"), "invalid choice"),
])
def test_usage_errors_exit_64_without_a_record(graph, args, says, xstage_home) -> None:
    done = _cli("--graph", str(graph), *args)
    assert done.returncode == 64, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert not list((xstage_home / "records").glob("*.json")) if (xstage_home / "records").exists() else True


def test_an_out_folder_that_is_not_empty_is_a_usage_error_before_anything_runs(graph, tmp_path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    done = _cli("--graph", str(graph), "--route", "ort-cpu", "--out", str(tmp_path / "out"))
    assert done.returncode == 64
    assert "--out" in done.stderr and "not an empty folder" in done.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_missing_route_is_refused_with_a_record_and_nothing_probed(graph, tmp_path) -> None:
    done = _cli("--graph", str(graph), "--route", "ort-openvino", "--json", str(tmp_path / "r.json"),
                env={"XSTAGE_PYTHON_ORT_OPENVINO": str(tmp_path / "no-python")})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    record = read_bisect_record(tmp_path / "r.json")
    assert record["outcome"]["status"] == "refused"
    assert record["probes"] == [] and record["target"] is None
    assert record["refusals"][0]["cause"] == "route_missing"


def test_a_torch_program_is_a_usage_error(tmp_path) -> None:
    (tmp_path / "p.pt2").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: a .pt2 by name
    with pytest.raises((errors.UsageError, errors.ArtifactError)):
        bisect(tmp_path / "p.pt2", route="torch-cpu")


@pytest.mark.parametrize("name", ["chain-hardmax", "chain-hardmax-edges"])
def test_the_recorded_live_records_validate(name) -> None:
    validate_bisect_record(json.loads((FIXTURES / f"{name}.json").read_text()))


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.update(kind="xstage.external"), "not of kind xstage.bisect"),
    (lambda d: d.update(schema_version="2.0"), "schema_version '2.0'"),
    (lambda d: d.update(extra=1), "$"),
    (lambda d: d["probes"][0].update(phase="guess"), "$.probes[0].phase"),
    (lambda d: d["outcome"].update(status="maybe"), "$.outcome.status"),
    (lambda d: d["regions"][0]["shares"].update(node_share=1.5), "$.regions[0].shares.node_share"),
])
def test_the_schema_rejects_a_changed_record(change, where) -> None:
    doc = copy.deepcopy(json.loads((FIXTURES / "chain-hardmax.json").read_text()))
    change(doc)
    with pytest.raises(errors.RecordError) as caught:
        validate_bisect_record(doc)
    assert where in caught.value.message
