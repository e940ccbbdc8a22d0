"""A full home: every write that fails for want of space is a named error, never a traceback.

Each case runs the real CLI (or API) with ``XSTAGE_HOME`` on a tiny tmpfs in a private mount
namespace (``tests/mountns.py``: skipped, saying why, where that is not permitted). Before,
the built-in graph's write and the snapshot copy ended in a traceback, a failed copy of the
worker package came back as a refusal ``route_missing``, ``write_record`` gave a traceback and
``Stage.close()`` a raw ``OSError``.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from tests.mountns import in_tiny_tmpfs
from xstage import builtin_graphs

HOME = "/mnt/xstage-home"

#: Fill the tmpfs (from Python, so no shell tool's wording matters). Unbuffered: a buffered
#: file's close would flush the last partial block into the full disk and raise there.
FILL = textwrap.dedent("""
    def fill():
        with open("/mnt/fill", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\\0" * 65536)
                    f.flush()
            except OSError:
                pass
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XSTAGE_")}
    return {**env, "XSTAGE_HOME": HOME, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def _cli(size: str, *args: str, tmp: Path):
    """``xstage ARGS`` with the home on a ``size`` tmpfs at /mnt (made 0700 first)."""
    script = tmp / "cli.py"
    script.write_text(f"import os, sys\nos.mkdir({HOME!r}, 0o700)\n"
                      "from xstage.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")
    return in_tiny_tmpfs("/mnt", size, [sys.executable, str(script), *args], env=_env())


def _one_error(stderr: str) -> tuple[str, str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    hints = [line for line in stderr.splitlines() if line.startswith("hint:")]
    assert len(errors) == 1 and len(hints) == 1, stderr[-3000:]
    return errors[0], hints[0]


def test_a_full_home_on_the_first_write_is_one_line(tmp_path: Path) -> None:
    """The built-in graph on a 1 MiB home: exit 1, the path and the fix, no traceback."""
    done = _cli("1m", "external", "--device", "cpu", "-q", tmp=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    error, hint = _one_error(done.stderr)
    assert error.startswith("error: no space left to ") and f"{HOME}/cache/" in error
    assert f"free space on the file system that holds {HOME}/cache/" in hint
    assert "XSTAGE_HOME" in hint


def test_a_failed_copy_of_the_worker_package_is_named_not_a_missing_route(tmp_path: Path) -> None:
    """A small graph on a 100 KiB home: the graph's snapshot fits, the worker package does not.
    Before: a refusal ``route_missing`` (exit 2, "cannot start the interpreter"); now exit 1
    naming the copy."""
    graph = builtin_graphs.write(builtin_graphs.slice_graph(64, 8), tmp_path / "small.onnx")
    tmp_path.chmod(0o755)
    done = _cli("100k", "external", "--graph", str(graph), "--device", "cpu", "-q", tmp=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    error, _ = _one_error(done.stderr)
    assert f"no space left to copy the worker package into {HOME}/cache/remote" in error
    assert "route" not in error and len(error) < 300


def test_the_record_on_a_home_that_filled_during_the_run(tmp_path: Path) -> None:
    """The disk fills once the stage is open: the CLI's ``write_record`` is one line naming
    the record's path (exit 1)."""
    graph = builtin_graphs.write(builtin_graphs.slice_graph(64, 8), tmp_path / "small.onnx")
    script = tmp_path / "late.py"
    script.write_text(FILL + textwrap.dedent(f"""
        import os, sys
        os.mkdir({HOME!r}, 0o700)
        from xstage.cli import external
        from xstage.cli.main import main
        opened = external._open
        def _open(*a, **k):
            stage = opened(*a, **k)
            fill()
            return stage
        external._open = _open
        sys.exit(main(["external", "--graph", {str(graph)!r}, "--device", "cpu", "-q"]))
    """))
    done = in_tiny_tmpfs("/mnt", "64m", [sys.executable, str(script)], env=_env())
    assert done.returncode == 1, done.stderr[-3000:]
    error, _ = _one_error(done.stderr)
    assert f"no space left to write {HOME}/records/" in error and error.endswith(".json "
                                                                                "(No space left on device)")


def test_close_on_a_full_home_warns_and_never_raises(tmp_path: Path) -> None:
    """``Stage.close()`` with the home full: closed all the same, one ``RuntimeWarning``
    naming the record's path, ``record_path`` None; the worker is gone."""
    graph = builtin_graphs.write(builtin_graphs.slice_graph(64, 8), tmp_path / "small.onnx")
    script = tmp_path / "close.py"
    script.write_text(FILL + textwrap.dedent(f"""
        import os, warnings
        import numpy as np
        os.mkdir({HOME!r}, 0o700)
        import xstage
        st = xstage.open_stage({str(graph)!r}, device="cpu")
        st({{"x": np.ones(64, np.float32)}})
        fill()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            st.close()
        print("warned", [str(w.message) for w in seen if w.category is RuntimeWarning])
        try:
            st({{"x": np.ones(64, np.float32)}})
        except xstage.errors.StageClosed:
            print("record_path", st.record_path, "then StageClosed")
    """))
    done = in_tiny_tmpfs("/mnt", "64m", [sys.executable, str(script)], env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    warned = next(line for line in done.stdout.splitlines() if line.startswith("warned"))
    assert "its record was not written: no space left to write" in warned and HOME in warned
    assert done.stdout.splitlines()[-1] == "record_path None then StageClosed"
