"""The onnxruntime distribution, checked at the first command: none, or one too old, is one line
naming the extra to install (exit 1, no traceback); a current one is used as it is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from xstage import errors
from xstage.cli import _runtime
from xstage.cli import main as cli_main


def test_no_distribution_names_the_extra():
    with pytest.raises(errors.RuntimeMissing) as caught:
        _runtime.check_onnxruntime(None, look=False)
    assert "pip install 'xstage[cpu]'" in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(("dist", "fix"), [
    ("onnxruntime-openvino", "pip install -U 'xstage[openvino]'"),
    ("onnxruntime", "pip install -U 'xstage[cpu]'"),
    ("onnxruntime-qnn", "pip install -U onnxruntime-qnn"),
])
def test_too_old_a_distribution_is_named_with_its_extra(dist, fix):
    with pytest.raises(errors.RuntimeMissing) as caught:
        _runtime.check_onnxruntime((dist, "1.17.1"))
    assert caught.value.message.startswith(f"{dist} 1.17.1 is older than")
    assert fix in caught.value.message and "1.19" in caught.value.message


@pytest.mark.parametrize("version", ["1.19.0", "1.24.1", "1.32.0.dev20250101", ""])
def test_a_supported_distribution_is_used_as_it_is(version):
    _runtime.check_onnxruntime(("onnxruntime-openvino", version))


def test_this_interpreters_distribution_is_found():
    name, version = _runtime.installed_distribution()
    assert name.startswith("onnxruntime") and version


def test_a_command_without_onnxruntime_says_which_extra_in_one_line():
    """The module hidden (``sys.modules[...] = None`` is what find_spec reads as absent)."""
    code = ("import sys; sys.modules['onnxruntime'] = None\n"
            "from xstage.cli.main import main\nsys.exit(main(['external', '--runs', '1']))")
    env = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == cli_main.EXIT_ERROR == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'xstage[cpu]'" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "XSTAGE_DEBUG" not in done.stderr


def test_too_old_at_the_first_command(monkeypatch, capsys):
    monkeypatch.setattr(_runtime, "installed_distribution", lambda: ("onnxruntime-gpu", "1.16.3"))
    assert cli_main.main(["devices"]) == 1
    err = capsys.readouterr().err
    assert "onnxruntime-gpu 1.16.3 is older than" in err and "xstage[gpu]" in err


def test_records_are_read_without_a_runtime(monkeypatch, tmp_path, capsys):
    """``report`` and ``compare`` only read records: no runtime needed (and none asked for)."""
    monkeypatch.setattr(_runtime, "installed_distribution", lambda: None)
    missing = tmp_path / "none.json"
    assert cli_main.main(["report", str(missing)]) == 1
    assert "onnxruntime" not in capsys.readouterr().err
