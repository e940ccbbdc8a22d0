"""``tests/runcache.py``: a kept export is used only while everything that made it is unchanged.

Real subprocesses of this interpreter stand for the export venv: a script that imports a package
of its own (the exporter's code), reads an input file, writes into ``{out}`` a file that names
its folder, and counts its runs in a file the cache does not see.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import runcache

SCRIPT = """
import json, os, sys
from pathlib import Path
import helperpkg
out, spec = Path(sys.argv[1]), Path(sys.argv[2])
with open(os.environ["COUNTER_FILE"], "a") as f:
    f.write("run\\n")
if helperpkg.FAIL:
    sys.exit(3)
(out / "report.json").write_text(json.dumps({"path": str(out / "a.bin"), "value": helperpkg.VALUE,
                                             "data": helperpkg.data(), "spec": spec.read_text()}))
(out / "a.bin").write_bytes(b"artifact")
print("wrote", out)
"""


@pytest.fixture
def world(tmp_path: Path):
    pkg = tmp_path / "lib" / "helperpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nVALUE = 1\nFAIL = False\n"
        "def data():\n    return (Path(__file__).parent / 'table.txt').read_text()\n")
    (pkg / "table.txt").write_text("t1")
    (pkg / "unused.py").write_text("X = 1\n")
    (tmp_path / "spec.json").write_text("s1")
    counter = tmp_path / "runs.txt"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "lib"), COUNTER_FILE=str(counter))

    def run(dest: str, *, script: str = SCRIPT):
        return runcache.run(Path(sys.executable), ["-c", script, "{out}", str(tmp_path / "spec.json")],
                            tmp_path / dest, env=env, cwd=tmp_path, timeout=120, cache=tmp_path / "cache")

    def runs() -> int:
        return len(counter.read_text().splitlines()) if counter.exists() else 0

    return tmp_path, pkg, run, runs


def test_a_second_run_is_a_copy_that_names_its_own_folder(world):
    tmp, _, run, runs = world
    first, second = run("a"), run("b")
    assert runs() == 1 and first.args[0] == "ran" and second.args[0] == "cached"
    assert second.returncode == 0 and second.stdout.strip() == f"wrote {tmp / 'b'}"
    doc = json.loads((tmp / "b" / "report.json").read_text())
    assert doc["path"] == str(tmp / "b" / "a.bin") and (tmp / "b" / "a.bin").read_bytes() == b"artifact"
    assert json.loads((tmp / "a" / "report.json").read_text())["path"] == str(tmp / "a" / "a.bin")


def test_a_change_to_an_imported_module_runs_the_command_again(world):
    tmp, pkg, run, runs = world
    run("a")
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace("VALUE = 1", "VALUE = 2"))
    again = run("b")
    assert runs() == 2 and again.args[0] == "ran"
    assert json.loads((tmp / "b" / "report.json").read_text())["value"] == 2


def test_a_change_to_a_data_file_of_an_imported_package_runs_it_again(world):
    tmp, pkg, run, runs = world
    run("a")
    (pkg / "table.txt").write_text("t2")
    run("b")
    assert runs() == 2 and json.loads((tmp / "b" / "report.json").read_text())["data"] == "t2"


def test_a_change_to_an_input_file_or_to_the_code_runs_it_again(world):
    tmp, _, run, runs = world
    run("a")
    (tmp / "spec.json").write_text("s2")
    run("b")
    assert runs() == 2 and json.loads((tmp / "b" / "report.json").read_text())["spec"] == "s2"
    run("c", script=SCRIPT + "\n# another script\n")
    assert runs() == 3


def test_a_module_the_command_never_imported_does_not_count(world):
    _, pkg, run, runs = world
    run("a")
    (pkg / "unused.py").write_text("X = 2\n")
    assert run("b").args[0] == "cached" and runs() == 1


def test_a_failing_command_is_never_kept(world):
    tmp, pkg, run, runs = world
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace("FAIL = False", "FAIL = True"))
    first, second = run("a"), run("b")
    assert first.returncode == second.returncode == 3 and runs() == 2
    assert not list((tmp / "cache").glob("*/r-*"))


def test_a_module_run_with_dash_m_records_what_it_imported(world):
    """``-m`` (as ``python -m xstage export`` is run): the module and what it imports are keyed."""
    tmp, pkg, _, runs = world
    (pkg / "cli.py").write_text("import sys\n" + SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(tmp / "lib"), COUNTER_FILE=str(tmp / "runs.txt"))

    def run(dest: str):
        return runcache.run(Path(sys.executable), ["-m", "helperpkg.cli", "{out}", str(tmp / "spec.json")],
                            tmp / dest, env=env, cwd=tmp, timeout=120, cache=tmp / "cache")

    assert [run("a").args[0], run("b").args[0]] == ["ran", "cached"] and runs() == 1
    (pkg / "cli.py").write_text((pkg / "cli.py").read_text() + "\n# changed\n")
    assert run("c").args[0] == "ran" and runs() == 2


def test_a_script_run_by_path_is_keyed_by_its_text(world):
    tmp, _, _, runs = world
    script = tmp / "make.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(tmp / "lib"), COUNTER_FILE=str(tmp / "runs.txt"))

    def run(dest: str):
        return runcache.run(Path(sys.executable), [str(script), "{out}", str(tmp / "spec.json")],
                            tmp / dest, env=env, cwd=tmp, timeout=120, cache=tmp / "cache")

    assert [run("a").args[0], run("b").args[0]] == ["ran", "cached"] and runs() == 1
    script.write_text(SCRIPT + "\n# changed\n")
    assert run("c").args[0] == "ran" and runs() == 2


def test_the_folder_of_a_run_killed_mid_way_is_removed_by_the_next_run(world):
    tmp, pkg, run, _ = world
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace("FAIL = False", "FAIL = True"))
    run("a")  # makes the command's folder, keeps nothing
    (key,) = (tmp / "cache").iterdir()
    (key / "run-killed" / "out").mkdir(parents=True)
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace("FAIL = True", "FAIL = False"))
    assert run("b").args[0] == "ran"
    assert not (key / "run-killed").exists() and len(list(key.glob("r-*"))) == 1
