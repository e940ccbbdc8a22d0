"""Zero false "placed": the adversarial corpus, run for real through ``xstage external``.

Cases come from ``adv_corpus`` (generated per class from a seed printed at the start and in the
table at the end; ``XSTAGE_ADV_SEED`` repeats a run), their expected results from ``adv_oracle``
(construction metadata only, no code shared with ``xstage.evidence``). Each case runs through the
CLI's own ``main`` in this process, with real workers in the real route envs (the ort-openvino
test env, onnxruntime 1.19 on Python 3.9 for ``ort-cpu``, the export env for ``torch-cpu``); the
device table is resolved once per module, and the simulated one adds an Intel iGPU row to it.

Classes today's proof fails are marked ``xfail(strict=True)`` with what fixes them; the lead
removes the marks as those fixes merge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import adv_corpus
import adv_oracle
import pytest
import runcache

from xstage import builtin_graphs, device_table
from xstage.cli.main import main as cli_main
from xstage.host import hardware as hw

SEED = adv_corpus.seed_from_env()
adv_corpus.SEED = SEED  # for the table (conftest)
CASES = adv_corpus.generate(SEED)
print(f"\nadversarial corpus seed: {SEED} (set {adv_corpus.SEED_ENV}={SEED} to repeat)")

#: Classes a known gap still fails (strict: each must fail until fixed). Empty: every class holds
#: (the rules: docs/external.md §3, "The proof").
XFAIL: dict[str, str] = {}


class SpecMismatch(AssertionError):
    """A case ended otherwise than the spec says: the one failure a class's xfail mark expects
    (a fixture or export that breaks is a plain failure, never an expected one)."""


def _params() -> list[Any]:
    """Every case (the first of each class and its controls by default, the rest slow)."""
    for case in CASES:
        adv_oracle.expected(case)  # a case too close to call is a corpus bug: fail at collection
    return adv_corpus.per_class_params(
        CASES, marks=lambda case: ([pytest.mark.xfail(strict=True, raises=SpecMismatch,
                                                      reason=XFAIL[case.klass])]
                                   if case.klass in XFAIL else []))


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adv-home")


def _resolve(home: Path, env: dict[str, str]) -> device_table.DeviceReport:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XSTAGE_HOME", str(home))
        mp.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
        for name, value in env.items():
            mp.setenv(name, value)
        return device_table.devices()


@pytest.fixture(scope="module")
def onnx_report(module_home: Path, openvino_python: Path,
                py39_ort119_python: Path) -> device_table.DeviceReport:
    """The machine's table, resolved once: ort-openvino in its test env, ort-cpu on onnxruntime 1.19."""
    report = _resolve(module_home, {"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python),
                                    "XSTAGE_PYTHON_ORT_CPU": str(py39_ort119_python)})
    for route in ("ort-openvino", "ort-cpu"):
        assert report.route(route).resolved, report.route(route).reason
    return report


@pytest.fixture(scope="module")
def torch_report(module_home: Path, export_python: Path) -> device_table.DeviceReport:
    report = _resolve(module_home, {"XSTAGE_PYTHON_TORCH_CPU": str(export_python)})
    assert report.route("torch-cpu").resolved, report.route("torch-cpu").reason
    return report


def simulated(report: device_table.DeviceReport, device_type: str) -> device_table.DeviceReport:
    """``report`` plus an Intel iGPU row that ort-openvino drives with ``device_type``."""
    igpu = hw.Device(id=adv_corpus.IGPU, kind="gpu_integrated", vendor="intel",
                     name="Intel(R) Graphics (simulated)", pool="host_ram", memory_bytes=0,
                     available_bytes=0, sources=("simulated by tests/adversarial",))
    ov = report.route("ort-openvino")
    plugin = dict(ov.ep_plugin or {})
    plugin["device_options"] = {**dict(plugin.get("device_options") or {}),
                                igpu.id: {"device_type": device_type}}
    ov = dataclasses.replace(ov, devices=(*ov.devices, igpu.id), ep_plugin=plugin)
    routes = tuple(ov if r.name == ov.name else r for r in report.routes)
    rows = device_table.assemble([row.device for row in report.devices] + [igpu], routes)
    return device_table.DeviceReport(devices=rows, routes=routes, host=report.host)


