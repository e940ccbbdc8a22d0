"""``build_view`` and ``compare_views`` on real records (docs/reports/records)."""

from __future__ import annotations

from pathlib import Path

from xstage.record import read_record
from xstage.report import build_view, compare_views
from xstage.report.view import CPU_EP

OV = "OpenVINOExecutionProvider"


def test_the_committed_records_cover_every_outcome(records):
    assert {build_view(r).status for r in records.values()} == {"placed", "refused", "error"}


def test_a_split_record_shows_det_on_the_cpu_and_the_rest_on_openvino(records):
    view = build_view(records["split"])
    assert view.status == "placed" and view.target_ep == OV and view.route == "ort-openvino"
    rows = {s.op_type: s for s in view.split if not s.partition}
    assert rows["Det"].cpu_nodes == 1 and rows["Det"].target_nodes == 0 and rows["Det"].cpu_us > 0
    assert all(rows[op].target_nodes == 1 for op in ("MatMul", "Relu", "Add"))
    assert any(s.partition and s.target_us > 0 for s in view.split)  # OpenVINO's fused kernels
    assert view.split_source == "detail" and view.proof_source == "record"


def test_calls_and_phases_come_from_the_detail_block(records):
    rec = records["placed"]
    view = build_view(rec)
    assert len(view.calls) == rec["timings"]["runs"]
    assert [p["name"] for p in view.phases] == ["spawn + hello", "load", "warm-up", "evidence"]
    assert all(c.round_trip_us >= c.compute_us and c.transport_us >= 0 for c in view.calls)
    starts = [c.start_us for c in view.calls]
    assert starts == sorted(starts) and starts[0] > view.phases[-1]["start_us"]


def test_a_refused_record_takes_its_evidence_from_the_refusal(records):
    view = build_view(records["refused"])
    assert view.status == "refused" and view.exit_code == 2
    assert view.proof_source.startswith("refusal execution_provider_declined_graph")
    assert view.proof["verdict"] == "declined"
    assert [(s.op_type, s.cpu_nodes) for s in view.split if not s.partition] == [("Det", 1)]
    assert "declined" in view.headline


def test_an_error_record_renders_with_nothing_but_its_error(records):
    view = build_view(records["error"])
    assert view.status == "error" and view.exit_code == 1
    assert view.error["type"] == "ArtifactError" and "not a readable ONNX graph" in view.headline
    assert view.split == () and view.calls == () and view.proof is None


def test_compare_names_what_changed_between_two_routes(records):
    cmp = compare_views(
        build_view(records["ppocr-cls.ort-cpu"]), build_view(records["ppocr-cls.ort-openvino"])
    )
    assert cmp.same_artifact
    rows = {(r.section, r.label): r for r in cmp.rows}
    assert rows["run", "route"].a == "ort-cpu" and rows["run", "route"].b == "ort-openvino"
    assert rows["run", "target EP"].changed
    assert cmp.moved and all(a == CPU_EP for _, a, _ in cmp.moved)
    # A node the target EP fused away has no provider: said so, never "None".
    fused = [m for m in cmp.moved if m[2].startswith("fused away")]
    assert fused and all("None" not in m for m in cmp.moved)
    assert any(c.startswith("placement:") and "changed side" in c for c in cmp.changes)


def test_compare_of_two_artifacts_says_so(records):
    cmp = compare_views(build_view(records["split"]), build_view(records["placed"]))
    assert not cmp.same_artifact


WEBGPU = Path(__file__).resolve().parents[2] / "docs" / "records" / "webgpu-h100" / "2026-12-06"


def test_compare_shows_each_ledger_figure_in_its_pool_beside_the_host_rss():
    """Two GPU stages (WebGPU and torch-cuda on the H100, real records): the measured peak and the
    budget are the ledger's VRAM figures, named with their pool; the worker's host RSS is its own
    row, not passed off as the stage's peak."""
    a = build_view(read_record(WEBGPU / "block-ort-plugin-webgpu.json"))
    b = build_view(read_record(WEBGPU / "block-torch-cuda.json"))
    rows = {(r.section, r.label): r for r in compare_views(a, b).rows}
    pool = "in vram:gpu_discrete:nvidia:0"
    assert rows["memory", "measured peak"].a == f"31.0 MiB {pool}"
    assert rows["memory", "measured peak"].b.endswith(pool)
    assert rows["memory", "budget"].a.endswith(pool)
    assert rows["memory", "worker host RSS peak"].a == "209.8 MiB"
