"""``logs/`` is pruned at each worker's start: the newest ``N`` logs, none older than ``D``
days (``XSTAGE_LOG_KEEP``, default ``100,30d``); a live worker's log is never taken."""

from __future__ import annotations

import os
import time

import pytest

from xstage import home, open_stage
from xstage.builtin_graphs import builtin_stage

DAY = 86400.0


def _logs(folder, ages_days):
    now = time.time()
    paths = []
    for i, age in enumerate(ages_days):
        path = folder / f"worker-ort-cpu-{i:04d}.log"
        path.write_text("x")
        os.utime(path, (now - age * DAY, now - age * DAY))
        paths.append(path)
    return paths


@pytest.mark.parametrize(("text", "parsed"), [
    ("100,30d", (100, 30.0)), ("5", (5, None)), ("7d", (None, 7.0)), ("0.5d, 3", (3, 0.5)),
    ("all", (None, None)), (" ALL ", (None, None)),
])
def test_the_format(text, parsed):
    assert home.log_keep(text) == parsed


@pytest.mark.parametrize("text", ["", "lots", "-1", "5,6", "1d,2d", "nand", "infd", "3x"])
def test_a_malformed_setting_names_itself_and_its_format(text):
    with pytest.raises(ValueError, match=r"XSTAGE_LOG_KEEP=.* is not N, Nd, N,Nd or all"):
        home.log_keep(text)


def test_the_default_keeps_the_newest_100_none_older_than_30_days(tmp_path):
    paths = _logs(tmp_path, [1 + i * 0.01 for i in range(120)] + [31, 45])
    gone = home.prune_logs(tmp_path, keep=home.log_keep(home.LOG_KEEP_DEFAULT))
    assert sorted(gone) == sorted(paths[100:])
    assert sorted(tmp_path.iterdir()) == sorted(paths[:100])


def test_age_alone_and_all(tmp_path):
    paths = _logs(tmp_path, [1, 2, 10, 40])
    assert home.prune_logs(tmp_path, keep=(None, None)) == []
    assert home.prune_logs(tmp_path, keep=(None, 5.0)) == paths[2:]


def test_a_log_written_in_the_last_minute_is_never_pruned(tmp_path):
    fresh = _logs(tmp_path, [0, 0, 0])
    assert home.prune_logs(tmp_path, keep=(1, None)) == []
    assert all(p.exists() for p in fresh)


def test_other_files_in_logs_are_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    _logs(tmp_path, [40])
    home.prune_logs(tmp_path, keep=(0, None))
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_worker_start_prunes(monkeypatch):
    """Seeded old logs, XSTAGE_LOG_KEEP=3: after one real worker started, 3 old ones and its own."""
    folder = home.logs_dir()
    old = _logs(folder, [2 + i for i in range(10)])
    monkeypatch.setenv("XSTAGE_LOG_KEEP", "3")
    # One worker: the reference arm in process (a reference worker would prune at its own start).
    with open_stage(builtin_stage(), route="ort-cpu", reference_arm="in_process"):
        pass
    left = sorted(folder.glob("worker-*.log"))
    assert [p for p in left if p in old] == old[:3]
    assert len(left) == 4  # its own beside them


def test_a_live_workers_log_is_never_pruned_however_old():
    """A worker that has run for days: its log is past every limit, and still in use; a dead
    worker's log of the same age goes, and so does the live one once its worker is gone."""
    import sys

    from xstage.client import WorkerClient

    with WorkerClient(sys.executable) as w:
        old = _logs(home.logs_dir(), [10])
        live = w.log_path
        assert live is not None
        past = time.time() - 10 * DAY
        os.utime(live, (past, past))
        assert home.prune_logs(keep=(0, 1.0)) == old
        assert live.exists()
        w.ping()  # the worker still serves, its log still there
    os.utime(live, (past, past))
    assert home.prune_logs(keep=(0, 1.0)) == [live]
