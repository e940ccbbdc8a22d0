"""A real worker in a real interpreter computes what onnxruntime computes in-process."""

from __future__ import annotations

import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest

from tests.client.conftest import IDENTITY_IO, identity_inputs
from xstage import errors
from xstage.client import WorkerClient, WorkerState


@pytest.mark.parametrize("shm_mode", ["auto", "named", "off"])
def test_mlp_matches_in_process_onnxruntime(graphs, shm_mode):
    """Every transport returns exactly what an in-process session returns."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable, shm_mode=shm_mode) as w:
        w.load(graphs["mlp"])
        assert (w.link.region is not None) == (shm_mode != "off")
        ys = []
        for _ in range(3):
            ys.append(w.run({"x": x})["y"])
            np.testing.assert_array_equal(ys[-1], ref)
        # Owned: C order, writable, and no later call writes where an earlier result lives
        # (an inline reply's array is its frame's payload, which nothing else holds).
        y = ys[-1]
        assert y.flags.c_contiguous and y.flags.writeable
        assert not any(np.shares_memory(a, b) for a in ys for b in ys if a is not b)
        assert y.flags.owndata or shm_mode == "off"
        assert w.last_timing["worker_ns"] > 0 and w.last_timing["peak"] > 0


@pytest.mark.parametrize("shm_mode", ["auto", "off"])
def test_every_dtype_and_shape_class_round_trips_bit_exactly(graphs, shm_mode):
    """bool, int8..uint64, float16..64, 0-d, empty and symbolic shapes come back as sent."""
    feeds = identity_inputs()
    with WorkerClient(sys.executable, shm_mode=shm_mode) as w:
        loaded = w.load(graphs["identity"])
        assert [o["name"] for o in loaded["outputs"]] == [f"{n}_out" for n, *_ in IDENTITY_IO]
        out = w.run(feeds)
    assert list(out) == [f"{n}_out" for n, *_ in IDENTITY_IO]
    for name, value in feeds.items():
        got = out[f"{name}_out"]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name


def test_data_dependent_output_falls_back_inline_on_the_shared_path(graphs):
    """An output whose size depends on the data has no slot; the call still returns it."""
    x = np.zeros((4, 4), np.float32)
    x[1, 2] = x[3, 0] = 1.0
    with WorkerClient(sys.executable) as w:
        w.load(graphs["dynamic"])
        assert w.link.region.has("in", "x") and w.link.region.has("out", "same")
        assert not w.link.region.has("out", "nz")
        out = w.run({"x": x})
        assert out["nz"].tolist() == [[1, 3], [2, 0]] and out["nz"].dtype == np.int64
        np.testing.assert_array_equal(out["same"], x)
        x[0, 0] = 2.0  # and again, with a different size
        assert w.run({"x": x})["nz"].shape == (2, 3)


def test_symbolic_input_dimension_runs_inline(graphs):
    """No slot can be sized for a symbolic input: every call goes inline, any size."""
    with WorkerClient(sys.executable) as w:
        w.load(graphs["symbolic"])
        assert w.link.region is None
        for n in (1, 5, 0):
            x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
            np.testing.assert_array_equal(w.run({"x": x})["y"], -x)


def test_non_contiguous_inputs_arrive_exactly(graphs):
    """Transposed and strided views are sent as their values, in C order."""
    base = np.arange(48, dtype=np.float32).reshape(4, 12)
    x = identity_inputs()
    x["f32"] = base[:, ::2].T  # (6, 4), neither C nor F contiguous
    assert not x["f32"].flags.c_contiguous
    for mode in ("auto", "off"):
        with WorkerClient(sys.executable, shm_mode=mode) as w:
            w.load(graphs["identity"])
            np.testing.assert_array_equal(w.run(x)["f32_out"], x["f32"])


def test_out_buffers_are_filled_in_place(graphs):
    """``out=`` receives the result without a new allocation."""
    x = np.ones(4096, np.float32)
    target = np.empty(1024, np.float32)
    with WorkerClient(sys.executable) as w:
        w.load(graphs["slice"])
        y = w.run({"x": x}, out={"y": target})["y"]
    assert y is target and (target == 1).all()


def test_wrong_out_buffer_is_an_input_error(graphs):
    with WorkerClient(sys.executable) as w:
        w.load(graphs["slice"])
        with pytest.raises(errors.InputError, match=r"out\['y'\] is float64"):
            w.run({"x": np.ones(4096, np.float32)}, out={"y": np.empty(1024)})


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": np.ones(4096, np.float64)}, "input 'x' is float64, the stage expects float32"),
        ({"x": np.ones(4095, np.float32)}, r"input 'x' has shape \(4095,\), the stage expects \(4096,\)"),
        ({"x": np.ones((4096, 1), np.float32)}, "has shape"),
        ({}, r"missing \['x'\]"),
        ({"x": np.ones(4096, np.float32), "z": np.ones(1)}, r"unexpected \['z'\]"),
        ({"x": np.array(["a"] * 4096)}, "input 'x' is <U1"),
    ],
)
def test_inputs_that_do_not_match_are_refused_by_name(graphs, feeds, message):
    """Never a silent cast: the error names what the stage expects; the worker stays usable."""
    with WorkerClient(sys.executable) as w:
        w.load(graphs["slice"])
        with pytest.raises(errors.InputError, match=message):
            w.run(feeds)
        assert w.run({"x": np.ones(4096, np.float32)})["y"].shape == (1024,)


def test_a_repeated_signature_skips_the_checks_and_nothing_else(graphs, monkeypatch):
    """Through the region, a call of the signature last accepted as it was skips
    ``_check_inputs`` (``run``'s known signature); any other input is checked, converted or
    refused by name as before, and a new load forgets the signature."""
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    with WorkerClient(sys.executable) as w:
        w.load(graphs["slice"])
        assert w.link.region is not None
        checked = []
        real = w._check_inputs
        monkeypatch.setattr(w, "_check_inputs", lambda inputs: checked.append(1) or real(inputs))
        for _ in range(3):
            np.testing.assert_array_equal(w.run({"x": x})["y"], x[:1024])
        assert len(checked) == 1
        for feeds, message in [({"x": np.ones(4095, np.float32)}, "has shape"),
                               ({"x": x.astype(np.float64)}, "is float64"),
                               ({"x": x, "z": x}, "unexpected")]:
            with pytest.raises(errors.InputError, match=message):
                w.run(feeds)
        big = x.astype(">f4")  # converted at the boundary every time, never skipped
        for _ in range(2):
            np.testing.assert_array_equal(w.run({"x": big})["y"], x[:1024])
        np.testing.assert_array_equal(w.run({"x": list(x)})["y"], x[:1024])
        before = len(checked)
        np.testing.assert_array_equal(w.run({"x": x})["y"], x[:1024])
        assert len(checked) == before + 1  # the signature last accepted was the list's
        w.load(graphs["mlp"])
        with pytest.raises(errors.InputError, match="the stage expects"):
            w.run({"x": x})


def test_worker_exception_comes_back_with_its_traceback(tmp_path):
    """A corrupt graph makes the worker raise; the client says so and the worker lives on."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with WorkerClient(sys.executable) as w:
        with pytest.raises(errors.WorkerRaised) as info:
            w.load(bad)
        assert info.value.kind and "Traceback" in info.value.remote_traceback
        assert w.state is WorkerState.READY and "rss" in w.ping()


def test_calls_from_many_threads_are_serialized(graphs):
    """Concurrent callers each get their own answer."""
    sess = ort.InferenceSession(str(graphs["mlp"]))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((8, 256)).astype(np.float32) for _ in range(8)]
    refs = [sess.run(None, {"x": x})[0] for x in xs]
    failures = []
    with WorkerClient(sys.executable) as w:
        w.load(graphs["mlp"])

        def work(i: int) -> None:
            for _ in range(20):
                if not np.array_equal(w.run({"x": xs[i]})["y"], refs[i]):
                    failures.append(i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


def test_close_is_idempotent_and_start_runs_once(graphs):
    w = WorkerClient(sys.executable)
    w.start()
    with pytest.raises(errors.StageClosed, match="start it only once"):
        w.start()
    w.close()
    w.close()
    assert w.state is WorkerState.CLOSED
    with pytest.raises(errors.StageClosed, match="closed"):
        w.run({"x": np.ones(1)})


def test_hello_names_the_interpreter_and_its_versions():
    with WorkerClient(sys.executable) as w:
        h = w.hello
    assert h["worker"]["versions"]["onnxruntime"] == ort.__version__
    assert h["worker"]["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "shm-memfd" in h["features"]


def test_missing_interpreter_is_a_clear_error(tmp_path):
    w = WorkerClient(str(tmp_path / "no-such-python"), route="ort-cpu")
    with pytest.raises(errors.WorkerError, match="could not start the ort-cpu interpreter") as info:
        w.start()
    assert "XSTAGE_PYTHON_ORT_CPU" in info.value.remedy
    assert w.state is WorkerState.DEAD


def test_tcp_connect_back_transport_runs_inline(graphs):
    """The transport a Windows worker uses from WSL, exercised on loopback: same numbers."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable, transport="tcp") as w:
        w.load(graphs["mlp"])
        assert w.link.region is None and w.link.bell is None
        np.testing.assert_array_equal(w.run({"x": x})["y"], ref)


def test_fit_region_gives_symbolic_stages_a_shared_path(graphs):
    """No slot can be sized at load for a symbolic input; fit_region sizes them from real
    tensors, later calls of that size use the region, and a larger call still goes inline."""
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    with WorkerClient(sys.executable) as w:
        w.load(graphs["symbolic"])
        assert w.link.region is None
        first = w.run({"x": x})
        assert w.fit_region({"x": x, **first}) is True
        assert w.link.region.has("in", "x") and w.link.region.has("out", "y")
        assert w.fit_region({"x": x}) is True  # already fits: no new region
        region = w.link.region
        np.testing.assert_array_equal(w.run({"x": x})["y"], -x)
        assert w.link.region is region
        big = np.ones((50, 2), np.float32)
        np.testing.assert_array_equal(w.run({"x": big})["y"], -big)  # inline, still right
        w.fit_region({"x": big})
        assert w.link.region is not region
        np.testing.assert_array_equal(w.run({"x": big})["y"], -big)
        np.testing.assert_array_equal(w.run({"x": x})["y"], -x)
