"""Adversarial artifact classes: the bytes that ran must be the bytes hashed (docs/external.md §1).

Two classes, cases generated from a seed; the truth of each case comes from its construction:
the weights the test wrote and where, the moment the adversary acts, and ``hashlib`` over the
bytes that were in place when xstage read them. Nothing here imports xstage.

* ``symlinked_graph``: ``link/g.onnx`` is a symlink to ``target/g.onnx``; both folders hold a
  sidecar ``w.bin`` with different weights. The stage runs the target's graph, so its numbers
  are the target's and the record's hash is the target's files'. Variants: the graph file is a
  link (``file_link``), a relative link to a link in a third folder with its own sidecar
  (``chain_link``); controls: no link at all (``plain``, runs), the folder is the link (``folder_link``:
  beside the link is beside the target, runs), and a target with no sidecar of its own while the
  link's folder has one (``target_lacks_sidecar``: an ``ArtifactError``, exit 1, never a run of
  the link's weights).
* ``swapped_after_hash``: the adversary changes the graph or its sidecar once xstage has hashed
  it, ordered by a hook that runs right after the hash (never a sleep): a new graph renamed over
  the old (``graph_renamed``), a new sidecar renamed over the old (``sidecar_renamed``), the
  sidecar rewritten in place (``sidecar_in_place``). The run must use the hashed bytes (exit 0,
  the original numbers, the original hash). Controls: nothing swapped (``no_swap``, runs), and
  the sidecar grown in place while it is being copied (``sidecar_while_copied``: an
  ``ArtifactError``, exit 1).
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED_ENV = "XSTAGE_ADV_SEED"
N = 4  # x is [1, N], W is [N, N]

CLASSES: dict[str, dict[str, tuple[str, ...]]] = {
    "symlinked_graph": {"cases": ("file_link", "chain_link"),
                        "controls": ("plain", "folder_link", "target_lacks_sidecar")},
    "swapped_after_hash": {"cases": ("graph_renamed", "sidecar_renamed", "sidecar_in_place"),
                           "controls": ("no_swap", "sidecar_while_copied")},
}
#: Variants whose truth is an ArtifactError (exit 1): everything else runs (exit 0).
REFUSED = {"target_lacks_sidecar", "sidecar_while_copied"}


@dataclass
class Case:
    """One case: its class, variant and seed; ``built`` fills the paths and the truth."""

    klass: str
    variant: str
    seed: int
    id: str = ""
    graph: Path | None = None  # what the user passes to --graph
    sidecar: Path | None = None  # the sidecar the adversary acts on (swap class)
    truth_weight: np.ndarray | None = None
    truth_sha256: str | None = None
    truth_path: Path | None = None  # the graph's real path, which the record names
    other: dict[str, bytes] = field(default_factory=dict)  # the adversary's bytes

    @property
    def exit_code(self) -> int:
        """0: it runs the hashed bytes; 1: an ArtifactError."""
        return 1 if self.variant in REFUSED else 0


def seed_from_env() -> int:
    """``XSTAGE_ADV_SEED`` or a fresh seed (printed by the test module so a run repeats)."""
    raw = os.environ.get(SEED_ENV)
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def generate(seed: int, *, slow: bool) -> list[Case]:
    """Per class: one seeded case and the controls; ``slow``: the cases the slow run adds,
    every variant with 2 seeds and the controls again with other seeds (at least 5 per class)."""
    rng = random.Random(seed * 2 + slow)
    out: list[Case] = []
    for klass, spec in CLASSES.items():
        if slow:
            picks = [(v, rng.randrange(1, 2**31)) for v in spec["cases"] for _ in range(2)]
        else:
            picks = [(rng.choice(spec["cases"]), rng.randrange(1, 2**31))]
        picks += [(v, rng.randrange(1, 2**31)) for v in spec["controls"]]
        for i, (variant, case_seed) in enumerate(picks):
            out.append(Case(klass, variant, case_seed,
                            id=f"{'slow-' if slow else ''}{klass}-{variant}-{i}"))
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_sha(named: list[tuple[str, bytes]]) -> str:
    """docs/external.md's artifact hash: one file, its sha256; several, over names and hashes."""
    if len(named) == 1:
        return sha(named[0][1])
    total = hashlib.sha256()
    for name, data in named:
        total.update(name.encode() + b"\0" + sha(data).encode() + b"\0")
    return total.hexdigest()


