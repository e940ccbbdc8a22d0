"""One private snapshot per artifact: real paths, hashed copies, modes, pins, eviction, the CLI's view.

The truth of each hash comes from ``hashlib`` over the bytes the test wrote (the rule of
``docs/external.md``: one file, its sha256; several, a sha256 over each name and hash), never
from xstage's own hashing.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import errors, snapshot
from xstage.artifact import inspect_artifact, snapshot_graph
from xstage.host import wsl
from xstage.manifest import write_manifest
from xstage.stage.reference import make_reference

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def no_pins_left() -> None:
    """Each test starts and ends with no pin of this process (pins outlive a test's home)."""
    unpin_all()
    yield
    unpin_all()


def unpin_all() -> None:
    for folder, uses in snapshot.pinned().items():
        for _ in range(uses):
            snapshot.release(folder)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_sha(*named: tuple[str, bytes]) -> str:
    """The artifact hash of several files, from their names and bytes (the documented rule)."""
    total = hashlib.sha256()
    for name, data in named:
        total.update(name.encode() + b"\0" + sha(data).encode() + b"\0")
    return total.hexdigest()


def external_graph(folder: Path, weight: np.ndarray, name: str = "g.onnx",
                   location: str = "w.bin") -> Path:
    """y = x @ W with W in the sidecar ``location`` beside ``name``."""
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(weight.astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(model, str(folder / name), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=location, size_threshold=0)
    return folder / name


def run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_snapshot_is_a_private_hashed_copy_under_its_hash(tmp_path):
    path = external_graph(tmp_path / "a", np.eye(4) * 2)
    art = inspect_artifact(path)
    folder = Path(os.environ["XSTAGE_HOME"]) / "cache" / "artifacts" / art.sha256
    assert art.sha256 == files_sha(("g.onnx", path.read_bytes()),
                                   ("w.bin", (tmp_path / "a" / "w.bin").read_bytes()))
    assert art.path == folder / "g.onnx" and art.origin == path.resolve()
    assert art.to_dict()["path"] == str(path.resolve())  # the record names the user's graph
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    for name in ("g.onnx", "w.bin"):
        copy = folder / name
        assert stat.S_IMODE(copy.stat().st_mode) == 0o400
        assert copy.read_bytes() == (tmp_path / "a" / name).read_bytes()
        assert copy.stat().st_ino != (tmp_path / "a" / name).stat().st_ino  # a copy, not a link
    assert snapshot.pinned() == {folder: 1}
    art.release()
    assert snapshot.pinned() == {}
    assert not list(folder.parent.glob(".tmp-*"))


def test_a_symlinked_graph_is_its_target_with_the_targets_sidecar(tmp_path):
    """The link's folder holds other weights: they are neither hashed nor run."""
    target = external_graph(tmp_path / "target", np.eye(4) * 2)
    link_folder = tmp_path / "link"
    external_graph(link_folder, np.eye(4) * 3)
    (link_folder / "g.onnx").unlink()
    (link_folder / "g.onnx").symlink_to(target)
    art = inspect_artifact(link_folder / "g.onnx")
    assert art.origin == target.resolve()
    assert art.sha256 == files_sha(("g.onnx", target.read_bytes()),
                                   ("w.bin", (tmp_path / "target" / "w.bin").read_bytes()))
    assert [f["path"] for f in art.files] == [str(target.resolve()),
                                              str((tmp_path / "target" / "w.bin").resolve())]
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(run(art.path, x), x * 2)


def test_a_symlinked_graph_without_a_sidecar_beside_its_target_is_an_artifact_error(tmp_path):
    """The sidecar sits only beside the link: the graph that would run (the target) has none."""
    real = external_graph(tmp_path / "target", np.eye(4) * 2)
    (tmp_path / "target" / "w.bin").unlink()
    link_folder = tmp_path / "link"
    external_graph(link_folder, np.eye(4) * 3)
    (link_folder / "g.onnx").unlink()
    (link_folder / "g.onnx").symlink_to(real)
    with pytest.raises(errors.ArtifactError, match="external data file w.bin is missing"):
        inspect_artifact(link_folder / "g.onnx")
    assert snapshot.pinned() == {}


def test_the_snapshot_keeps_a_sidecars_folder_and_a_linked_sidecars_name(tmp_path):
    folder = tmp_path / "a"
    path = external_graph(folder, np.eye(4) * 5, location="weights/w.bin")
    art = inspect_artifact(path)
    assert (art.path.parent / "weights" / "w.bin").is_file()
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(run(art.path, x), x * 5)
    # a sidecar that is a link inside the folder: copied from its target, kept under its name
    other = external_graph(tmp_path / "b", np.eye(4) * 7, location="w.bin")
    os.replace(tmp_path / "b" / "w.bin", tmp_path / "b" / "real.bin")
    (tmp_path / "b" / "w.bin").symlink_to("real.bin")
    art_b = inspect_artifact(other)
    assert (art_b.path.parent / "w.bin").is_file() and not (art_b.path.parent / "w.bin").is_symlink()
    np.testing.assert_array_equal(run(art_b.path, x), x * 7)


def test_a_sidecar_link_out_of_the_folder_is_refused(tmp_path):
    path = external_graph(tmp_path / "a", np.eye(4))
    os.replace(tmp_path / "a" / "w.bin", tmp_path / "elsewhere.bin")
    (tmp_path / "a" / "w.bin").symlink_to(tmp_path / "elsewhere.bin")
    with pytest.raises(errors.ArtifactError, match="escapes the graph's folder"):
        inspect_artifact(path)


def test_writes_after_the_hash_never_reach_the_snapshot(tmp_path):
    """In place (a hard link would see it) and by a rename (a re-opened path would)."""
    path = external_graph(tmp_path / "a", np.eye(4) * 2)
    art = inspect_artifact(path)
    sidecar = tmp_path / "a" / "w.bin"
    with open(sidecar, "r+b") as f:  # in place: the same inode
        f.write(np.full((4, 4), 9, np.float32).tobytes())
    external_graph(tmp_path / "b", np.eye(4) * 4)
    os.replace(tmp_path / "b" / "g.onnx", path)  # a new graph renamed over the old one
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(run(art.path, x), x * 2)
    copied = {f.name: (art.snapshot.folder / f.name).read_bytes() for f in art.snapshot.files}
    assert files_sha(*copied.items()) == art.sha256


def test_a_source_written_while_it_is_copied_is_an_artifact_error(tmp_path, monkeypatch):
    """The write lands between the copy's open and its read (the reflink attempt's moment)."""
    path = external_graph(tmp_path / "a", np.eye(4))
    sidecar = tmp_path / "a" / "w.bin"

    def write_then_decline(src_fd: int, dst_fd: int) -> bool:
        if os.fstat(src_fd).st_ino == sidecar.stat().st_ino:
            with open(sidecar, "ab") as f:
                f.write(b"\0" * 16)
        return False

    monkeypatch.setattr(snapshot, "_reflink", write_then_decline)
    with pytest.raises(errors.ArtifactError, match="changed while it was being copied"):
        inspect_artifact(path)
    assert snapshot.pinned() == {}
    assert not list((Path(os.environ["XSTAGE_HOME"]) / "cache" / "artifacts").glob(".tmp-*"))


def test_a_source_that_became_a_symlink_is_not_followed(tmp_path):
    real = tmp_path / "real.bin"
    real.write_bytes(b"x" * 8)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    with snapshot.Staging() as staging, pytest.raises(errors.ArtifactError, match="became a symlink"):
        staging.add(link, "link.bin")


def test_the_reflink_attempt_falls_back_to_a_copy_here(tmp_path):
    """FICLONE where the filesystem has it; elsewhere (ext4, tmpfs) the plain copy, same hash."""
    data = os.urandom(3 << 20)
    (tmp_path / "blob.pt2").write_bytes(data)
    snap = snapshot_graph(tmp_path / "blob.pt2")
    assert snap.sha256 == sha(data) and snap.graph.read_bytes() == data
    snapshot.release(snap.folder)


def test_a_pt2_is_snapshotted_like_a_graph(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    program = folder / "tower.pt2"
    with zipfile.ZipFile(program, "w") as z:
        z.writestr("tower/data/version", "1")
    write_manifest(program, component="tower", fmt="pt:fp32", files=[program], source={},
                   exporter={}, inputs=[{"name": "x", "dtype": "float32", "shape": [1, 4]}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": [1, 4]}])
    (tmp_path / "link.pt2").symlink_to(program)
    art = inspect_artifact(tmp_path / "link.pt2")
    assert art.sha256 == sha(program.read_bytes()) and art.origin == program.resolve()
    assert art.path.parent.name == art.sha256 and art.path.name == "tower.pt2"
    assert stat.S_IMODE(art.path.stat().st_mode) == 0o400
    with open(program, "ab") as f:
        f.write(b"later")
    assert sha(art.path.read_bytes()) == art.sha256


def test_a_separate_reference_graph_is_snapshotted_too(tmp_path):
    stage = external_graph(tmp_path / "stage", np.eye(4) * 2)
    ref_path = external_graph(tmp_path / "ref", np.eye(4) * 3)
    art = inspect_artifact(stage)
    arm = make_reference(art, str(ref_path), {}, report=None)  # ONNX: no device report needed
    assert arm.snapshot is not None and arm.path.parent == arm.snapshot
    with open(tmp_path / "ref" / "w.bin", "r+b") as f:
        f.write(np.zeros((4, 4), np.float32).tobytes())
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(arm.outputs({"x": x})["y"], x * 3)
    assert snapshot.pinned() == {art.snapshot.folder: 1, arm.snapshot: 1}


def test_the_same_bytes_twice_share_one_folder_and_each_name_is_kept(tmp_path):
    data = b"program bytes"
    (tmp_path / "a.pt2").write_bytes(data)
    (tmp_path / "b.pt2").write_bytes(data)
    first, second = snapshot_graph(tmp_path / "a.pt2"), snapshot_graph(tmp_path / "b.pt2")
    assert first.folder == second.folder
    assert first.graph.read_bytes() == second.graph.read_bytes() == data
    assert sorted(p.name for p in first.folder.iterdir()) == ["a.pt2", "b.pt2"]
    assert snapshot.pinned() == {first.folder: 2}


def _three(tmp_path: Path) -> list[snapshot.Snapshot]:
    snaps = []
    for i in range(3):
        (tmp_path / f"s{i}.pt2").write_bytes(bytes([i]) * 1000)
        snaps.append(snapshot_graph(tmp_path / f"s{i}.pt2"))
        os.utime(snaps[-1].folder, (1_000_000 + i, 1_000_000 + i))  # use order, by construction
    return snaps


def test_eviction_takes_the_least_recently_used_first(tmp_path, monkeypatch):
    s0, s1, s2 = _three(tmp_path)
    for s in (s0, s1, s2):
        snapshot.release(s.folder)
    monkeypatch.setenv(snapshot.CACHE_BYTES_ENV, "2500")
    (tmp_path / "s3.pt2").write_bytes(b"\3" * 1000)
    s3 = snapshot_graph(tmp_path / "s3.pt2")
    assert not s0.folder.exists() and not s1.folder.exists()
    assert s2.folder.exists() and s3.folder.exists()


def test_eviction_never_takes_a_snapshot_in_use(tmp_path, monkeypatch):
    s0, s1, s2 = _three(tmp_path)  # s0 (the oldest) stays pinned
    snapshot.release(s1.folder)
    snapshot.release(s2.folder)
    monkeypatch.setenv(snapshot.CACHE_BYTES_ENV, "0")
    (tmp_path / "s3.pt2").write_bytes(b"\3" * 1000)
    s3 = snapshot_graph(tmp_path / "s3.pt2")
    assert s0.folder.exists() and s3.folder.exists()  # in use, and the one just made
    assert not s1.folder.exists() and not s2.folder.exists()
    removed, kept = snapshot.clear()
    assert sorted(kept) == sorted([s0.sha256, s3.sha256]) and removed == []


_HOLDER = """
import sys, time
from pathlib import Path
from xstage.artifact import snapshot_graph
snap = snapshot_graph(sys.argv[1])
Path(sys.argv[2]).write_text(snap.sha256)
until = time.monotonic() + 120
while not Path(sys.argv[3]).exists() and time.monotonic() < until:
    time.sleep(0.01)
"""


def test_another_processs_snapshot_in_use_is_never_evicted(tmp_path, monkeypatch):
    """A second process holds its pin (a shared flock) until told to end, through files."""
    if sys.platform == "win32":
        pytest.skip("pins across processes are flock's (POSIX)")
    (tmp_path / "held.pt2").write_bytes(b"held" * 100)
    ready, done = tmp_path / "ready", tmp_path / "done"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "held.pt2"), str(ready),
                              str(done)], env=env)
    try:
        until = time.monotonic() + 120  # a bound on the wait for the child's file, not a race
        while not (ready.exists() and ready.read_text()) and child.poll() is None \
                and time.monotonic() < until:
            time.sleep(0.01)
        held = ready.read_text()
        monkeypatch.setenv(snapshot.CACHE_BYTES_ENV, "0")
        (tmp_path / "new.pt2").write_bytes(b"new")
        snapshot.release(snapshot_graph(tmp_path / "new.pt2").folder)
        folder = snapshot.artifacts_dir() / held
        assert folder.is_dir()
        assert [s.in_use for s in snapshot.list_snapshots() if s.sha256 == held] == [True]
        assert snapshot.clear()[1] == [held]
    finally:
        done.write_text("")
        child.wait(timeout=120)
    assert child.returncode == 0
    removed, kept = snapshot.clear()
    assert held in removed and kept == []


def test_the_cap_reads_sizes_and_refuses_anything_else(monkeypatch):
    assert snapshot.cache_bytes("512MiB") == 512 << 20
    assert snapshot.cache_bytes("0") == 0
    monkeypatch.delenv(snapshot.CACHE_BYTES_ENV, raising=False)
    assert snapshot.cache_bytes() == snapshot.CACHE_BYTES_DEFAULT
    with pytest.raises(errors.UsageError, match="XSTAGE_ARTIFACT_CACHE_BYTES='lots' is not a size"):
        snapshot.cache_bytes("lots")


def test_a_relative_home_still_hands_workers_an_absolute_path(tmp_path, monkeypatch):
    path = external_graph(tmp_path / "a", np.eye(4))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XSTAGE_HOME", "relative-home")
    art = inspect_artifact(path)
    assert art.path.is_absolute() and art.path.is_relative_to(tmp_path.resolve() / "relative-home")


def test_a_windows_worker_started_from_wsl_is_handed_the_snapshot(tmp_path):
    """Under XSTAGE_HOME, in the Linux filesystem or on a drive: a path Windows can open."""
    path = external_graph(tmp_path / "a", np.eye(4))
    art = inspect_artifact(path)
    linux = wsl.to_windows_path(str(art.path), distro="Ubuntu")
    assert linux.startswith("\\\\wsl.localhost\\Ubuntu\\")
    assert linux.endswith(f"\\cache\\artifacts\\{art.sha256}\\g.onnx")
    drive = wsl.to_windows_path(f"/mnt/c/Users/me/xstage/cache/artifacts/{art.sha256}/g.onnx",
                                distro=None)
    assert drive == f"C:\\Users\\me\\xstage\\cache\\artifacts\\{art.sha256}\\g.onnx"


def test_a_one_shot_reader_releases_what_it_pinned_and_nothing_else(tmp_path):
    """``releasing``: the pins its thread took in the call go; another thread's stay."""
    (tmp_path / "kept.pt2").write_bytes(b"kept")
    (tmp_path / "read.pt2").write_bytes(b"read")
    others: list[snapshot.Snapshot] = []
    kept = threading.Thread(target=lambda: others.append(snapshot_graph(tmp_path / "kept.pt2")))

    @snapshot.releasing
    def reader() -> Path:
        kept.start()
        kept.join()
        return snapshot_graph(tmp_path / "read.pt2").graph

    assert reader().read_bytes() == b"read"
    assert snapshot.pinned() == {others[0].folder: 1}
