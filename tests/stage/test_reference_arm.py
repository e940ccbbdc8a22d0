"""The gate's reference arm out of the caller's process: an ort-cpu worker, the tie-break in a child.

By default an ONNX stage's reference runs in the ort-cpu route's worker and its float64
tie-break in a child process of this interpreter, each charged to the ledger's host pool only
while it runs; the caller imports no onnxruntime and keeps none of the graph's memory
(docs/memory.md, "The gate's transient reservations"). ``reference_arm="in_process"`` keeps
the old arm.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xstage
from tests.stage.test_tiebreak_reference import _reordered_mlp
from xstage import builtin_graphs, errors
from xstage.artifact import inspect_artifact
from xstage.parity import compare
from xstage.stage import tiebreak
from xstage.stage.reference import OnnxReference, OnnxWorkerReference, ReferenceOverBudget

REF_LABEL = "the numeric gate's reference arm (ort-cpu worker)"
F64_LABEL = "the numeric gate's float64 tie-break (a child process)"


class RecordingLedger(xstage.Ledger):
    """A real ledger that also writes down every reserve (held or not) and release, by label."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, str, int]] = []
        self._labels: dict[int, str] = {}

    def reserve(self, budget, label, devices=(), also=()):
        holding, fit = super().reserve(budget, label, devices, also)
        self.events.append(("reserve" if holding else "refused", label, budget.budget_bytes))
        if holding is not None:
            self._labels[holding.token] = label
        return holding, fit

    def release(self, holding):
        if holding is not None and holding.token in self._labels:
            self.events.append(("release", self._labels.pop(holding.token), holding.budget.budget_bytes))
        super().release(holding)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("g") / "mlp.onnx")


