"""Device tensors in, device tensors out on a real GPU (docs/torch.md, the section of that name).

A torch-cuda stage opened with ``--ep-option device_tensors=on`` takes CUDA tensors on its own
GPU: the worker's device slots (K sets) are exported once by CUDA IPC, a call copies device to
device into them and answers with views of its output slots. Skips without a CUDA device;
``scripts/gpu_check.py`` runs it on the GPU host.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable here (GPU tests)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here: scripts/gpu_check.py runs these on the GPU host",
                allow_module_level=True)

import xstage  # noqa: E402
from xstage import errors  # noqa: E402
from xstage.manifest import write_manifest  # noqa: E402

ON = {"device_tensors": "on"}


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 128)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))), x.sum(dim=1)


def _export(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False  # the worker computes fp32 strictly
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    module = _Mlp().cuda().eval()
    x = torch.randn(32, 256, device="cuda")
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, (x,), strict=False), str(path))
    with torch.no_grad():
        ys = module(x)
    write_manifest(path, component="mlp", fmt="pt:fp32", files=[path],
                   source={"kind": "script", "what": "tests/gpu"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [32, 256]}],
                   outputs=[{"name": n, "dtype": "float32", "shape": list(y.shape)}
                            for n, y in zip(["y", "s"], ys, strict=True)])
    return path, module


def _want(module, x):
    with torch.no_grad():
        return module(x)


def test_device_tensors_in_and_views_of_the_output_slots_out(tmp_path):
    path, module = _export(tmp_path)
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False, depth=1,
                           ep_options=ON) as stage:
        for seed in range(3):
            x = torch.randn(32, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            got = stage({"x": x})
            y, s = _want(module, x)
            assert got["y"].is_cuda and got["y"].device == x.device, got["y"].device
            torch.testing.assert_close(got["y"], y, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got["s"], s, rtol=1e-5, atol=1e-5)
        first = stage({"x": torch.ones(32, 256, device="cuda")})["s"]
        kept = first.clone()
        second = stage({"x": torch.zeros(32, 256, device="cuda")})["s"]
        # depth 1: one slot set, so the first view is the second call's output now
        assert first.data_ptr() == second.data_ptr()
        assert torch.equal(first, second) and not torch.equal(kept, second)
        host = stage({"x": np.ones((32, 256), np.float32)})  # host arrays still take the region
        assert isinstance(host["s"], np.ndarray)
        np.testing.assert_allclose(host["s"], kept.cpu().numpy(), rtol=1e-5)
        rec = stage.record()
    acc = rec["worker"]["accelerator"]
    assert acc["device_tensors"]["state"] == "exported", acc
    assert acc["device_tensors"]["sets"] == 1 and "_share_cuda_" in acc["device_tensors"]["via"]
    assert rec["request"]["ep_options"] == ON
    held = {r["purpose"]: r for r in rec["ledger"]["reservations"]}
    assert held["device slots"]["bytes"] >= acc["device_tensors"]["bytes"]
    assert held["device slots"]["pool"] != "host_ram"
    assert 1.0 <= rec["ledger"]["budget_over_measured"] <= 2.0, rec["ledger"]
    print("device slots:", acc["device_tensors"], "held", held["device slots"]["bytes"])


def test_closing_releases_the_device_slots_before_the_worker_ends(tmp_path):
    """The client drops its mapping of the worker's device buffer before asking it to end, so
    the worker (the producer) exits without torch's warning about tensors still shared."""
    path, _ = _export(tmp_path)
    stage = xstage.open_stage(path, route="torch-cuda", record_on_close=False, depth=1,
                              ep_options=ON)
    out = stage({"x": torch.ones(32, 256, device="cuda")})
    s = out["s"].clone()
    del out  # the caller keeps no view of the slots
    client = stage._client
    stage.close()
    assert client.pipeline.device is None or not client.pipeline.device.views
    assert torch.equal(s, torch.full_like(s, 256.0))
    assert "before all shared CUDA tensors released" not in client.log_tail(200)


