"""The bytes that ran are the bytes hashed: ``adv_artifact``'s classes through ``xstage external``.

Each case runs through the CLI's own ``main`` in this process on ``ort-cpu`` (onnxruntime 1.19 on
Python 3.9, a real worker), with ``--inputs`` fixed and ``--save-outputs``, so its numbers and its
record are compared with the truth its construction gives (``adv_artifact``: numpy and hashlib
only). The adversary of ``swapped_after_hash`` acts in a hook that runs right after xstage has
hashed the artifact (``open_stage``'s call of ``inspect_artifact`` returns), or while the copy
is being read (``sidecar_while_copied``): ordered by the code, never by a clock. The default run
takes one seeded case and the controls per class; ``--run-slow`` at least five per class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import adv_artifact
import adv_corpus
import numpy as np
import pytest

from xstage import device_table, snapshot
from xstage.cli.main import main as cli_main
from xstage.stage import open as open_mod

SEED = adv_artifact.seed_from_env()
print(f"\nadversarial artifact seed: {SEED} (set {adv_artifact.SEED_ENV}={SEED} to repeat)")
DEFAULT = {c.id for c in adv_artifact.generate(SEED, slow=False)}
ALL = {c.id: c for c in [*adv_artifact.generate(SEED, slow=False), *adv_artifact.generate(SEED, slow=True)]}


def _params() -> list[Any]:
    return [pytest.param(case, id=case_id, marks=[] if case_id in DEFAULT
                         else [pytest.mark.slow(reason=adv_corpus.FURTHER)])
            for case_id, case in ALL.items()]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, py39_ort119_python: Path) -> device_table.DeviceReport:
    """The device table with ort-cpu in the Python 3.9 env, resolved once."""
    home = tmp_path_factory.mktemp("adv-artifact-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XSTAGE_HOME", str(home))
        mp.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
        mp.setenv("XSTAGE_PYTHON_ORT_CPU", str(py39_ort119_python))
        table = device_table.devices()
    assert table.route("ort-cpu").resolved, table.route("ort-cpu").reason
    return table


def _arm(case: adv_artifact.Case, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Put the adversary where its variant acts; returns what it did, in order."""
    acts: list[str] = []
    if case.klass != "swapped_after_hash" or case.variant == "no_swap":
        return acts
    if case.variant == "sidecar_while_copied":
        reflink = snapshot._reflink

        def copy_starts(src_fd: int, dst_fd: int) -> bool:
            import os

            if os.fstat(src_fd).st_ino == case.sidecar.stat().st_ino and not acts:
                adv_artifact.grow_in_place(case)
                acts.append("grown while copied")
            return reflink(src_fd, dst_fd)

        monkeypatch.setattr(snapshot, "_reflink", copy_starts)
        return acts
    hashed = open_mod.inspect_artifact

    def hashed_then_swapped(*args: Any, **kwargs: Any) -> Any:
        art = hashed(*args, **kwargs)
        adv_artifact.swap(case)
        acts.append(case.variant)
        return art

    monkeypatch.setattr(open_mod, "inspect_artifact", hashed_then_swapped)
    return acts


@pytest.mark.parametrize("case", _params())
def test_case(case: adv_artifact.Case, report: device_table.DeviceReport, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    adv_artifact.build(case, tmp_path / "case")
    x = np.random.default_rng(case.seed).standard_normal((1, adv_artifact.N)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    monkeypatch.setattr("xstage.stage.open.device_report", lambda: report)
    acts = _arm(case, monkeypatch)
    record, outputs = tmp_path / "record.json", tmp_path / "y.npz"
    pinned_before = snapshot.pinned()  # other tests of this process may hold theirs
    capsys.readouterr()
    code = cli_main(["external", "--graph", str(case.graph), "--route", "ort-cpu", "--device", "cpu",
                     "--inputs", str(tmp_path / "x.npz"), "--runs", "1", "--warmup", "0",
                     "--json", str(record), "--save-outputs", str(outputs)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert snapshot.pinned() == pinned_before, "the stage released its snapshots when it closed"
    if case.klass == "swapped_after_hash" and case.variant != "no_swap":
        assert acts, "the adversary never acted: the case tested nothing"
    truth = adv_artifact.truth_outputs(case, x)
    if truth is None:  # an ArtifactError: exit 1, no numbers from any bytes
        assert code == 1, err
        assert not outputs.exists()
        assert "changed while it was being copied" in err or "is missing" in err, err
        return
    assert code == 0, err
    doc = json.loads(record.read_text())
    assert doc["artifact"]["sha256"] == case.truth_sha256, "the record hashes other bytes"
    assert doc["artifact"]["path"] == str(case.truth_path)
    with np.load(outputs, allow_pickle=False) as saved:
        got = saved["y"].astype(np.float64)
    np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-5,
                               err_msg="the stage ran other weights than the ones hashed")
