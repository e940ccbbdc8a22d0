"""``./xstage.toml`` is used only once trusted (docs/routes.md, "Project files").

The attacks: a cloned repository or an unpacked archive whose ``xstage.toml`` names a script as
a route's interpreter (``xstage devices`` ran it) or a library as a plugin EP (its constructor
ran when the probe loaded it). Owned by the user who fetched it, so ownership proves nothing:
only a trust record (path and sha256, ``xstage config trust``) lets it in, and a changed file
is out again. Where ownership does matter (a project file or user config another user wrote),
the attacker is uid 65534.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attacker import as_nobody, needs_root, shared_folder  # noqa: F401 (a fixture)
from xstage.routes import config as cfg
from xstage.routes import plugins


def _xstage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstage", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))


def _evil_script(folder: Path, marker: Path) -> None:
    script = folder / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)


def _ignored_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("xstage: ignoring")]


def test_an_untrusted_project_file_runs_nothing_and_is_named_once(tmp_path):
    project = tmp_path / "cloned"
    project.mkdir()
    marker = tmp_path / "ran"
    _evil_script(project, marker)
    (project / "xstage.toml").write_text('[routes.ort-cpu]\npython = "./evil.sh"\n')
    done = _xstage("devices", cwd=project)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    (line,) = _ignored_lines(done.stderr)
    assert str(project / "xstage.toml") in line and "xstage config trust" in line
    assert "Traceback" not in done.stderr


@pytest.fixture
def evil_library(tmp_path: Path) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker file (built with the C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a library with a constructor")
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "evil.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    outside = tmp_path / "outside"
    outside.mkdir()
    library = outside / "libevil.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True,
                   timeout=120)
    return library, marker


def test_an_untrusted_plugin_table_loads_no_library(tmp_path, evil_library):
    library, marker = evil_library
    project = tmp_path / "unpacked"
    project.mkdir()
    (project / "xstage.toml").write_text(
        '[plugins.evil]\nlibrary = "../outside/libevil.so"\nep_name = "Evil"\n')
    done = _xstage("devices", cwd=project)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert "ort-plugin:evil" not in done.stdout
    assert len(_ignored_lines(done.stderr)) == 1
    # Trusted, the same table is a route (its library loaded by the probe, as documented).
    assert _xstage("config", "trust", cwd=project).returncode == 0
    assert "ort-plugin:evil" in _xstage("devices", cwd=project).stdout


def test_trust_records_the_file_and_a_change_untrusts_it(tmp_path, fake_python):
    python = fake_python("exit 0")
    project = tmp_path / "p"
    project.mkdir()
    toml = project / "xstage.toml"
    toml.write_text(f'[routes.ort-openvino]\npython = "{python}"\n')
    assert cfg.project_config(project).exists is False  # not trusted
    done = _xstage("config", "trust", cwd=project)
    assert done.returncode == 0, done.stderr
    assert f"trusted {toml}" in done.stdout
    record = cfg.user_config().data["trusted"]
    assert record[-1]["path"] == str(toml) and len(record[-1]["sha256"]) == 64
    assert cfg.project_config(project).route_python("ort-openvino") == str(python)
    toml.write_text(f'[routes.ort-openvino]\npython = "{python}"\n# changed\n')
    assert cfg.project_config(project).exists is False  # changed: untrusted again
    done = _xstage("devices", cwd=project)
    (line,) = _ignored_lines(done.stderr)
    assert "not trusted in this version" in line
    cfg.trust(toml)
    assert cfg.project_config(project).exists


def test_a_project_file_named_on_the_command_line_is_used(tmp_path, fake_python):
    python = fake_python("exit 0")
    named = tmp_path / "mine.toml"
    named.write_text(f'[routes.ort-openvino]\npython = "{python}"\n')
    with cfg.named_project_config(named):
        assert cfg.project_config(tmp_path / "elsewhere").route_python("ort-openvino") \
            == str(python)
    done = _xstage("devices", "--project-config", str(tmp_path / "missing.toml"), cwd=tmp_path)
    assert done.returncode == 64 and "no such file" in done.stderr
    done = _xstage("config", "trust", str(tmp_path / "missing.toml"), cwd=tmp_path)
    assert done.returncode == 64 and "cannot read" in done.stderr


@needs_root
def test_another_users_project_file_cannot_be_trusted_or_used(shared_folder):  # noqa: F811
    project = shared_folder / "proj"
    marker = shared_folder / "ran"
    as_nobody(f"umask 022; mkdir {project} && printf '#!/bin/sh\\ntouch {marker}\\n' > "
              f"{project}/evil.sh && chmod 755 {project}/evil.sh && "
              f"printf '[routes.ort-cpu]\\npython = \"./evil.sh\"\\n' > {project}/xstage.toml")
    done = _xstage("config", "trust", cwd=project)
    assert done.returncode == 64
    assert "owned by uid 65534" in done.stderr and "Traceback" not in done.stderr
    done = _xstage("devices", cwd=project)
    assert done.returncode == 0 and not marker.exists()
    (line,) = _ignored_lines(done.stderr)
    assert "owned by uid 65534" in line


@needs_root
def test_a_user_config_another_user_wrote_is_ignored(shared_folder, monkeypatch):  # noqa: F811
    marker = shared_folder / "ran"
    config = shared_folder / "config.toml"
    as_nobody(f"umask 022; printf '#!/bin/sh\\ntouch {marker}\\n' > {shared_folder}/evil.sh && "
              f"chmod 755 {shared_folder}/evil.sh && printf '[routes.ort-cpu]\\npython = "
              f"\"{shared_folder}/evil.sh\"\\n' > {config}")
    monkeypatch.setenv("XSTAGE_CONFIG", str(config))
    assert cfg.user_config().exists is False
    assert not any(s.name == "ort-plugin:evil" for s in plugins.all_specs(cwd=shared_folder))
    done = _xstage("devices", cwd=Path("/"))
    assert done.returncode == 0 and not marker.exists()
    assert any(str(config) in line for line in _ignored_lines(done.stderr))
