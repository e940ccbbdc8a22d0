"""The README and docs/ link only inside the repository, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_stay_in_the_repository_and_resolve(doc: Path) -> None:
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            bad.append(target)
    assert not bad, f"{doc.relative_to(REPO)} links outside the repository or to nothing: {bad}"
