"""The command line's contract: version, help, exit codes, no tracebacks for known errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from xstage import __version__, errors
from xstage.cli import main as cli_main


def _xstage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstage", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_version():
    out = _xstage("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"xstage {__version__}"


def test_help_does_not_import_onnx():
    """onnx (with ml_dtypes, ~0.7 s) is imported by the subcommands that use it, when they run."""
    code = ("import sys; from xstage.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'onnx_ir') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_help_documents_debug_home_and_exit_codes():
    out = _xstage("--help")
    assert out.returncode == 0
    for text in ("XSTAGE_DEBUG=1", "XSTAGE_HOME", "XSTAGE_PYTHON_", "64 usage error", "2 refused"):
        assert text in out.stdout


def test_bad_flag_is_a_usage_error_not_a_refusal():
    """argparse's own exit 2 would read as "refused"; usage errors exit 64."""
    out = _xstage("devices", "--no-such-flag")
    assert out.returncode == cli_main.EXIT_USAGE == 64
    assert "unrecognized arguments" in out.stderr


def test_no_command_prints_help_and_exits_64():
    out = _xstage()
    assert out.returncode == 64 and "COMMAND" in out.stderr


def test_known_error_is_one_line_and_a_hint_without_traceback(monkeypatch, capsys):
    def boom(args, out):
        raise errors.WorkerError("the worker fell over", remedy="look at its log")

    parser = cli_main.build_parser()
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    args = parser.parse_args(["devices"])
    args.func = boom
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    monkeypatch.delenv("XSTAGE_DEBUG", raising=False)
    assert cli_main.main(["devices"]) == 1
    err = capsys.readouterr().err
    assert "the worker fell over" in err and "look at its log" in err
    assert "Traceback" not in err and "XSTAGE_DEBUG=1" in err


def test_debug_shows_the_traceback(monkeypatch):
    def boom(args, out):
        raise errors.WorkerError("the worker fell over")

    parser = cli_main.build_parser()
    args = parser.parse_args(["devices"])
    args.func = boom
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    monkeypatch.setenv("XSTAGE_DEBUG", "1")
    with pytest.raises(errors.WorkerError):
        cli_main.main(["devices"])


def test_unknown_exception_stays_loud(monkeypatch):
    """A bug is not a known error: it propagates."""
    def boom(args, out):
        raise ZeroDivisionError

    parser = cli_main.build_parser()
    args = parser.parse_args(["devices"])
    args.func = boom
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    with pytest.raises(ZeroDivisionError):
        cli_main.main(["devices"])


def test_quiet_and_verbose_work_after_the_command_too():
    parser = cli_main.build_parser()
    args = parser.parse_args(["devices", "-q"])
    assert args.quiet is True
    args = parser.parse_args(["-v", "devices"])
    assert args.verbose == 1 and args.quiet is False


def test_run_is_gone():
    """``xstage run`` admitted a route on ``get_providers()[0]`` and a 1e-4 difference, the very
    evidence the product refuses; ``xstage external`` (proof, gate, record) replaces it."""
    out = _xstage("run")
    assert out.returncode == cli_main.EXIT_USAGE and "invalid choice: 'run'" in out.stderr
