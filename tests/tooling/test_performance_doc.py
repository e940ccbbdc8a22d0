"""docs/performance.md: one entry per benchmark, each figure with its commit; citations of the
page name sections that exist; code cites the page, never a dated pass of the history.

Staleness (a measured file changed after a figure's commit) is reported by
``scripts/performance_staleness.py``, never failed on: these tests check only that it can be
computed (every commit known to git, every measured path present).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "performance.md"
HISTORY = REPO / "docs" / "records" / "benchmarks-history.md"
CITATION = re.compile(r"docs/performance\.md#([A-Za-z0-9_-]+)|\(performance\.md#([A-Za-z0-9_-]+)\)")


def _script():
    spec = importlib.util.spec_from_file_location("performance_staleness",
                                                  REPO / "scripts" / "performance_staleness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer makes of a heading (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors() -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", PAGE.read_text(encoding="utf-8"), re.M)}


def test_every_benchmark_has_one_entry_that_measures_it():
    entries = _script().parse(PAGE.read_text(encoding="utf-8"))
    scripts = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
    assert sorted(e.name for e in entries) == scripts
    for entry in entries:
        assert f"benchmarks/{entry.name}.py" in entry.measures, entry.name
        missing = [p for p in entry.measures if not (REPO / p).exists()]
        assert missing == [], f"{entry.name} measures paths that do not exist: {missing}"


def test_every_figure_has_a_commit_git_knows_or_says_unmeasured():
    """Then the staleness of each can be computed (it is only reported, whatever it is)."""
    script = _script()
    entries = script.judge(script.parse(PAGE.read_text(encoding="utf-8")))
    for entry in entries:
        for row in entry.rows:
            assert row.status in ("current", "stale", "unmeasured"), (entry.name, row)
            if row.commit is None:
                assert "unmeasured" in PAGE.read_text(encoding="utf-8").split(f"### {entry.name}\n")[1]


def test_the_staleness_script_reports_and_never_fails(capsys):
    assert _script().main([]) == 0
    assert "figures in" in capsys.readouterr().out


def _citing_files() -> list[Path]:
    roots = [REPO / "src", REPO / "docs", REPO / "benchmarks", REPO / "scripts"]
    files = [p for root in roots for p in root.rglob("*") if p.suffix in (".py", ".md") and p.is_file()]
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(files)]


def test_every_citation_of_the_page_names_a_section_that_exists():
    anchors, bad = _anchors(), []
    for path in _citing_files():
        for m in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if (m.group(1) or m.group(2)) not in anchors:
                bad.append(f"{path.relative_to(REPO)}: #{m.group(1) or m.group(2)}")
    assert bad == []


def test_nothing_cites_the_old_notebook_page():
    bad = [str(p.relative_to(REPO)) for p in _citing_files() if p != REPO / "CHANGELOG.md"
           and p != HISTORY and "docs/benchmarks.md" in p.read_text(encoding="utf-8", errors="replace")]
    assert bad == []


def _dated_passes() -> list[str]:
    """What names a pass of the history: its headings' titles and their quoted nicknames, less
    the titles a reference page also has as a heading (docs/wire.md's "Binary call frames")."""
    titles = re.findall(r"^#{2,3} (.+)$", HISTORY.read_text(encoding="utf-8"), re.M)
    names = [re.split(r" \(|, 20\d\d", t)[0].strip() for t in titles]
    nicknames = [n for t in titles for n in re.findall(r'"([a-z0-9]+)"', t)]
    reference = {h.strip() for p in (REPO / "docs").glob("*.md")
                 for h in re.findall(r"^#{1,6} (.+)$", p.read_text(encoding="utf-8"), re.M)}
    return [n for n in names + nicknames if len(n) > 5 and n not in reference]


def test_src_cites_no_dated_pass_of_the_history():
    """Code cites docs/performance.md's sections, never "the third pass" or a dated heading."""
    ordinal = re.compile(r"\b(first|second|third|fourth|fifth|sixth|\d+(st|nd|rd|th)) pass\b", re.I)
    passes = _dated_passes()
    assert "sockspin" in passes and "Held spins: the 64 B call beside busy processes" in passes
    bad = []
    for path in sorted((REPO / "src").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        bad += [f"{path.relative_to(REPO)}: {m.group(0)!r}" for m in ordinal.finditer(text)]
        bad += [f"{path.relative_to(REPO)}: {name!r}" for name in passes if f'"{name}"' in text]
        if "benchmarks-history" in text:
            bad.append(f"{path.relative_to(REPO)}: cites the history")
    assert bad == []
