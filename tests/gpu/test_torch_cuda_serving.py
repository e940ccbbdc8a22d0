"""torch-cuda serving on a real GPU: the pinned region, the CUDA graph, the switches (docs/torch.md,
"Serving: the pinned region, one stream, CUDA graphs").

Every test here needs torch with a CUDA device and skips without one (this VM has none);
``scripts/gpu_check.py`` runs them all on the GPU host in one call. Each test exports its
own small program on the GPU, opens it through ``open_stage`` on ``torch-cuda`` and checks
the record and the outputs against the same program called in process.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable here (GPU tests)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here: scripts/gpu_check.py runs these on the GPU host",
                allow_module_level=True)

import xstage  # noqa: E402
from xstage.manifest import write_manifest  # noqa: E402


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 128)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))), x.sum(dim=1)


class _Detour(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 256)

    def forward(self, x):
        h = self.a(x)
        return torch.sin(h.to("cpu")).to("cuda") + h  # a host round trip: no graph captures it


def _export(module, path: Path, outputs, shape=(32, 256)):
    """``module`` on the GPU, exported to ``path`` with its manifest (one input ``x`` of
    ``shape``, float32); returns the module."""
    torch.manual_seed(0)
    module = module.cuda().eval()
    x = torch.randn(*shape, device="cuda")
    program = torch.export.export(module, (x,), strict=False)
    torch.export.save(program, str(path))
    with torch.no_grad():
        ys = module(x)
    ys = ys if isinstance(ys, tuple) else (ys,)
    write_manifest(path, component=path.stem, fmt="pt:fp32", files=[path],
                   source={"kind": "script", "what": "tests/gpu"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": list(shape)}],
                   outputs=[{"name": n, "dtype": "float32", "shape": list(y.shape)}
                            for n, y in zip(outputs, ys, strict=True)])
    return module


def _inproc(module, x):
    with torch.no_grad():
        ys = module(torch.from_numpy(x).cuda())
    ys = ys if isinstance(ys, tuple) else (ys,)
    return [y.cpu().numpy() for y in ys]


@pytest.fixture()
def mlp(tmp_path):
    path = tmp_path / "mlp.pt2"
    return path, _export(_Mlp(), path, ["y", "s"])


def test_serves_from_a_captured_graph_through_the_pinned_region(mlp):
    path, module = mlp
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False) as stage:
        rng = np.random.default_rng(1)
        for _ in range(3):  # fresh inputs each call: the graph's static inputs are refilled
            x = rng.standard_normal((32, 256), dtype=np.float32)
            got = stage({"x": x})
            want = _inproc(module, x)
            np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got["s"], want[1], rtol=1e-5, atol=1e-5)
        rec = stage.record()
        serving = stage._client.link.region  # depth 2: the region that replaced the gate's
        assert serving.n_sets == 2
    acc = rec["worker"]["accelerator"]
    assert acc["pinned_region"]["bytes"] == serving.size  # the record: the region it serves from
    assert acc["cuda_graph"]["state"] == "captured", acc
    assert acc["cuda_graph"]["pool_bytes"] >= 0 and "replay" in acc["cuda_graph"]["gated"]
    assert acc["pinned_region"]["state"] == "registered" and acc["pinned_region"]["is_pinned"]
    assert acc["stream"] == "dedicated" and acc["sync_per_call"] == 1
    assert rec["proof"]["verdict"] == "placed" and rec["parity"]["verdict"] == "passed"
    purposes = [r["purpose"] for r in rec["ledger"]["reservations"]]
    assert "cuda graph pool" in purposes
    assert 1.0 <= rec["ledger"]["budget_over_measured"] <= 2.0, rec["ledger"]
    host = rec["ledger"]["host_pinned"]  # the page-locked region, in host_ram
    assert host["pool"] == "host_ram" and host["state"] == "registered"
    assert host["measured_bytes"] == acc["pinned_region"]["bytes"]
    assert 1.0 <= host["budget_over_measured"] <= 2.0, host


def test_both_switches_off_serve_eager_from_pageable_memory(mlp):
    path, module = mlp
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False,
                           ep_options={"cuda_graphs": "off", "pinned_region": "off"}) as stage:
        x = np.random.default_rng(2).standard_normal((32, 256), dtype=np.float32)
        got = stage({"x": x})
        rec = stage.record()
    np.testing.assert_allclose(got["y"], _inproc(module, x)[0], rtol=1e-5, atol=1e-5)
    acc = rec["worker"]["accelerator"]
    assert acc["cuda_graph"]["state"] == "off" and acc["pinned_region"]["state"] == "off"
    assert "cuda graph pool" not in [r["purpose"] for r in rec["ledger"]["reservations"]]
    assert "host_pinned" not in rec["ledger"]  # nothing page-locked, nothing held for it
    assert any("cuda_graphs off" in n for n in rec["worker"]["notes"])


def test_a_capture_that_fails_serves_eager_with_a_note(tmp_path):
    path = tmp_path / "detour.pt2"
    module = _export(_Detour(), path, ["y"])
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False,
                           min_placement=0.001) as stage:  # sin on the host: a small share
        x = np.random.default_rng(3).standard_normal((32, 256), dtype=np.float32)
        got = stage({"x": x})
        rec = stage.record()
    np.testing.assert_allclose(got["y"], _inproc(module, x)[0], rtol=1e-5, atol=1e-5)
    graph = rec["worker"]["accelerator"]["cuda_graph"]
    assert graph["state"] == "failed" and graph["why"], graph
    assert any("capture failed" in n for n in rec["worker"]["notes"])


def test_the_region_registers_through_either_binding():
    """``cudaHostRegister`` on a memfd mapping like the region's: torch's binding, then ctypes."""
    from xstage_remote import cuda_serving

    fd = os.memfd_create("xstage-test")
    os.ftruncate(fd, 1 << 22)
    mm = mmap.mmap(fd, 1 << 22)
    base = np.frombuffer(mm, dtype=np.uint8)
    ptr = int(base.ctypes.data)
    how, error = cuda_serving.register_host(torch, ptr, base.nbytes)
    assert how is not None, error
    assert torch.from_numpy(base).is_pinned()
    cuda_serving.unregister_host(torch, ptr, how)
    lib = cuda_serving._cudart_ctypes()
    print("registered via", how, "; ctypes libcudart:", lib is not None)
    del base
    mm.close()
    os.close(fd)


class _Big(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).sum(dim=0), x[:4] + 1.0


def test_a_large_input_streams_into_the_graph_while_the_caller_copies(tmp_path):
    """A 4 MiB input is copied into the pinned region in announced chunks, and the worker
    queues their DMA while it waits (shm.py's "Streamed inputs"): fresh inputs every call give
    the in-process numbers (no byte of an earlier call's input survives), and the record says
    how many bytes went ahead of the request."""
    path = tmp_path / "big.pt2"
    module = _export(_Big(), path, ["s", "head"], shape=(1024, 1024))
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False, depth=1) as stage:
        rng = np.random.default_rng(2)
        for _ in range(20):
            x = rng.standard_normal((1024, 1024), dtype=np.float32)
            got = stage({"x": x})
            want = _inproc(module, x)
            np.testing.assert_allclose(got["s"], want[0], rtol=1e-5, atol=1e-3)
            np.testing.assert_array_equal(got["head"], want[1])
        rec = stage.record()
        pinned = stage._client.ping()["pinned_region"]  # as it serves now (the record: admission)
    print("pinned region:", pinned)
    assert rec["worker"]["accelerator"]["cuda_graph"]["state"] == "captured"
    assert pinned.get("streamed_bytes", 0) > 0, pinned