def test_depth_two_keeps_a_view_until_the_request_two_later(tmp_path):
    path, module = _export(tmp_path)
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False, depth=2,
                           ep_options=ON) as stage:
        xs = [torch.full((32, 256), float(i), device="cuda") for i in range(4)]
        futures = [stage.submit({"x": x}) for x in xs[:2]]
        outs = [f.result() for f in futures]
        assert outs[0]["s"].data_ptr() != outs[1]["s"].data_ptr()  # two sets, two slots
        torch.testing.assert_close(outs[0]["s"], _want(module, xs[0])[1])
        torch.testing.assert_close(outs[1]["s"], _want(module, xs[1])[1])
        stage({"x": xs[2]})  # reuses set 0: outs[0] now holds request 3's output
        torch.testing.assert_close(outs[1]["s"], _want(module, xs[1])[1])
        torch.testing.assert_close(outs[0]["s"], _want(module, xs[2])[1])


def test_the_call_makes_no_host_device_copy_in_the_callers_process(tmp_path):
    """The profiler around device-tensor calls: device-to-device copies only, no HtoD/DtoH.

    The worker's side of the call is device to device by construction (``call_device`` reads
    and writes device slots only); its own profile is the warm-up's, not these calls'.
    """
    from torch.profiler import ProfilerActivity, profile

    path, _ = _export(tmp_path)
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False,
                           ep_options=ON) as stage:
        x = torch.randn(32, 256, device="cuda")
        stage({"x": x})
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                out = stage({"x": x})
            out["y"].sum().item()  # (one DtoH of a scalar, after the calls, outside them)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    copies = [n for n in names if "Memcpy" in n or "memcpy" in n]
    print("copies seen:", sorted(set(copies)))
    assert any("DtoD" in n for n in copies), copies
    assert sum("HtoD" in n for n in copies) == 0, copies
    assert sum("DtoH" in n for n in copies) <= 1, copies  # the .item() above


def test_inputs_written_in_place_are_not_copied_by_the_caller(tmp_path):
    """``Stage.device_inputs()``: the next call's input slots, filled by the caller; a call
    given them makes no copy at all in the caller's process (the profiler sees none)."""
    from torch.profiler import ProfilerActivity, profile

    path, module = _export(tmp_path)
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False,
                           ep_options=ON) as stage:
        slots = stage.device_inputs()
        assert list(slots) == ["x"] and slots["x"].is_cuda
        assert tuple(slots["x"].shape) == (32, 256) and slots["x"].dtype == torch.float32
        outs = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for seed in range(3):  # the first call takes the set reserved above (each
                x = (slots if seed == 0 else stage.device_inputs())["x"]  # reservation is one call's)
                x.normal_(generator=torch.Generator("cuda").manual_seed(seed))  # the producer
                got = stage({"x": x})
                outs.append((x.clone(), got["y"].clone(), got["s"].clone()))
            torch.cuda.synchronize()
        for x, y, s in outs:
            want_y, want_s = _want(module, x)
            torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
        assert not torch.equal(outs[0][0], outs[1][0])  # three different inputs
    copies = [e.name for e in prof.events() if "Memcpy" in e.name or "memcpy" in e.name]
    names = [e.name for e in prof.events()]
    print("copies seen with inputs in place:", sorted(set(copies)))
    # the clones above are this test's own DtoD copies (3 per call); the calls add none
    assert sum("DtoD" in n for n in copies if "Memcpy" in n) <= 9, copies
    assert not any("HtoD" in n or "DtoH" in n for n in copies), copies
    assert "aten::copy_" in names  # the profiler saw the clones: it watched this process


