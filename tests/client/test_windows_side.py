"""The Windows-side launch from WSL: the same client code, four differences, all checked.

No Windows machine is reachable from here, so the WSL inputs are recorded ones
(tests/fixtures/wsl) and the launch itself runs on this OS with the same keywords.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.recorded import load_fixture
from xstage import errors
from xstage.client import WorkerClient
from xstage.host.wsl import WslInfo
from xstage.routes.launch import windows_side_options

WSL = WslInfo(is_wsl=True, version=2, interop=True, distro="Ubuntu-24.04")


def test_windows_side_options_from_recorded_wsl_inputs():
    killed = []
    opts = windows_side_options(
        wsl=WSL, wsl_conf=load_fixture("wsl", "wsl.conf"), networking_mode="nat",
        ip_route=load_fixture("wsl", "ip-route-nat.txt"), kill=killed.append)
    assert opts["transport"] == "tcp"
    assert opts["connect_host"] == opts["listen_host"] and opts["connect_host"].count(".") == 3
    assert opts["worker_path"]("/home/me/stage.onnx") == r"\\wsl.localhost\Ubuntu-24.04\home\me\stage.onnx"
    opts["end_tree"](4242)
    assert killed == [["taskkill.exe", "/T", "/F", "/PID", "4242"]]


def test_mirrored_networking_listens_on_loopback():
    opts = windows_side_options(wsl=WSL, wsl_conf=None, networking_mode="mirrored",
                                ip_route=load_fixture("wsl", "ip-route-mirrored.txt"),
                                kill=lambda argv: None)
    assert opts["listen_host"] == opts["connect_host"] == "127.0.0.1"


def test_without_interop_it_is_a_named_refusal():
    with pytest.raises(errors.RouteMissing) as info:
        windows_side_options(wsl=WslInfo(is_wsl=True, version=2, interop=False), wsl_conf=None,
                             networking_mode="nat", ip_route="", kill=lambda argv: None)
    assert info.value.reason_code == "wsl_interop_unavailable"


def test_the_same_launch_path_maps_paths_and_ends_the_reported_tree(graphs, tmp_path):
    """tcp + a path map + a tree killer, run for real: every path the worker sees is mapped
    (here to a symlinked view of the same files) and the tree killer gets hello's pid."""
    view = tmp_path / "worker-view"
    view.symlink_to("/", target_is_directory=True)
    seen: list[str] = []

    def worker_path(p: str) -> str:
        seen.append(p)
        return str(view / os.path.relpath(p, "/"))

    ended: list[int] = []
    w = WorkerClient(sys.executable, transport="tcp", worker_path=worker_path,
                     end_tree=ended.append)
    w.start()
    w.load(graphs["slice"])
    assert w.run({"x": np.ones(4096, np.float32)})["y"].shape == (1024,)
    pid = w.hello["worker"]["pid"]
    w.close()
    assert ended == [pid]
    assert len(seen) == 2 and seen[1] == str(graphs["slice"])  # the staged package, then the graph
    assert Path(seen[0], "xstage_remote", "worker.py").is_file()
