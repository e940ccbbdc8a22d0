"""``xstage external`` on bad inputs: one line naming the cause and the fix, the right exit
code, no traceback without ``XSTAGE_DEBUG``, and the record kept wherever a run happened."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from xstage.record import read_record


@dataclass
class Ran:
    code: int
    stderr: str
    records: list[Path]


def _external(home: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    full_env = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}
    full_env.update(COLUMNS="200", **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "xstage", "external", "--runs", "1", "--warmup", "0",
                           *args], capture_output=True, text=True, env=full_env, timeout=300)
    folder = home / "records"
    records = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return Ran(proc.returncode, proc.stderr, records)


def _one_error_line(ran: Ran) -> str:
    assert "Traceback" not in ran.stderr, ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, ran.stderr
    return errors[0]


@pytest.mark.parametrize("threads", ["-1", "100000"])
def test_threads_out_of_range_is_a_usage_error(xstage_home, threads):
    """``-1`` ran, then failed schema validation and wrote no record; 2048 took 76 s."""
    ran = _external(xstage_home, "--threads", threads)
    line = _one_error_line(ran)
    assert ran.code == 64 and f"--threads {threads}" in line and "CPU count" in line
    assert "hint: give a whole number from 1 to" in ran.stderr
    assert ran.records == []


def test_threads_within_the_cpu_count_runs(xstage_home):
    ran = _external(xstage_home, "--threads", "1")
    assert ran.code == 0, ran.stderr
    assert read_record(ran.records[0])["request"]["threads"] == 1


@pytest.mark.parametrize("value, cause, hint", [
    ("novalue", "--session-config 'novalue' is not KEY=VALUE", "e.g. --session-config"),
    ("allow_spinning=0", "is not an onnxruntime config key", "give a dotted key"),
    ("ep.context_enable=1", "a graph file other than the one hashed", "Compile caches"),
])
def test_a_session_config_xstage_cannot_pass_is_a_usage_error(xstage_home, value, cause, hint):
    ran = _external(xstage_home, "--session-config", value)
    assert ran.code == 64 and cause in _one_error_line(ran)
    assert hint in ran.stderr and ran.records == []


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "rel_l2=nan"])
def test_tolerance_that_is_not_a_finite_number_is_a_usage_error(xstage_home, value):
    ran = _external(xstage_home, "--tolerance", value)
    assert ran.code == 64 and "--tolerance" in _one_error_line(ran)
    assert ran.records == []


def test_json_naming_a_folder_is_a_usage_error(xstage_home, tmp_path):
    ran = _external(xstage_home, "--json", str(tmp_path))
    line = _one_error_line(ran)
    assert ran.code == 64 and "is a folder" in line and "record.json" in ran.stderr
    assert ran.records == []


@pytest.mark.parametrize("flag", ["--json", "--save-outputs"])
def test_a_file_in_a_missing_folder_is_a_usage_error(xstage_home, tmp_path, flag):
    target = tmp_path / "missing" / "out.file"
    ran = _external(xstage_home, flag, str(target))
    line = _one_error_line(ran)
    assert ran.code == 64 and f"{flag} {target}" in line and "does not exist" in line
    assert f"mkdir -p {target.parent}" in ran.stderr
    assert ran.records == []


def test_a_link_into_a_missing_folder_is_a_usage_error_before_the_run(xstage_home, tmp_path):
    """The link is followed when the path is checked, before anything runs."""
    target = tmp_path / "out.npz"
    target.symlink_to(tmp_path / "gone" / "out.npz")
    ran = _external(xstage_home, "--save-outputs", str(target))
    assert ran.code == 64 and "does not exist" in _one_error_line(ran)
    assert ran.records == []


def test_save_outputs_that_cannot_be_written_keeps_the_record(xstage_home, tmp_path):
    """The run succeeded: its record is written before the outputs, and the error names both
    (the write fails after the check: a full disk, a permission that changed)."""
    target = tmp_path / "out.npz"
    code = ("import sys, xstage.cli.external as ext\n"
            "def fake(path, data, *, flag):\n"
            "    raise PermissionError(13, 'Permission denied')\n"
            "ext.write_output = fake\n"
            "from xstage.cli.main import main\n"
            "sys.exit(main(['external', '--runs', '1', '--warmup', '0', '--save-outputs', "
            f"{str(target)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"})
    ran = Ran(proc.returncode, proc.stderr, sorted((xstage_home / "records").glob("*.json")))
    line = _one_error_line(ran)
    assert ran.code == 1 and f"could not write --save-outputs {target}" in line
    assert len(ran.records) == 1 and read_record(ran.records[0])["outcome"]["status"] == "placed"
    assert str(ran.records[0]) in ran.stderr


def test_json_that_cannot_be_written_keeps_the_home_record(xstage_home, tmp_path):
    """A ``--json`` target that passes the check and fails when written (a full disk, a
    permission that changed): the home record stays and the error names it (exit 1)."""
    target = tmp_path / "ro" / "record.json"
    target.parent.mkdir()
    code = ("import sys, xstage.cli._output as output\n"
            "real = output.write_output\n"
            "def fake(path, data, *, flag):\n"
            f"    if str(path) == {str(target)!r}:\n"
            "        raise PermissionError(13, 'Permission denied')\n"
            "    return real(path, data, flag=flag)\n"
            "output.write_output = fake\n"
            "from xstage.cli.main import main\n"
            f"sys.exit(main(['external', '--runs', '1', '--warmup', '0', '--json', {str(target)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"})
    records = sorted((xstage_home / "records").glob("*.json"))
    ran = Ran(proc.returncode, proc.stderr, records)
    line = _one_error_line(ran)
    assert ran.code == 1 and f"could not write --json {target}: Permission denied" in line
    assert len(records) == 1 and str(records[0]) in ran.stderr


@pytest.mark.parametrize(("name", "value"), [
    ("XSTAGE_MAX_REGION_BYTES", "4G"),
    ("XSTAGE_SPIN_SECONDS", "abc"),
    ("XSTAGE_SPIN_SECONDS", "-1"),
    ("XSTAGE_NEAR_END_SECONDS", "soon"),
    ("XSTAGE_HEADS_UP_SECONDS", "early"),
    ("XSTAGE_CROWD_BLOCKS", "yes"),
    ("XSTAGE_LOG_KEEP", "lots"),
    ("XSTAGE_COPY_THREADS", "lots"),
])
def test_a_malformed_setting_is_a_usage_error_naming_it(xstage_home, name, value):
    ran = _external(xstage_home, env={name: value})
    line = _one_error_line(ran)
    assert ran.code == 64 and f"{name}={value!r}" in line
    assert ran.records == []