def _round(script: str, *argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


IMPORTS = r"""
import gc, json, sys
before = set(sys.modules)
import xstage
from xstage.builtin_graphs import builtin_stage
stage = xstage.open_stage(builtin_stage(), route="ort-cpu", record_on_close=False,
                          reference_arm=sys.argv[1])
stage(stage.inputs)
stage.close()
gc.collect()
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def test_an_onnx_stage_is_opened_called_and_closed_without_onnxruntime_in_the_caller():
    """A fresh process opens, calls and closes the built-in stage: onnx (structure, no external
    data) is imported, onnxruntime is not; with the in-process arm it is (the control)."""
    imported = _round(IMPORTS, "worker")
    print("imported by an engine-side process:", " ".join(imported))
    assert "onnxruntime" not in imported and "xstage" in imported and "onnx" in imported
    assert "torch" not in imported and "onnx_ir" not in imported
    assert "onnxruntime" in _round(IMPORTS, "in_process")


RSS = r"""
import gc, sys
import psutil
import xstage
from xstage.builtin_graphs import builtin_stage

def once(path):
    stage = xstage.open_stage(path, route="ort-cpu", record_on_close=False)
    stage(stage.inputs)
    stage.close()
    gc.collect()
    return stage, psutil.Process().memory_info().rss  # the object kept, as an engine keeps it

a, base = once(builtin_stage())
b, big = once(sys.argv[1])
print(big - base)
"""


def test_a_100_mib_stage_leaves_the_callers_rss_where_the_builtin_left_it(tmp_path):
    """Open, call and close a graph of 96 MiB of fp32 weights (its stage object kept): the
    caller's RSS stays within 48 MiB of the built-in's (measured +0.2 MiB for 128 MiB; the
    in-process reference held +128.3 MiB there, benchmarks/caller_rss.py). The bound is loose
    on purpose: it separates "the weights are here" from "they are not", whatever the
    allocator does."""
    rng = np.random.default_rng(0)
    width, depth = 2048, 6  # 6 x 16 MiB + biases: 96 MiB of weights, 100.7 MB
    nodes, inits, prev = [], [], "x"
    for i in range(depth):
        inits.append(numpy_helper.from_array(
            rng.standard_normal((width, width), dtype=np.float32) / np.float32(45), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        prev = f"m{i}"
    nodes.append(helper.make_node("Tanh", [prev], ["y"]))
    graph = helper.make_graph(nodes, "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, width])], inits)
    path = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(path), save_as_external_data=True, location="big.bin", size_threshold=0)
    assert (tmp_path / "big.bin").stat().st_size >= 96 * 2**20
    delta = int(_round(RSS.replace("print(big - base)", "import json; print(json.dumps(big - base))"),
                       str(path)))
    assert delta < 48 * 2**20, f"the caller's RSS grew {delta / 2**20:.1f} MiB"


def test_the_reference_worker_is_held_in_the_ledger_only_while_it_runs(mlp):
    """The reference worker is reserved, run and released before the candidate's budget is
    taken; measure(compare_cpu=True) starts a fresh one, held while it is timed."""
    book = RecordingLedger()
    with xstage.open_stage(mlp, route="ort-cpu", ledger=book, record_on_close=False) as stage:
        assert stage.parity.passed and stage.parity.reference_kind == "same_graph_cpu"
        assert stage.record()["request"]["reference_arm"] == "worker"
        first = book.events[:3]
        assert [e[:2] for e in first[:2]] == [("reserve", REF_LABEL), ("release", REF_LABEL)]
        assert first[2][0] == "reserve" and "ort-cpu" in first[2][1]
        assert [h.label for h in book.holdings()] == [first[2][1]]  # the stage's only
        book.events.clear()
        timings = stage.measure(runs=2, warmup=0, compare_cpu=True)
        assert timings["reference"]["p50_ms"] > 0
        assert [e[:2] for e in book.events] == [("reserve", REF_LABEL), ("release", REF_LABEL)]
    assert book.holdings() == []


def _with_dead_weight(model: onnx.ModelProto, path: Path, mib: int) -> Path:
    """``model`` with an unused initializer of ``mib`` MiB beside it: the ledger counts the
    bytes on disk, onnxruntime drops it (the reference computes what the stage computes)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.initializer.append(numpy_helper.from_array(np.zeros(mib << 18, np.float32), "dead"))
    onnx.save(out, str(path), save_as_external_data=True, location=f"{path.stem}.bin", size_threshold=1024)
    return path


def test_a_reference_that_fits_only_alone_runs_before_the_stage_takes_its_budget(mlp, tmp_path):
    """A pool with room for the reference worker or the stage, not both: the reference runs
    alone first, then the stage is admitted (no false refusal)."""
    ref = _with_dead_weight(builtin_graphs.mlp(), tmp_path / "ref.onnx", 48)
    book = RecordingLedger(capacity={"host_ram": "200MiB"})
    with xstage.open_stage(mlp, route="ort-cpu", reference=ref, ledger=book,
                           record_on_close=False) as stage:
        assert stage.parity.passed and stage.parity.reference_kind == "user"
        ref_bytes = book.events[0][2]
        stage_bytes = book.holdings()[0].budget.budget_bytes
        assert ref_bytes + stage_bytes > 200 * 2**20 >= max(ref_bytes, stage_bytes)


def test_a_reference_that_does_not_fit_beside_the_stage_refuses_it(mlp, tmp_path):
    """The reference worker does not fit the pool even alone, the stage does: the gate cannot
    run within the budget, so the candidate is refused budget_exceeds_device, naming the arm."""
    ref = _with_dead_weight(builtin_graphs.mlp(), tmp_path / "ref.onnx", 64)
    book = RecordingLedger(capacity={"host_ram": "120MiB"})
    with pytest.raises(errors.Refused) as refused:
        xstage.open_stage(mlp, route="ort-cpu", reference=ref, ledger=book, record_on_close=False)
    (refusal,) = refused.value.refusals
    assert (refusal.code, refusal.cause) == ("budget_exceeds_device", "over_budget")
    assert "the numeric gate's reference arm (ort-cpu worker) does not fit" in refusal.message
    assert refusal.evidence["ledger"]["pool"]["name"] == "host_ram"
    assert [e[0] for e in book.events if e[1] == REF_LABEL] == ["refused", "refused"]
    assert book.holdings() == []


def test_the_in_process_arm_stays_available_and_a_bad_name_is_a_usage_error(mlp):
    with xstage.open_stage(mlp, route="ort-cpu", reference_arm="in_process",
                           record_on_close=False) as stage:
        assert stage.parity.passed and isinstance(stage._admission.setup.reference, OnnxReference)
        assert stage.record()["request"]["reference_arm"] == "in_process"
    with pytest.raises(errors.UsageError, match="reference_arm='here' is not one of worker, in_process"):
        xstage.open_stage(mlp, route="ort-cpu", reference_arm="here")


def test_a_reference_graph_the_worker_cannot_load_is_an_artifact_error(mlp, tmp_path):
    """As the in-process arm said it: the graph, onnxruntime's CPU EP, and the remedy."""
    node = helper.make_node("Nope", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "nope",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 256])])
    path = tmp_path / "nope.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)],
                                ir_version=8), str(path))
    with pytest.raises(errors.ArtifactError, match="does not load on onnxruntime's CPU EP") as err:
        xstage.open_stage(mlp, route="ort-cpu", reference=path)
    assert str(path) in err.value.message and err.value.remedy == "check the graph (or --reference)"


