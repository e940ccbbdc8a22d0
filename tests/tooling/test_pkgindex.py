"""The offline verdict behind the ``network`` marker: its cheap causes, and the skip it gives."""

from __future__ import annotations

import pkgindex
import pytest


@pytest.fixture(autouse=True)
def _fresh_verdict(monkeypatch: pytest.MonkeyPatch):
    """Each test asks anew, and leaves the session's cached verdict as it found it."""
    monkeypatch.delenv("XSTAGE_OFFLINE", raising=False)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    pkgindex.unreachable.cache_clear()
    yield
    pkgindex.unreachable.cache_clear()


def test_xstage_offline_says_so(monkeypatch):
    monkeypatch.setenv("XSTAGE_OFFLINE", "1")
    assert pkgindex.unreachable() == "XSTAGE_OFFLINE=1 is set"


@pytest.mark.parametrize(("value", "offline"), [("1", True), ("yes", True), ("0", False), ("false", False)])
def test_pip_no_index_says_so(monkeypatch, value, offline):
    monkeypatch.setenv("PIP_NO_INDEX", value)
    monkeypatch.setattr(pkgindex.subprocess, "run", _pip_answers(0))
    assert pkgindex.unreachable() == ("PIP_NO_INDEX is set" if offline else None)


def test_pip_failing_is_unreachable_with_its_words(monkeypatch):
    monkeypatch.setattr(pkgindex.subprocess, "run", _pip_answers(1, "ERROR: No matching distribution"))
    assert pkgindex.unreachable() == (
        "pip could not reach its package index (pip index versions pip: ERROR: No matching distribution)")


def test_pip_too_slow_is_unreachable(monkeypatch):
    def slow(cmd, **kw):
        raise pkgindex.subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(pkgindex.subprocess, "run", slow)
    assert pkgindex.unreachable() == (
        "pip did not reach its package index within 15 s (pip index versions pip)")


def test_require_skips_naming_what_and_why(monkeypatch):
    monkeypatch.setenv("XSTAGE_OFFLINE", "1")
    with pytest.raises(pytest.skip.Exception, match="building X needs the package index, .*XSTAGE_OFFLINE=1"):
        pkgindex.require("building X")


def _pip_answers(code: int, stderr: str = ""):
    def run(cmd, **kw):
        assert kw["timeout"] <= pkgindex.CHECK_S
        return pkgindex.subprocess.CompletedProcess(cmd, code, "", stderr)

    return run
