"""Binary call frames between a real client and a real worker (docs/wire.md, "Binary call
frames"): agreed in the hello, used for ``run``/``result`` on the socketpair and over the
authenticated TCP path, and JSON frames kept with a worker that does not list them.
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest

from tests.client.conftest import IDENTITY_IO, identity_inputs
from xstage import builtin_graphs
from xstage.client import WorkerClient
from xstage_remote import wire


def _tap(w: WorkerClient) -> list[bool]:
    """Record, for every frame the client reads from now on, whether it was binary. Over TCP
    the channel reads every frame, a lean call's reply against its expectation (``wire._Expect``
    comes back: a binary frame)."""
    seen: list[bool] = []
    if w.link.channel is not None:
        channel_recv = w.link.channel.recv

        def channel_tapped(*args, **kw):  # type: ignore[no-untyped-def]
            got = channel_recv(*args, **kw)
            seen.append(True if isinstance(got, wire._Expect) else got.fast)
            return got

        w.link.channel.recv = channel_tapped  # type: ignore[method-assign]
        return seen
    recv = w.recv

    def tapped(*args, **kw):  # type: ignore[no-untyped-def]
        frame = recv(*args, **kw)
        seen.append(frame.fast)
        return frame

    w.recv = tapped  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_calls_travel_as_binary_frames_and_compute_the_same(graphs, transport: str) -> None:
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable, shm_mode="off", transport=transport) as w:
        assert "fast-frames" in w.hello["features"]
        w.load(graphs["mlp"])
        seen = _tap(w)
        for _ in range(3):
            np.testing.assert_array_equal(w.run({"x": x})["y"], ref)
        futures = [w.submit({"x": x}) for _ in range(2)]  # the queued inline path too
        for f in futures:
            np.testing.assert_array_equal(f.result(timeout=60)["y"], ref)
        assert seen == [True] * 5
        assert w.last_timing["worker_ns"] > 0 and w.last_timing["peak"] > 0
        assert w.ping()["rss"] > 0  # other ops keep their JSON frames on the same stream
        assert seen[-1] is False


def test_every_dtype_and_shape_class_round_trips_in_binary_frames(graphs) -> None:
    feeds = identity_inputs()
    with WorkerClient(sys.executable, shm_mode="off", transport="tcp") as w:
        w.load(graphs["identity"])
        seen = _tap(w)
        out = w.run(feeds)
        assert seen == [True]
    for name, *_ in IDENTITY_IO:
        got, value = out[f"{name}_out"], feeds[name]
        assert got.dtype == value.dtype and got.shape == value.shape and \
            got.tobytes() == value.tobytes(), name


def test_big_endian_inputs_convert_at_the_boundary(graphs) -> None:
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable, shm_mode="off") as w:
        w.load(graphs["mlp"])
        np.testing.assert_array_equal(w.run({"x": x.astype(">f4")})["y"], ref)


@pytest.mark.parametrize("how", ["worker without the feature", "client turned off"])
def test_json_frames_are_kept_where_binary_ones_were_not_agreed(graphs, how: str) -> None:
    """A worker whose hello lacks ``fast-frames`` (one built before them) gets JSON ``run``
    frames and answers in JSON; so does a client with ``fast_frames`` off."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable, shm_mode="off", transport="tcp") as w:
        if how == "client turned off":
            w.fast_frames = False
        else:
            w.hello["features"] = [f for f in w.hello["features"] if f != "fast-frames"]
        w.load(graphs["mlp"])
        assert w.link.codec is None
        seen = _tap(w)
        np.testing.assert_array_equal(w.run({"x": x})["y"], ref)
        assert seen == [False]


