"""Code cites the repository's own docs (docs/design.md §12), never a document outside the
repository or an issue number.

1. In ``src/``, ``benchmarks/``, ``scripts/`` and ``tests/`` (every text file, read whole: a
   citation wrapped across two lines counts), and in the reference pages ``README.md`` and
   ``docs/*.md`` (not ``docs/records/``, the dated history): no citation of the outside design
   documents ("DESIGN §4", "DESIGN.md", "the seed's …", "seed document", a ``seed/…`` path). A
   random generator's seed is not one.
2. In the same files and pages: no issue-number citation ("issue 18", "issues 13 and 14",
   "issue #12", "(#20)"). The word "issue" without a number is prose, a GitHub address
   (``…/issues/123``) is a link, ``CHANGELOG.md`` and ``docs/records/`` (history) are not read,
   and a page may name a section of the history by its title in quotes ("Issues 13 and 14 on
   the merged main").
3. Every ``docs/design.md §N`` citation names a section that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = [REPO / "src", REPO / "benchmarks", REPO / "scripts"]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TEXT = {".py", ".json", ".md", ".toml", ".txt", ".sh", ".cfg", ".ini", ".yaml", ".yml"}
DESIGN = Path("docs") / "design.md"

#: (name, pattern, the fix a failure prints)
OUTSIDE = re.compile(r"\bDESIGN(?:\s*§|\.md\b)|\bseed document|\bseed/[\w./-]+|\b[Tt]he seed's\b")
ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+|\(#\d+\)|\b(?:see|in|from|of) #\d+\b")
DESIGN_CITE = re.compile(r"docs/design\.md\s*§\s*(\d+)(?:\s*[–-]\s*§?\s*(\d+))?")
FIX_OUTSIDE = ("cite the rule where the repository states it (docs/design.md §N, or the docs page "
               "that holds the specifics); an outside document cannot be opened by a reader")
FIX_ISSUE = ("cite the docs page that states what it built (docs/<page>.md, a section), or drop "
             "the citation where the sentence stands without it; history belongs in CHANGELOG.md")


def _files(roots: list[Path]) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*")
                  if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _tests() -> list[Path]:
    """The text files of ``tests/`` that rules 1 and 2 read. This file is not one of them: its
    pattern tests hold, on purpose, the citations the patterns must catch."""
    return [p for p in _files([REPO / "tests"]) if p != Path(__file__).resolve()]


def _hits(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    """Every match in each file's whole text, by line: one wrapped at a line end counts too."""
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{_name(path)}:{line}: {match.group(0)!r}")
    return found


def _history_titles() -> list[str]:
    """The headings of docs/records/, whitespace folded: a page may quote one as a pointer."""
    titles = []
    for page in (REPO / "docs" / "records").rglob("*.md"):
        for heading in re.findall(r"^#{1,6} (.+)$", page.read_text(encoding="utf-8"), re.M):
            titles.append(" ".join(heading.split()))
    return titles


def _page_issue_hits(pages: list[Path]) -> list[str]:
    """Issue numbers in reference pages, less those inside a quoted history title."""
    titles = _history_titles()
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        quoted = [m.span() for m in re.finditer(r'"([^"]+)"', text)
                  if any(" ".join(m.group(1).split()) in title for title in titles)]
        for match in ISSUE.finditer(text):
            if not any(a <= match.start() < b for a, b in quoted):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{_name(page)}:{line}: {match.group(0)!r}")
    return found


def _sections() -> set[int]:
    text = (REPO / DESIGN).read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, re.M)}


def test_no_outside_documents_are_cited() -> None:
    hits = _hits(_files(CODE) + _tests() + PAGES, OUTSIDE)
    assert not hits, f"{len(hits)} citation(s) of a document outside the repository " \
        f"({FIX_OUTSIDE}):\n" + "\n".join(hits)


def test_no_issue_numbers_are_cited() -> None:
    hits = _hits(_files(CODE) + _tests(), ISSUE) + _page_issue_hits(PAGES)
    assert not hits, f"{len(hits)} issue-number citation(s) ({FIX_ISSUE}):\n" + "\n".join(hits)


def test_design_citations_name_sections_that_exist() -> None:
    sections = _sections()
    assert sections == set(range(1, max(sections) + 1)), f"docs/design.md skips a number: {sorted(sections)}"
    bad = []
    for path in _files([*CODE, REPO / "tests"]) + PAGES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in DESIGN_CITE.finditer(line):
                cited = {int(n) for n in match.groups() if n}
                if not cited <= sections:
                    bad.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r}")
    assert not bad, ("citations of docs/design.md sections that do not exist (its sections: "
                     f"{sorted(sections)}):\n" + "\n".join(bad))


def test_the_patterns_catch_citations_and_leave_prose_alone() -> None:
    """The patterns themselves: what they catch, and what legitimate text they leave."""
    caught = ["DESIGN §4", "(DESIGN §4–§5)", "see DESIGN.md", "the seed document",
              "../shared/seed/external-stage-backends.md", "The seed's five codes", "the seed's laptop"]
    assert all(OUTSIDE.search(text) for text in caught), [t for t in caught if not OUTSIDE.search(t)]
    left = ["seed=SEED + i", "seeded noise", "starting again from its seed", "a DESIGNER",
            "docs/design.md §5", "the seeds 0..N-1"]
    assert not any(OUTSIDE.search(text) for text in left), [t for t in left if OUTSIDE.search(t)]
    caught = ["issue 32", "(issue 18)", "issues 14 and 20", "issue #12", "Issue 14's graph",
              "device tensors (#20)", "as in #12"]
    assert all(ISSUE.search(text) for text in caught), [t for t in caught if not ISSUE.search(t)]
    left = ["an issue the user files", "https://github.com/microsoft/onnxruntime/issues/12345",
            "no issue here", "x = d[#1]", "color: #123456)", "issued 3 times"]
    assert not any(ISSUE.search(text) for text in left), [t for t in left if ISSUE.search(t)]


def test_a_page_may_quote_a_history_title_but_not_cite_an_issue(tmp_path: Path) -> None:
    """The one exception for pages: a section of docs/records/ named by its title in quotes."""
    title = next(t for t in _history_titles() if ISSUE.search(t))
    words = title.split()
    page = tmp_path / "page.md"
    page.write_text(f'History: "{" ".join(words[:2])}\n{" ".join(words[2:])}". Built by issue 13.\n',
                    encoding="utf-8")
    assert _page_issue_hits([page]) == [f"{page}:2: 'issue 13'"]


def test_rule_2_reads_tests_and_citations_wrapped_across_lines(tmp_path: Path) -> None:
    """tests/ is read (this file aside), and a citation broken at a line end is still one."""
    read = _tests()
    assert REPO / "tests" / "adversarial" / "adv_corpus.py" in read
    assert REPO / "tests" / "fixtures" / "ep_reports" / "vitisai_all_npu.json" in read
    assert Path(__file__).resolve() not in read
    source = tmp_path / "wrapped.py"
    source.write_text('"""A 64 B call took ~2 ms (issue\n14). Nothing else."""\n', encoding="utf-8")
    assert _hits([source], ISSUE) == [f"{source}:1: 'issue\\n14'"]