def test_device_inputs_hand_out_a_set_no_request_owns(tmp_path):
    """The attack of ``input_slots`` on ``device_inputs``: at depth 2, with both sets in flight
    (the worker stopped by SIGSTOP, so nothing is answered), a third ``device_inputs()`` must
    not return request 1's set: it waits for a free one, and each request answers its own
    fill. Ordered, not raced: the worker resumes only once the third caller waits (or, before
    the fix, has already written into request 1's set)."""
    import os
    import signal
    import threading

    path, module = _export(tmp_path)
    gen = torch.Generator("cuda").manual_seed(5)
    xs = [torch.randn(32, 256, device="cuda", generator=gen) for _ in range(3)]
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False, depth=2,
                           ep_options=ON) as stage:
        stage({"x": xs[0]})  # the device slots are open
        client = stage._client
        os.kill(stage.worker_pid, signal.SIGSTOP)
        futures, box = [], {}
        got, may_submit, done = threading.Event(), threading.Event(), threading.Event()
        try:
            for x in xs[:2]:
                slots = stage.device_inputs()
                slots["x"].copy_(x)
                futures.append(stage.submit(slots))
            with pytest.raises(errors.SlotsBusy):
                stage.device_inputs(timeout=0)  # both sets in flight: none is free

            def third() -> None:
                slots = stage.device_inputs()  # waits for a set to come free
                slots["x"].copy_(xs[2])
                got.set()
                may_submit.wait(120)  # the first answer is read before its set is used again
                box["fut"] = stage.submit(slots)
                done.set()

            threading.Thread(target=third, daemon=True).start()
            while not (got.is_set() or client.pipeline.slot_waiters):
                threading.Event().wait(0.001)
        finally:
            os.kill(stage.worker_pid, signal.SIGCONT)
        # outputs are views of their set's slots, valid until the request K submissions later
        # is submitted (docs/torch.md): the first two are read before the third is submitted
        answers = [fut.result(timeout=120)["y"].clone() for fut in futures]
        may_submit.set()
        assert done.wait(120)
        answers.append(box["fut"].result(timeout=120)["y"].clone())
        for got_y, x in zip(answers, xs, strict=True):
            y, s = _want(module, x)
            torch.testing.assert_close(got_y, y, rtol=1e-5, atol=1e-5)


def test_tensors_on_another_device_or_a_mix_are_usage_errors(tmp_path):
    path, _ = _export(tmp_path)
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False,
                           ep_options=ON) as stage:
        with pytest.raises(errors.UsageError, match="mixes CUDA tensors and host arrays"):
            stage({"x": torch.zeros(32, 256, device="cuda"), "z": np.zeros(1)})
        with pytest.raises(errors.InputError, match="float16"):
            stage({"x": torch.zeros(32, 256, device="cuda", dtype=torch.float16)})
        if torch.cuda.device_count() > 1:
            with pytest.raises(errors.UsageError, match="cuda:1"):
                stage({"x": torch.zeros(32, 256, device="cuda:1")})
    with xstage.open_stage(path, route="torch-cuda", record_on_close=False) as plain:
        with pytest.raises(errors.UsageError, match="without device tensors"):
            plain({"x": torch.zeros(32, 256, device="cuda")})


def test_the_workers_device_call_makes_no_host_device_copy(tmp_path):
    """The worker's half (``CudaServing.call_device``), run in this process under the profiler:
    slot to graph input, replay, graph output to slot; device-to-device copies only."""
    from torch.profiler import ProfilerActivity, profile

    from xstage_remote import torch_runtime

    path, module = _export(tmp_path)
    runtime = torch_runtime.load(str(path), {"device": "cuda:0", "profile": True,
                                             "fp32_strict": True, "device_tensors": "on",
                                             "output_names": ["y", "s"]})
    try:
        x = torch.randn(32, 256, device="cuda")
        runtime.run({"x": x.cpu().numpy()})  # the profiled warm-up, then the graph's capture
        assert runtime.cuda.info["cuda_graph"]["state"] == "captured"
        header, arrays = runtime.open_device_slots(2)
        assert header["sets"] == 2 and set(arrays) >= {"ipc_handle", "ipc_ref_counter_handle"}
        slots = runtime.cuda.slots.views
        slots[1]["in"][0].copy_(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                runtime.run_device(1)
            torch.cuda.synchronize()
        y, s = _want(module, x)
        torch.testing.assert_close(slots[1]["out"][0], y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(slots[1]["out"][1], s, rtol=1e-5, atol=1e-5)
    finally:
        runtime.close()
    copies = [e.name for e in prof.events() if "Memcpy" in e.name or "memcpy" in e.name]
    print("worker copies seen:", sorted(set(copies)))
    assert not any("HtoD" in n or "DtoH" in n for n in copies), copies