def _model(weight: np.ndarray | None) -> onnx.ModelProto:
    """y = x @ W; ``weight`` None leaves W to be written as external data by the caller."""
    w = numpy_helper.from_array(np.zeros((N, N), np.float32) if weight is None
                                else weight.astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "adv_artifact",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def write_external(folder: Path, weight: np.ndarray) -> Path:
    """``folder/g.onnx`` with W in ``folder/w.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    model = _model(weight)
    onnx.save_model(model, str(folder / "g.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    os.utime(folder / "w.bin", (1_000_000_000, 1_000_000_000))  # a write later moves it, surely
    return folder / "g.onnx"


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two weight matrices far apart (so the numbers say which ran)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = (a + 3.0 + rng.standard_normal((N, N))).astype(np.float32)
    return a, b


def build(case: Case, root: Path) -> Case:
    """Write the case's files under ``root`` and its truth from what was written."""
    mine, theirs = _weights(case.seed)
    if case.klass == "symlinked_graph":
        return _build_link(case, root, mine, theirs)
    graph = write_external(root / "stage", mine)
    case.graph = graph
    case.sidecar = root / "stage" / "w.bin"
    case.truth_weight = mine
    case.truth_path = graph.resolve()
    case.truth_sha256 = files_sha([("g.onnx", graph.read_bytes()), ("w.bin", case.sidecar.read_bytes())])
    write_external(root / "other", theirs)
    case.other = {"graph": _inline_graph_bytes(theirs),  # needs no sidecar: its W is inside it
                  "sidecar": (root / "other" / "w.bin").read_bytes()}
    return case


def _inline_graph_bytes(weight: np.ndarray) -> bytes:
    """A graph whose W lives inside it: the swapped-in graph needs no sidecar."""
    return _model(weight).SerializeToString()


def _build_link(case: Case, root: Path, mine: np.ndarray, theirs: np.ndarray) -> Case:
    target = write_external(root / "target", mine)
    case.truth_weight = mine
    case.truth_path = target.resolve()
    case.truth_sha256 = files_sha([("g.onnx", target.read_bytes()),
                                   ("w.bin", (root / "target" / "w.bin").read_bytes())])
    if case.variant == "plain":
        case.graph = target
        return case
    if case.variant == "folder_link":
        (root / "link").symlink_to(root / "target", target_is_directory=True)
        (root / "decoy").mkdir()  # the link's own parent holds a decoy beside it
        write_external(root / "decoy", theirs)
        case.graph = root / "link" / "g.onnx"
        return case
    link_folder = root / "link"
    write_external(link_folder, theirs)  # the link's folder: other weights beside it
    (link_folder / "g.onnx").unlink()
    if case.variant == "chain_link":  # link -> ../middle/g.onnx -> target, middle's own sidecar
        write_external(root / "middle", (theirs * 2).astype(np.float32))
        (root / "middle" / "g.onnx").unlink()
        (root / "middle" / "g.onnx").symlink_to(target)
        (link_folder / "g.onnx").symlink_to(Path("..") / "middle" / "g.onnx")
        case.graph = link_folder / "g.onnx"
        return case
    (link_folder / "g.onnx").symlink_to(target)
    if case.variant == "target_lacks_sidecar":
        (root / "target" / "w.bin").unlink()
        case.truth_weight = case.truth_sha256 = None
    case.graph = link_folder / "g.onnx"
    return case


def swap(case: Case) -> None:
    """The adversary's act right after the hash (the ``swapped_after_hash`` class)."""
    assert case.graph is not None and case.sidecar is not None
    if case.variant == "graph_renamed":
        tmp = case.graph.with_name(".g.onnx.new")
        tmp.write_bytes(case.other["graph"])
        os.replace(tmp, case.graph)
    elif case.variant == "sidecar_renamed":
        tmp = case.sidecar.with_name(".w.bin.new")
        tmp.write_bytes(case.other["sidecar"])
        os.replace(tmp, case.sidecar)
    elif case.variant == "sidecar_in_place":
        with open(case.sidecar, "r+b") as f:
            f.write(case.other["sidecar"])


def grow_in_place(case: Case) -> None:
    """The ``sidecar_while_copied`` act: the sidecar grows while its copy is being read."""
    assert case.sidecar is not None
    with open(case.sidecar, "ab") as f:
        f.write(case.other["sidecar"])


def truth_outputs(case: Case, x: np.ndarray) -> np.ndarray | None:
    """y = x @ W for the weights that must run (float64), or None for an ArtifactError."""
    if case.variant in REFUSED or case.truth_weight is None:
        return None
    return x.astype(np.float64) @ case.truth_weight.astype(np.float64)
