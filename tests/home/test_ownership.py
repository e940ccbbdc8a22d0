"""A home that is yours: created private, refused when another user made it first.

The attacks: another user (uid 65534 where the suite runs as root) creates ``XSTAGE_HOME``
first and plants a worker package under ``cache/remote/<hash>/`` (its name is predictable):
it used to run, as root, inside the worker. A staged package changed after it was staged used
to be trusted by its name. Records and logs used to be written readable by all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attacker import as_nobody, needs_root, shared_folder  # noqa: F401 (a fixture)
from xstage import errors, home
from xstage.client import WorkerClient
from xstage.client.staging import local_hash, staged_root, verify_staged
from xstage.record import io as record_io


def _planted_package(root: Path, marker: Path) -> str:
    """Shell lines that plant ``xstage_remote`` under ``root``/cache/remote/<hash>/."""
    pkg = root / "cache" / "remote" / local_hash()[:16] / "xstage_remote"
    return (f"umask 000; mkdir -p {pkg} && "
            f"printf 'open(\"{marker}\", \"w\").write(\"ran\")\\n' > {pkg}/__init__.py && "
            f"printf 'def main(argv): pass\\n' > {pkg}/__main__.py")


@needs_root
def test_a_home_another_user_made_first_is_refused_and_nothing_in_it_runs(
        shared_folder, monkeypatch):  # noqa: F811
    planted = shared_folder / "home"
    marker = shared_folder / "ran-as-root"
    as_nobody(_planted_package(planted, marker))
    monkeypatch.setenv("XSTAGE_HOME", str(planted))
    with pytest.raises(errors.UsageError) as refused:
        with WorkerClient(sys.executable):
            pass
    message = str(refused.value)
    assert str(planted) in message and "nobody" in message and "uid 65534" in message
    assert "mode 0777" in message
    assert "XSTAGE_HOME" in refused.value.remedy
    assert not marker.exists()
    # The CLI: a usage error (exit 64), one line and a hint, no traceback, nothing run.
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--runs", "1",
                           "--warmup", "0", "-q"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert done.returncode == 64, done.stderr
    assert "Traceback" not in done.stderr and str(planted) in done.stderr
    assert not marker.exists()


@needs_root
def test_a_folder_inside_a_home_that_another_user_owns_is_refused(
        shared_folder, monkeypatch):  # noqa: F811
    """A home of ours whose ``logs/`` another user made (say while it was world-writable)."""
    mine = shared_folder / "mine"
    mine.mkdir(mode=0o777)
    mine.chmod(0o777)
    as_nobody(f"mkdir {mine}/logs")
    mine.chmod(0o700)
    monkeypatch.setenv("XSTAGE_HOME", str(mine))
    with pytest.raises(errors.UsageError, match="logs is owned by nobody"):
        home.logs_dir()


def test_a_home_others_may_write_is_refused_with_the_fix(tmp_path, monkeypatch):
    open_home = tmp_path / "open"
    open_home.mkdir()
    open_home.chmod(0o775)
    monkeypatch.setenv("XSTAGE_HOME", str(open_home))
    with pytest.raises(errors.UsageError, match="mode 0775") as refused:
        home.records_dir()
    assert f"chmod go-w {open_home}" in refused.value.remedy


def test_a_mount_without_posix_modes_is_said_so(tmp_path, monkeypatch):
    """What a Windows drive under WSL shows: every file 0777 (the mount type is read from
    /proc/self/mounts; here it is told, as no drvfs can be mounted in the suite)."""
    drive = tmp_path / "c"
    drive.mkdir()
    drive.chmod(0o777)
    monkeypatch.setenv("XSTAGE_HOME", str(drive))
    monkeypatch.setattr(home, "_fs_type", lambda _path: "drvfs")
    with pytest.raises(errors.UsageError, match="drvfs mount, which keeps no POSIX") as refused:
        home.home()
    assert "metadata" in refused.value.remedy


def test_home_and_folders_are_made_private_whatever_the_umask(tmp_path, monkeypatch):
    fresh = tmp_path / "fresh" / "home"
    monkeypatch.setenv("XSTAGE_HOME", str(fresh))
    old = os.umask(0)
    try:
        folders = [home.home(), home.records_dir(), home.logs_dir(), home.cache_dir()]
        record = record_io.write_record(_a_record(), record_io.records_path(graph="g.onnx"))
        with WorkerClient(sys.executable) as client:
            log = client.log_path
    finally:
        os.umask(old)
    for folder in folders:
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert (fresh / "cache" / "remote").stat().st_mode & 0o777 == 0o700
    assert record.stat().st_mode & 0o777 == 0o600
    assert log is not None and log.stat().st_mode & 0o777 == 0o600
    outside = record_io.write_record(_a_record(), tmp_path / "mine.json")  # --json PATH
    assert outside.stat().st_mode & 0o777 == 0o644


def _a_record() -> dict:
    from tests.record import record_docs

    return record_docs.placed()


def test_a_staged_package_changed_after_staging_is_replaced_not_run(tmp_path):
    marker = tmp_path / "ran"
    root = staged_root()
    assert verify_staged(root)
    init = root / "xstage_remote" / "__init__.py"
    init.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + init.read_text())
    assert not verify_staged(root)
    with WorkerClient(sys.executable) as client:
        assert client.ping() is not None
    assert not marker.exists()
    assert verify_staged(root)
    for extra in (root / "numpy.py", root / "xstage_remote" / "sitecustomize.py"):
        extra.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        assert not verify_staged(root)
        assert staged_root() == root and verify_staged(root) and not extra.exists()
    cache = root / "xstage_remote" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "wire.cpython-311.pyc").write_bytes(b"planted")
    (cache / "wire.cpython-311.pyc").chmod(0o666)  # a bytecode cache others may write
    assert not verify_staged(root)
