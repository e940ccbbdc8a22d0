"""Processes on one ``XSTAGE_HOME`` taking artifact snapshots at once (``xstage.snapshot``).

Each test releases N processes together (``_race``): on one artifact (one folder made, every
process runs the bytes it hashed) and on different ones under a cap of 0 (eviction beside pins:
no process loses a snapshot it holds). Each must end with exit 0, no traceback, no staging
folder left.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.home._race import race

N = 5

_RUN = """
import numpy as np, onnxruntime as ort
from xstage.artifact import inspect_artifact
art = inspect_artifact(Path(sys.argv[3]) / "g{{}}.onnx".format({which}))
x = np.ones((1, 4), np.float32)
y = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"]).run(None, {{"x": x}})[0]
print(art.sha256, float(y[0, 0]))
"""


def _graph(folder: Path, name: str, scale: float) -> None:
    w = numpy_helper.from_array((np.eye(4) * scale).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(model, str(folder / name), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{name}.bin", size_threshold=0)


def _staging_left(home: Path) -> list[str]:
    root = home / "cache" / "artifacts"
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".")) if root.is_dir() else []


def _race(snippet: str, tmp_path: Path, home: Path, cap: str | None = None) -> list[str]:
    env = {"XSTAGE_HOME": str(home)}
    if cap is not None:
        env["XSTAGE_ARTIFACT_CACHE_BYTES"] = cap
    ends = race(snippet, N, tmp_path / "barrier", env=env)
    for end in ends:
        assert end.rc == 0 and "Traceback" not in end.err, end.err
    return [end.out.split() for end in ends]


def test_one_artifact_taken_by_every_process_at_once(tmp_path):
    _graph(tmp_path, "g0.onnx", 3.0)
    home = tmp_path / "home"
    outs = _race(_RUN.format(which="0").replace("sys.argv[3]", repr(str(tmp_path))), tmp_path, home)
    assert {tuple(o) for o in outs} == {(outs[0][0], "3.0")}
    folders = [p.name for p in (home / "cache" / "artifacts").iterdir()]
    assert folders == [outs[0][0]] and _staging_left(home) == []


def test_different_artifacts_under_a_cap_of_zero(tmp_path):
    """Every process evicts what it can while the others hold theirs: none loses its own."""
    for i in range(N):
        _graph(tmp_path, f"g{i}.onnx", float(i + 1))
    home = tmp_path / "home"
    snippet = _RUN.format(which="_me").replace("sys.argv[3]", repr(str(tmp_path)))
    outs = _race(snippet, tmp_path, home, cap="0")
    assert sorted(float(o[1]) for o in outs) == [float(i + 1) for i in range(N)]
    assert _staging_left(home) == []
