"""Zero false gate passes, zero false refusals: the gate's adversarial classes, run for real.

Cases come from ``adv_gate`` (seeded: ``XSTAGE_ADV_SEED`` repeats a run; the seed is printed at
the start and in the table at the end), their truth from its construction (``adv_gate.expected``,
no code shared with ``xstage.parity`` or ``xstage.evidence``). Each variant runs through the
CLI's own ``main`` in this process: ``xstage external --graph STAGE --reference REFERENCE
--route ort-cpu``, a real worker on this interpreter's onnxruntime. The default run takes one
case of each class with its attacks and controls; ``--run-slow`` takes
``adv_gate.PER_CLASS_SLOW`` cases a class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import adv_corpus
import adv_gate
import numpy as np
import onnx
import pytest

from xstage import builtin_graphs, device_table
from xstage.cli.main import main as cli_main

SEED = adv_corpus.seed_from_env()
print(f"\nadversarial gate seed: {SEED} (set {adv_corpus.SEED_ENV}={SEED} to repeat)")


def _params() -> list[Any]:
    out = []
    for case in adv_gate.generate(SEED, adv_gate.PER_CLASS_SLOW):
        marks = [pytest.mark.slow(reason=adv_corpus.FURTHER)] if case.ident != "0" else []
        for variant, _ in adv_gate.VARIANTS[case.klass]:
            out.append(pytest.param(case, variant, id=f"{case.id}-{variant}", marks=marks))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> device_table.DeviceReport:
    """The machine's table, resolved once (ort-cpu on this interpreter)."""
    home = tmp_path_factory.mktemp("adv-gate-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XSTAGE_HOME", str(home))
        mp.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
        resolved = device_table.devices()
    assert resolved.route("ort-cpu").resolved, resolved.route("ort-cpu").reason
    return resolved


@pytest.fixture(scope="module", autouse=True)
def _table(request: pytest.FixtureRequest) -> None:
    """The classes and their counts, written once the run is over (after pytest's summary)."""
    config = request.config

    def write() -> None:
        writer = config.pluginmanager.get_plugin("terminalreporter")
        if adv_gate.RESULTS and writer is not None:
            writer.write_line("\n" + adv_gate.table(SEED))

    config.add_cleanup(write)


def _run(case: adv_gate.Case, variant: str, report: device_table.DeviceReport, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict | None, str]:
    reference = builtin_graphs.write(adv_gate.build(case, variant, reference=True),
                                     tmp_path / "reference.onnx")
    stage = builtin_graphs.write(adv_gate.build(case, variant), tmp_path / "stage.onnx")
    np.savez(tmp_path / "x.npz", **adv_gate.inputs(case, variant))
    monkeypatch.setattr("xstage.stage.open.device_report", lambda: report)
    record = tmp_path / "record.json"
    argv = ["external", "--graph", str(stage), "--reference", str(reference), "--route", "ort-cpu",
            "--inputs", str(tmp_path / "x.npz"), "--runs", "1", "--warmup", "1", "--json", str(record)]
    capsys.readouterr()
    code = cli_main(argv)
    err = capsys.readouterr().err
    return code, json.loads(record.read_text()) if record.exists() else None, err


def _parity(doc: dict | None) -> dict:
    if doc is None:
        return {}
    refusals = (doc.get("outcome") or {}).get("refusals") or []
    if refusals and refusals[-1].get("code") == "numeric_gate_failed":
        return (refusals[-1].get("evidence") or {}).get("parity") or {}
    return doc.get("parity") or {}


@pytest.mark.parametrize(("case", "variant"), _params())
def test_gate_case(case: adv_gate.Case, variant: str, report, tmp_path, monkeypatch, capsys) -> None:
    want_exit, want_code = adv_gate.expected(case.klass, variant)
    truth = dict(adv_gate.VARIANTS[case.klass])[variant]
    code, doc, err = _run(case, variant, report, tmp_path, monkeypatch, capsys)
    refusals = ((doc or {}).get("outcome") or {}).get("refusals") or []
    got_code = refusals[-1].get("code") if refusals else None
    ok = code == want_exit and got_code == want_code and doc is not None and "Traceback" not in err
    false_pass = truth == adv_gate.REFUSE and code == 0
    false_refusal = truth == adv_gate.PASS and code != 0
    adv_gate.tally(case.klass, truth, as_expected=ok, false_pass=false_pass, false_refusal=false_refusal)
    gate = _parity(doc)
    tb = gate.get("tiebreak") or {}
    where = (f"seed {SEED} {case.id}-{variant} ({case.describe}): expected exit {want_exit} {want_code}, "
             f"got exit {code} {got_code}; gate {gate.get('summary')!r}; tie-break {tb.get('status')} "
             f"{tb.get('reason_code') or ''}\nstderr: {err[-1500:]}")
    assert not false_pass, "FALSE GATE PASS: " + where
    assert not false_refusal, "FALSE REFUSAL: " + where
    assert ok, where


def test_the_nonfinite_reference_has_no_finite_float64_element(tmp_path) -> None:
    """The construction checked without xstage's gate: fp32 (onnxruntime) computes the Sqrt
    term as 0, float64 (numpy on the same constants) as NaN."""
    import onnxruntime as ort

    (case,) = adv_gate.generate(SEED, 1)[1:2]
    assert case.klass == "gate_nonfinite"
    model = adv_gate.build(case, "bf16", reference=True)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, adv_gate.inputs(case, "bf16"))
    assert np.isfinite(y).all()
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    a, c = consts["nan_a"].astype(np.float64), consts["nan_c"].astype(np.float64)
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.sqrt(a * a - c)).all()