# --- the float64 tie-break in a child process ------------------------------------------------


def test_the_tiebreak_in_a_child_gives_the_in_process_answer(mlp):
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    here = tiebreak.evaluate_float64(mlp, {"x": x})
    there = tiebreak.evaluate_in_child(mlp, {"x": x}, graph_bytes=mlp.stat().st_size)
    assert list(there) == list(here) and there["y"].dtype == np.float64
    np.testing.assert_array_equal(there["y"], here["y"])
    with pytest.raises(tiebreak.Unavailable, match="passed its 0 s limit") as late:
        tiebreak.evaluate_in_child(mlp, {"x": x}, graph_bytes=1, time_limit_s=0.0)
    assert late.value.code == "time_limit"


def test_the_tiebreak_child_is_charged_to_the_ledger_and_refused_when_it_does_not_fit(tmp_path):
    """A reordered stage (fp32 noise beyond rule 8's a = 1e-7) failing the fp32 comparison:
    the worker arm's tie-break runs in a child, held in the ledger meanwhile, and passes it as
    the in-process one does; in a pool too small for the child it is unavailable (memory)."""
    model = builtin_graphs.mlp(width=64, depth=3, batch=8, seed=3)
    path = builtin_graphs.write(model, tmp_path / "reference.onnx")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    stage = {"y": _reordered_mlp(model, x)}  # each product one rank-1 update at a time
    art = inspect_artifact(path)
    book = RecordingLedger()
    arm = OnnxWorkerReference(None, art.path, "same_graph_cpu", footprint_of=art,
                              shapes={"x": (8, 64)}, ledger=book)
    reference = arm.outputs({"x": x})
    gate = compare(stage, reference, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert gate.verdict == "failed" and gate.cause == "elementwise"
    settled = tiebreak.settle(gate, art, {"x": x}, stage, reference, arm)
    assert settled.passed and settled.tiebreak["status"] == "passed", settled.summary
    here = tiebreak.settle(gate, art, {"x": x}, stage, reference)  # the in-process answer

    def timeless(tb: dict) -> dict:
        return {k: v for k, v in tb.items() if k != "seconds"}

    assert timeless(settled.tiebreak) == timeless(here.tiebreak) and settled.verdict == here.verdict
    assert [e[:2] for e in book.events if e[1] == F64_LABEL] == [("reserve", F64_LABEL),
                                                                ("release", F64_LABEL)]
    small = OnnxWorkerReference(None, art.path, "same_graph_cpu", footprint_of=art,
                                ledger=xstage.Ledger(capacity={"host_ram": "64MiB"}))
    refused = tiebreak.settle(gate, art, {"x": x}, stage, reference, small)
    assert refused.tiebreak["status"] == "unavailable" and refused.tiebreak["reason_code"] == "memory"
    assert "float64 tie-break (a child process) does not fit" in refused.tiebreak["reason"]


def test_the_cli_flag_picks_the_arm_and_the_record_says_which():
    """``xstage external --reference-arm in_process``: placed, and the record names the arm."""
    out = subprocess.run([sys.executable, "-m", "xstage", "external", "--route", "ort-cpu",
                          "--reference-arm", "in_process", "--runs", "1", "--warmup", "0",
                          "--json", "-"], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["request"]["reference_arm"] == "in_process"
    bad = subprocess.run([sys.executable, "-m", "xstage", "external", "--reference-arm", "here"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert bad.returncode == 64 and "Traceback" not in bad.stderr and "--reference-arm" in bad.stderr


def test_compare_cpu_with_no_room_beside_the_stage_says_so_and_holds_nothing(mlp):
    """measure(compare_cpu=True)'s fresh reference worker is budgeted: in a pool with room for
    the stage or that worker, not both, it is an error naming the pool, and nothing starts."""
    book = RecordingLedger(capacity={"host_ram": "150MiB"})
    with xstage.open_stage(mlp, route="ort-cpu", ledger=book, record_on_close=False) as stage:
        ref_bytes, stage_bytes = book.events[0][2], book.holdings()[0].budget.budget_bytes
        assert ref_bytes + stage_bytes > 150 * 2**20 >= max(ref_bytes, stage_bytes)
        with pytest.raises(ReferenceOverBudget, match="reference arm .ort-cpu worker. does not fit") as over:
            stage.measure(runs=1, warmup=0, compare_cpu=True)
        assert "pool host_ram" in over.value.message and over.value.remedy
        assert [h.budget.budget_bytes for h in book.holdings()] == [stage_bytes]