@pytest.fixture(scope="module")
def torch_artifacts(export_python: Path, tmp_path_factory: pytest.TempPathFactory,
                    pytestconfig: pytest.Config) -> dict[str, Any]:
    """The program of every torch case this run takes, exported once by the export env."""
    from tests.conftest import run_slow

    root = tmp_path_factory.mktemp("adv-torch")
    spec = [{"name": c.id, "kind": c.torch_kind, "ops": list(c.torch_ops), "shape": list(c.torch_shape)}
            for c in adv_corpus.default_cases(CASES, run_slow(pytestconfig)) if c.torch_kind is not None]
    script = Path(__file__).with_name("torch_programs.py")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    # kept in the test cache while the spec and the code it runs are unchanged (tests/runcache.py)
    done = runcache.run(export_python, [str(script), str(runcache.input_file(json.dumps(spec))), "{out}"],
                        root, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclasses.dataclass
class Observed:
    exit_code: int
    record: dict[str, Any] | None
    stderr: str

    @property
    def refusal(self) -> dict[str, Any] | None:
        refusals = ((self.record or {}).get("outcome") or {}).get("refusals") or []
        return refusals[-1] if refusals else None

    @property
    def proof(self) -> dict[str, Any] | None:
        if self.refusal and self.refusal.get("code") == "execution_provider_declined_graph":
            return self.refusal.get("evidence")
        return (self.record or {}).get("proof")

    @property
    def placed(self) -> bool:
        """The tool claimed the stage ran on its device (exit 0, or placed then gated)."""
        return bool(self.proof and self.proof.get("verdict") == "placed")


def _find(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for item in doc:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def run_case(case: adv_corpus.Case, graph: Path, report: device_table.DeviceReport, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Observed:
    monkeypatch.setattr("xstage.stage.open.device_report", lambda: report)
    record = tmp_path / "record.json"
    argv = ["external", "--graph", str(graph), "--route", case.route,
            "--min-placement", str(case.min_placement), "--runs", "1", "--json", str(record)]
    argv += ["--device", case.planned_device]  # with a simulated iGPU, a pinned route would prefer it
    for key, value in case.ep_options.items():
        argv += ["--ep-option", f"{key}={value}"]
    capsys.readouterr()
    code = cli_main(argv)
    err = capsys.readouterr().err
    return Observed(code, json.loads(record.read_text()) if record.exists() else None, err)


@pytest.mark.parametrize("case", _params())
def test_case(case: adv_corpus.Case, request: pytest.FixtureRequest, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    want = adv_oracle.expected(case)
    if case.torch_kind is not None:
        report = request.getfixturevalue("torch_report")
        built = request.getfixturevalue("torch_artifacts")[case.id]
        assert "path" in built, f"{case.id}: the export env could not export it: {built.get('error')}"
        graph = Path(built["path"])
    else:
        report = request.getfixturevalue("onnx_report")
        if case.simulated_igpu_device_type is not None:
            report = simulated(report, case.simulated_igpu_device_type)
        graph = builtin_graphs.write(adv_corpus.build_onnx(case), tmp_path / "stage.onnx")
    got = run_case(case, graph, report, tmp_path, monkeypatch, capsys)

    cause = (got.refusal or {}).get("cause")
    verdict = (got.proof or {}).get("verdict")
    checks = {
        "exit code": got.exit_code == want.exit_code,
        "record written": (got.record is not None) == want.record,
        "cause": cause == want.cause if want.record else True,
        "verdict": verdict == want.verdict if want.verdict is not None else True,
        "names": all(text in got.stderr for text in want.names),
        "no traceback": "Traceback" not in got.stderr,
    }
    if want.cause == "device_mismatch" and got.record is not None:
        attestation = _find(got.record, "device_attestation") or {}
        checks["device_attestation"] = (attestation.get("planned") == case.planned_device
                                        and attestation.get("observed") == "cpu")
    false_placed = got.placed and want.verdict != "placed"
    # Counted for the table where the report arrives (tests/conftest.py), with pytest-xdist too.
    request.node.user_properties.append(
        ("adv_tally", (case.klass, all(checks.values()) and not false_placed, false_placed,
                       case.klass in XFAIL)))
    shown = {k: (got.proof or {}).get(k) for k in ("basis", "fraction", "node_fraction", "time_fraction")}
    where = (f"seed {SEED} case {case.id} ({case.describe}, min_placement {case.min_placement}): "
             f"expected exit {want.exit_code} {want.verdict}/{want.cause} (nodes {want.node_fraction}, "
             f"time {want.time_fraction}); got exit {got.exit_code} {verdict}/{cause}, proof "
             f"{shown}"
             f"\nstderr: {got.stderr[-1500:]}")
    if false_placed:
        raise SpecMismatch("FALSE PLACED: " + where)
    if not all(checks.values()):
        raise SpecMismatch(f"failed {[k for k, ok in checks.items() if not ok]}: " + where)


def test_construction_matches_what_openvino_takes(openvino_python: Path, tmp_path: Path) -> None:
    """The corpus's truth is its construction: check it against onnxruntime's own plan (no xstage
    code), so a new OpenVINO that takes or declines other ops shows up here, not as a wrong oracle."""
    built = {}
    for case in CASES:
        if case.route == "ort-openvino" and case.torch_kind is None:
            path = builtin_graphs.write(adv_corpus.build_onnx(case), tmp_path / f"{case.id}.onnx")
            built[str(path)] = case
    (tmp_path / "graphs.json").write_text(json.dumps(sorted(built)))
    script = Path(__file__).with_name("ov_assignment.py")
    done = subprocess.run([str(openvino_python), str(script), str(tmp_path / "graphs.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    plans = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = []
    for path, case in built.items():
        on_ov = set(plans[path].get(adv_corpus.OV, []))
        listed = {name for names in plans[path].values() for name in names}
        taken = {n.name for n in case.nodes if n.taken}
        if on_ov != taken or listed != {n.name for n in case.nodes}:
            wrong.append(f"{case.id}: built {sorted(taken)} for OpenVINO, its plan {plans[path]}")
    assert not wrong, f"seed {SEED}: " + "\n".join(wrong)