def test_state_flags_travel_in_the_binary_header(tmp_path) -> None:
    path = builtin_graphs.write(builtin_graphs.accumulator(), tmp_path / "acc.onnx")
    x = np.arange(4, dtype=np.float32)
    with WorkerClient(sys.executable, shm_mode="off") as w:
        w.load(path, options={"state": [{"input": "h_in", "output": "h_out", "init": "zeros"}]})
        seen = _tap(w)
        first, second = w.run({"x": x}), w.run({"x": x})
        assert first.state_reset and not second.state_reset
        np.testing.assert_array_equal(second["y"], 2 * x)
        w.reset_state()
        third = w.run({"x": x})
        assert third.state_reset and list(third) == ["y"]
        np.testing.assert_array_equal(third["y"], x)
        assert seen == [True] * 3


def test_a_binary_frame_before_any_load_ends_the_worker(graphs) -> None:
    """A binary frame the worker did not agree to (no signature loaded) is a protocol error:
    the worker exits 65 naming it, it never guesses names."""
    with WorkerClient(sys.executable, shm_mode="off") as w:
        codec = wire.FastCodec(["x"], ["y"])
        w.link.io.sock.sendall(b"".join(bytes(memoryview(p).cast("B")) for p in wire.encode_fast(
            codec, "run", 99, 1, {"x": np.zeros(2, np.float32)})))
        assert w._proc.wait(timeout=30) == 65
    assert "binary frame (XSB1) where this end expects JSON" in w.log_tail()


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_a_python39_worker_speaks_binary_frames(py39_ort119_python, graphs, transport: str) -> None:
    """The worker side is Python 3.9 + numpy 1.x: same frames, same numbers, big-endian
    inputs converted at the boundary."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(str(py39_ort119_python), shm_mode="off", transport=transport) as w:
        assert w.hello["worker"]["versions"]["python"].startswith("3.9.")
        w.load(graphs["mlp"])
        seen = _tap(w)
        np.testing.assert_allclose(w.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(w.run({"x": x.astype(">f4")})["y"], ref, rtol=1e-5, atol=1e-5)
        assert seen == [True, True]


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_repeated_calls_take_the_kept_frame_and_keep_every_check(graphs, transport: str) -> None:
    """The lean call (``WorkerClient._call_lean``: a signature's kept frame, id packed in):
    same numbers as the long way; an input off the signature (not C-contiguous, another dtype,
    big-endian) goes the long way, which converts or names it; a reply to another request
    fails closed."""
    from xstage import errors

    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    sess = ort.InferenceSession(str(graphs["mlp"]))
    with WorkerClient(sys.executable, shm_mode="off", transport=transport) as w:
        w.load(graphs["mlp"])
        seen = _tap(w)
        for i in range(3):
            np.testing.assert_array_equal(w.run({"x": x + i})["y"], sess.run(None, {"x": x + i})[0])
        assert w.link.lane is not None and seen == [True] * 3
        wide = np.zeros((8, 512), np.float32)
        wide[:, ::2] = x
        np.testing.assert_array_equal(w.run({"x": wide[:, ::2]})["y"], sess.run(None, {"x": x})[0])
        np.testing.assert_array_equal(w.run({"x": x.astype(">f4")})["y"], sess.run(None, {"x": x})[0])
        with pytest.raises(errors.InputError, match="x"):
            w.run({"x": x.astype(np.float64)})
        np.testing.assert_array_equal(w.run({"x": x})["y"], sess.run(None, {"x": x})[0])
        # (over TCP the reply is read by the channel: asked for a Frame, not the expectation)
        recv = w.recv if w.link.channel is None else w.link.channel.recv

        def another(*args, **kw):  # type: ignore[no-untyped-def]
            kw.pop("expect", None)
            frame = recv(*args, **kw)
            frame.header["id"] += 1
            return frame

        if w.link.channel is None:
            w.recv = another  # type: ignore[method-assign]
        else:
            w.link.channel.recv = another  # type: ignore[method-assign]
        with pytest.raises(errors.RemoteProtocolError, match="expected result #"):
            w.run({"x": x})
        with pytest.raises(errors.StageClosed):
            w.run({"x": x})
