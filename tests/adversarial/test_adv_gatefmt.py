"""The numeric gate's adversarial classes (``adv_gatefmt``): zero false passes, zero false refusals.

Every run goes through the CLI's own ``main`` in this process with real workers: ``ort-cpu`` on
the onnxruntime 1.19 test env (its profile names the Q/DQ nodes of a quantized graph as the
proof reads them), ``torch-cpu`` in the export env. The seed is printed and repeatable
(``XSTAGE_ADV_SEED``); the default run takes one case of each class with its controls, ``slow``
(``--run-slow``) five. The construction tests check each case's truth with onnxruntime and
numpy alone: the random graphs differ between two runs of one session and their controls do
not; the bf16 MLP is off its fp32 twin by bf16's rounding; the bf16 state shows in the visible
output only from the third call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import adv_corpus
import adv_gatefmt
import numpy as np
import pytest
import runcache

from xstage import builtin_graphs, device_table
from xstage.cli.main import main as cli_main
from xstage.manifest import write_manifest

SEED = adv_corpus.seed_from_env()
CASES = adv_gatefmt.generate(SEED)
print(f"\ngate adversarial seed: {SEED} (set {adv_corpus.SEED_ENV}={SEED} to repeat)")


def _params() -> list[Any]:
    out = []
    for case in CASES:
        for k, run in enumerate(case.runs):
            marks = [pytest.mark.slow(reason=adv_corpus.FURTHER)] if case.ident >= 1 else []
            out.append(pytest.param(case, run, id=f"{case.id}-{k}-{run.role}-{run.graph}", marks=marks))
    return out


@pytest.fixture(scope="module", autouse=True)
def _print_table(request: pytest.FixtureRequest):
    yield
    if adv_gatefmt.RESULTS:  # the table of classes and counts, past pytest's capture
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n" + adv_gatefmt.table(SEED))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adv-gate-home")


@pytest.fixture(scope="module")
def onnx_report(home: Path, py39_ort119_python: Path) -> device_table.DeviceReport:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XSTAGE_HOME", str(home))
        mp.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
        mp.setenv("XSTAGE_PYTHON_ORT_CPU", str(py39_ort119_python))
        report = device_table.devices()
    assert report.route("ort-cpu").resolved, report.route("ort-cpu").reason
    return report


@pytest.fixture(scope="module")
def torch_report(home: Path, export_python: Path) -> device_table.DeviceReport:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XSTAGE_HOME", str(home))
        mp.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
        mp.setenv("XSTAGE_PYTHON_TORCH_CPU", str(export_python))
        report = device_table.devices()
    assert report.route("torch-cpu").resolved, report.route("torch-cpu").reason
    return report


@pytest.fixture(scope="module")
def torch_programs(export_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every ``nondet_torch`` case's two programs, exported once by the export env."""
    root = tmp_path_factory.mktemp("adv-gate-torch")
    spec = [{"name": f"{c.id}-{random}", "random": random == "random", **c.params}
            for c in CASES if c.klass == "nondet_torch" for random in ("random", "control")]
    script = Path(__file__).with_name("torch_random.py")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    # kept in the test cache while the spec and the code it runs are unchanged (tests/runcache.py)
    done = runcache.run(export_python, [str(script), str(runcache.input_file(json.dumps(spec))), "{out}"],
                        root, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quantized_mlp(params: dict[str, Any], folder: Path) -> Path:
    """The fp32 MLP through ``xstage quantize --scheme a16w8`` (a manifest names its source)."""
    source = builtin_graphs.write(adv_gatefmt.mlp_graph(params, bf16=False, pair=False),
                                  folder / "mlp.onnx")
    out = folder / "mlp.a16w8.onnx"
    code = cli_main(["quantize", str(source), str(out), "--scheme", "a16w8",
                     "--calibration-synthetic", "4", "-q"])
    assert code == 0 and out.is_file()
    return out


def build(case: adv_gatefmt.Case, key: str, folder: Path, request: pytest.FixtureRequest) -> Path:
    """The graph ``key`` of ``case`` written into ``folder`` (a state graph with its manifest)."""
    p = case.params
    if key in ("torch_random", "torch_control"):
        built = request.getfixturevalue("torch_programs")[f"{case.id}-{key.split('_')[1]}"]
        assert "path" in built, f"{case.id}: the export env could not export it: {built.get('error')}"
        return Path(built["path"])
    if key == "mlp_a16w8":
        return _quantized_mlp(p, folder)
    models = {
        "random": lambda: adv_gatefmt.random_graph(p, deterministic=False),
        "random_control": lambda: adv_gatefmt.random_graph(p, deterministic=True),
        "mlp": lambda: adv_gatefmt.mlp_graph(p, bf16=False, pair=False),
        "mlp_bf16": lambda: adv_gatefmt.mlp_graph(p, bf16=True, pair=False),
        "mlp_bf16_pair": lambda: adv_gatefmt.mlp_graph(p, bf16=True, pair=True),
        "mlp_bf16_pair8": lambda: adv_gatefmt.mlp_graph(p, bf16=True, pair=True, bits=8),
        "state_bf16": lambda: adv_gatefmt.state_graph(p, bf16=True),
        "state_exact": lambda: adv_gatefmt.state_graph(p, bf16=False),
    }
    path = builtin_graphs.write(models[key](), folder / f"{key}.onnx")
    if key.startswith("state_"):
        spec = {"dtype": "float32", "shape": [p["n"]]}
        write_manifest(path, component="shift", fmt="onnx:fp32", files=[path], source={"kind": "test"},
                       exporter={"xstage": "test"}, opset=adv_gatefmt.OPSET,
                       inputs=[{"name": n, **spec} for n in ("x", "p_in", "q_in")],
                       outputs=[{"name": n, **spec} for n in ("y", "p_out", "q_out")],
                       state=adv_gatefmt.STATE_PAIRS)
    return path


@pytest.mark.parametrize(("case", "run"), _params())
def test_run(case: adv_gatefmt.Case, run: adv_gatefmt.Run, request: pytest.FixtureRequest,
             tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    want = adv_gatefmt.expected(case, run)
    report = request.getfixturevalue("torch_report" if run.route == "torch-cpu" else "onnx_report")
    graph = build(case, run.graph, tmp_path / "stage", request)
    monkeypatch.setattr("xstage.stage.open.device_report", lambda: report)
    record = tmp_path / "record.json"
    argv = ["external", "--graph", str(graph), "--route", run.route, "--runs", "1",
            "--json", str(record)]
    if run.reference:
        argv += ["--reference", str(build(case, run.reference, tmp_path / "reference", request))]
    if run.tolerance:
        argv += ["--tolerance", run.tolerance]
    capsys.readouterr()
    code = cli_main(argv)
    err = capsys.readouterr().err
    doc = json.loads(record.read_text()) if record.exists() else {}
    refusal = ((doc.get("outcome") or {}).get("refusals") or [{}])[-1]
    parity = doc.get("parity") or (refusal.get("evidence") or {}).get("parity") or {}
    determinism = parity.get("determinism") or {}
    checks = {
        "exit code": code == want.exit_code,
        "cause": refusal.get("cause") in want.causes if want.exit_code == 2 else True,
        "record says nondeterministic": (determinism.get("nondeterministic") is True) == want.nondeterministic
        or (want.exit_code == 2 and "nondeterministic" in want.causes),
        "parity format": want.parity_format is None or parity.get("format") == want.parity_format,
        "no traceback": "Traceback" not in err,
    }
    if "nondeterministic" in want.causes and run.route != "torch-cpu":
        checks["names the random op"] = case.params["op"] in refusal.get("message", "")
    false_pass = code == 0 and want.exit_code != 0
    false_refusal = code != 0 and want.exit_code == 0
    adv_gatefmt.tally(case.klass, as_expected=all(checks.values()), false_pass=false_pass,
                      false_refusal=false_refusal)
    where = (f"seed {SEED} case {case.id} ({case.describe}) run {run.role}/{run.graph}: expected "
             f"exit {want.exit_code} {want.causes}; got exit {code} {refusal.get('cause')}; parity "
             f"{parity.get('summary')}\nstderr: {err[-1500:]}")
    assert not false_pass, "FALSE PASS: " + where
    assert not false_refusal, "FALSE REFUSAL: " + where
    assert all(checks.values()), f"failed {[k for k, ok in checks.items() if not ok]}: " + where


# --------------------------------------------------------------------------- the truth, built


def _session(model: Any) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("case", [c for c in CASES if c.klass == "nondet_onnx"], ids=lambda c: c.id)
def test_the_random_graphs_differ_between_two_runs_and_their_controls_do_not(case):
    x = {"x": np.random.default_rng(0).standard_normal((case.params["rows"], case.params["cols"]))
         .astype(np.float32)}
    for deterministic in (False, True):
        session = _session(adv_gatefmt.random_graph(case.params, deterministic))
        first, second = session.run(None, x), session.run(None, x)
        same = all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
        assert same == deterministic, f"{case.id}: deterministic={deterministic}, runs equal: {same}"


@pytest.mark.parametrize("case", [c for c in CASES if c.klass == "format"], ids=lambda c: c.id)
def test_the_bf16_mlp_is_off_its_fp32_twin_by_bf16s_rounding(case):
    p = case.params
    x = {"x": np.random.default_rng(1).standard_normal((p["batch"], p["width"])).astype(np.float32)}
    (exact,) = _session(adv_gatefmt.mlp_graph(p, bf16=False, pair=False)).run(None, x)
    (paired,) = _session(adv_gatefmt.mlp_graph(p, bf16=False, pair=True)).run(None, x)
    for pair in (False, True):
        (got,) = _session(adv_gatefmt.mlp_graph(p, bf16=True, pair=pair)).run(None, x)
        assert 5e-4 < _rel(got, exact) < 3e-2, (case.id, pair, _rel(got, exact))
    assert _rel(paired, exact) < 5e-5  # the pair alone rounds at 2^-16: 10x under fp32's tolerance


@pytest.mark.parametrize("case", [c for c in CASES if c.klass == "state"], ids=lambda c: c.id)
def test_the_bf16_state_shows_in_the_visible_output_only_from_the_third_call(case):
    n = case.params["n"]
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    runs = {}
    for bf16 in (False, True):
        session, state, calls = _session(adv_gatefmt.state_graph(case.params, bf16=bf16)), {}, []
        state = {"p_in": np.zeros(n, np.float32), "q_in": np.zeros(n, np.float32)}
        for _ in range(3):
            y, p, q = session.run(None, {"x": x, **state})
            calls.append((y, p))
            state = {"p_in": p, "q_in": q}
        runs[bf16] = calls
    for k in (0, 1):
        assert np.array_equal(runs[True][k][0], runs[False][k][0])  # visible: the same
    assert 5e-4 < _rel(runs[True][0][1], runs[False][0][1]) < 1e-2  # the state: bf16's rounding
    assert _rel(runs[True][2][0], runs[False][2][0]) > 1e-4  # visible from the third call
