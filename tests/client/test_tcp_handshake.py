"""The TCP handshake between a real client and a real worker that do not share a secret."""

from __future__ import annotations

import sys

import pytest

from xstage import errors
from xstage.client import Deadlines, WorkerClient


def test_a_client_without_the_workers_secret_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker checks the client's proof too: a wrong one ends the worker (status 65, the
    check in its log) and the client names it, with the log to read."""
    w = WorkerClient(sys.executable, transport="tcp", deadlines=Deadlines(spawn=20, hello=20))
    accept = w._accept

    def with_another_secret(listener):  # type: ignore[no-untyped-def]
        w._secret = "0" * 32  # not the line the worker read on its stdin
        return accept(listener)

    monkeypatch.setattr(w, "_accept", with_another_secret)
    with pytest.raises(errors.RemoteProtocolError, match="no peer completed the connect-back "
                       "handshake and the worker exited with status 65") as info:
        w.start()
    assert "handshake check failed (proof): the client does not prove" in w.log_tail()
    assert info.value.remedy and str(w.log_path) in info.value.remedy
    w.close()


def test_both_ends_use_the_record_size_the_workers_hello_announced(tmp_path) -> None:
    """The worker announces its records' size in its hello (covered by both proofs); the
    client's channel takes it, and a 1 MiB call travels in records of that size both ways."""
    import numpy as np

    from xstage import builtin_graphs
    from xstage_remote import wire

    with WorkerClient(sys.executable, transport="tcp") as w:
        announced = w.hello["record_bytes"]
        assert announced == wire.check_record_bytes(announced)
        assert w.link.channel.chunk_bytes == announced
        graph = builtin_graphs.write(builtin_graphs.slice_graph(1 << 18, 1 << 18),
                                     tmp_path / "slice-1mib.onnx")
        w.load(graph)
        x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
        np.testing.assert_array_equal(w.run({"x": x})["y"], x)


@pytest.mark.parametrize("value", [0, 3 << 16, 1 << 30, "262144", True, None])
def test_a_record_size_off_the_range_is_refused_by_name(value) -> None:
    from xstage_remote import wire

    with pytest.raises(wire.ProtocolError, match="record_bytes"):
        wire.check_record_bytes(value)
