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
