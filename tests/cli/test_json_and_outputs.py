"""One ``--json`` on every command, and outputs that never clobber: each case was an attack that
succeeded before (a link replaced by a file, ``--json -`` writing a file named ``-``, a folder
created silently, ``/tmp.onnx`` written beside ``--out /tmp``, a traceback)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from xstage import builtin_graphs, errors
from xstage.cli import main as cli_main
from xstage.cli._flags import resolve_out
from xstage.home import write_output

ENV = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}


def _xstage(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstage", *args], capture_output=True, text=True,
                          env=dict(ENV, XSTAGE_HOME=os.environ["XSTAGE_HOME"]), cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    """A real record: the built-in stage on the reference arm, one timed run."""
    folder = tmp_path_factory.mktemp("rec")
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--route", "ort-cpu", "--runs", "1",
                           "--json", str(folder / "r.json")], capture_output=True, text=True,
                          env=dict(ENV, XSTAGE_HOME=str(folder / "home")), timeout=300)
    assert done.returncode == 0, done.stderr
    return folder / "r.json"


@pytest.mark.parametrize("argv", [["devices"], ["env", "list"]])
@pytest.mark.parametrize("flag", [["--json"], ["--json", "-"], ["--json=-"]])
def test_listing_commands_print_one_json_document_and_nothing_else(argv, flag, tmp_path):
    done = _xstage(*argv, *flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # the whole of stdout is one document
    assert not (tmp_path / "-").exists()


def test_external_json_without_a_value_is_the_record_on_stdout_and_the_summary_on_stderr(tmp_path):
    done = _xstage("external", "--route", "ort-cpu", "--runs", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "xstage.external" and doc["outcome"]["status"] == "placed"
    assert "placed on" in done.stderr and "record written to" in done.stderr


def test_report_and_compare_take_json_on_stdout_or_a_path(record, tmp_path):
    done = _xstage("report", str(record), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["kind"] == "xstage.external"
    done = _xstage("compare", str(record), str(record), f"--json={tmp_path / 'c.json'}")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "c.json").read_text())["same_artifact"] is True
    assert "what changed" in done.stdout  # with a path, the human view stays on stdout


@pytest.mark.parametrize("argv", [
    ["report", "{rec}", "--json", "{rec}"],
    ["compare", "{rec}", "{rec}", "--json={rec}"],
    ["external", "--graph", "{graph}", "--json", "{graph}"],
    ["sanitize", "{graph}", "{out}", "--json", "{graph}"],
])
def test_json_naming_one_of_the_commands_files_is_a_usage_error(argv, record, tmp_path):
    graph = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "g.onnx")
    before = graph.read_bytes(), record.read_bytes()
    done = _xstage(*[a.format(rec=record, graph=graph, out=tmp_path / "o.onnx") for a in argv])
    assert done.returncode == 64, done.stderr
    assert "names the command's own file" in done.stderr and "Traceback" not in done.stderr
    assert (graph.read_bytes(), record.read_bytes()) == before


@pytest.mark.parametrize("argv", [
    ["devices", "--json={missing}/d.json"],
    ["env", "list", "--json", "{missing}/e.json"],
    ["external", "--json", "{missing}/r.json"],
    ["report", "{rec}", "--html", "{missing}/r.html"],
    ["report", "{rec}", "--trace", "{missing}/t.json"],
    ["compare", "{rec}", "{rec}", "--html", "{missing}/c.html"],
])
def test_a_missing_folder_is_a_usage_error_on_every_command_and_never_created(argv, record, tmp_path):
    missing = tmp_path / "nope"
    done = _xstage(*[a.format(rec=record, missing=missing) for a in argv])
    assert done.returncode == 64, done.stdout + done.stderr
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr
    assert not missing.exists()


def test_a_link_of_ours_is_written_through_and_kept(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    done = _xstage("env", "list", f"--json={link}")
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["envs"] == []
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # the file's permissions kept


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_another_users_link_in_a_sticky_folder_is_refused(tmp_path):
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    link = sticky / "out.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # nobody's link, pointing at our file
    done = _xstage("env", "list", "--json", str(link))
    assert done.returncode == 64
    assert "owned by another user" in done.stderr
    assert victim.read_text() == "keep me" and link.is_symlink()


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(fifo, b'{"a": 1}\n')
    reader.join(timeout=60)
    assert got == [b'{"a": 1}\n'] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_stdout_is_stdout_never_a_file():
    done = subprocess.run([sys.executable, "-m", "xstage", "env", "list", "--json", "/dev/stdout"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(ENV, XSTAGE_HOME=os.environ["XSTAGE_HOME"]))  # the test's own home
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["envs"] == []  # stdout holds the document alone
    assert os.path.islink("/dev/stdout") or stat.S_ISCHR(os.stat("/dev/stdout").st_mode)


# -- --out: a file whose suffix names the format, or a folder, never a sibling -------------------


def test_resolve_out_cases(tmp_path):
    (tmp_path / "d").mkdir()
    name = "vision_tower.onnx"

    def out(value: str) -> Path:
        return resolve_out("--out", value, suffixes=(".onnx",), name=name)

    assert out(str(tmp_path / "d")) == tmp_path / "d" / name  # an existing folder: inside it
    assert out(str(tmp_path / "x.onnx")) == tmp_path / "x.onnx"
    assert out(str(tmp_path / "new") + "/") == tmp_path / "new" / name
    assert out(str(tmp_path / "tower")) == tmp_path / "tower.onnx"
    with pytest.raises(errors.UsageError, match="names no format"):
        resolve_out("--out", str(tmp_path / "x.txt"), suffixes=(".onnx",), name=name)
    with pytest.raises(errors.UsageError, match="does not exist"):
        resolve_out("--out", str(tmp_path / "a" / "b" / "x.onnx"), suffixes=(".onnx",), name=name)


def test_export_out_a_folder_never_writes_beside_it(tmp_path):
    """``export --out DIR`` (``/tmp`` before: ``/tmp.onnx`` in ``/``): a bad size is answered at
    once, before torch, and nothing is written anywhere."""
    folder = tmp_path / "out"
    folder.mkdir()
    done = _xstage("export", "vision-tower", "--config", "tiny", "--image-size", "50", "--out", str(folder))
    assert done.returncode == 64 and "not a multiple of 32" in done.stderr, done.stderr
    assert not (tmp_path / "out.onnx").exists() and list(folder.iterdir()) == []
    done = _xstage("export", "vision-tower", "--config", "tiny", "--out", str(tmp_path / "x.pt2"))
    assert done.returncode == 64 and "writes a .onnx" in done.stderr


def test_sanitize_into_a_folder_and_onto_itself(tmp_path):
    src = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    out.mkdir()
    done = _xstage("sanitize", str(src), str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "m.onnx").is_file()
    done = _xstage("sanitize", str(src), str(src.parent))
    assert done.returncode == 64 and "is the input" in done.stderr and "Traceback" not in done.stderr


def test_bisect_out_needs_its_parent(tmp_path):
    graph = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "m.onnx")
    done = _xstage("bisect", "--graph", str(graph), "--route", "ort-cpu", "--out", str(tmp_path / "a" / "b"))
    assert done.returncode == 64 and "does not exist" in done.stderr
    assert not (tmp_path / "a").exists()


def test_every_command_takes_json():
    parser = cli_main.build_parser()
    stack, missing = [("xstage", parser)], []
    while stack:
        name, p = stack.pop()
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        for action in subs:
            stack.extend((f"{name} {k}", v) for k, v in action.choices.items())
        if not subs and name != "xstage" and not any("--json" in a.option_strings for a in p._actions):
            missing.append(name)
    assert missing == []
