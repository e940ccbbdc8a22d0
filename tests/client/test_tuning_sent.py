"""The client's transport tuning: built once per client, refused when malformed, sent in load."""

from __future__ import annotations

import sys

import pytest

from xstage import errors
from xstage.client import WorkerClient
from xstage_remote import tuning, wire


def test_load_carries_the_tuning_the_client_built(graphs, monkeypatch) -> None:
    """The worker is told the client's knobs in ``load`` (it reads them from there)."""
    monkeypatch.setenv("XSTAGE_SPIN_SECONDS", "0.001")
    sent: list[dict] = []
    with WorkerClient(sys.executable) as w:
        real = w._send

        def spy(header, arrays=None, phase="call"):
            sent.append(dict(header))
            return real(header, arrays, phase)

        monkeypatch.setattr(w, "_send", spy)
        w.load(graphs["identity"])
    (load,) = [h for h in sent if h["op"] == "load"]
    if "tuning" not in wire.OPS["load"]:  # a protocol without the field: not sent
        assert "tuning" not in load
        return
    assert load["tuning"] == w.tuning.to_wire()
    assert tuning.TransportTuning.from_wire(load["tuning"]).spin_seconds == 0.001


@pytest.mark.parametrize(("name", "value"), [("XSTAGE_SHM", "tmpfs"), ("XSTAGE_SPIN_SECONDS", "abc")])
def test_a_malformed_knob_is_refused_before_a_worker_starts(monkeypatch, name, value) -> None:
    monkeypatch.setenv(name, value)
    client = WorkerClient(sys.executable)
    with pytest.raises(errors.UsageError, match=f"{name}={value!r} is not .*: unset it or set e.g."):
        client.start()
    assert client.pid is None


def test_an_explicit_shm_mode_out_of_range_is_named() -> None:
    with pytest.raises(errors.UsageError, match="shm_mode='tmpfs' is not one of auto, memfd, named, off"):
        WorkerClient(sys.executable, shm_mode="tmpfs")
