"""The HTML report: self-contained, escaped, and — in headless Chromium — saying the outcome and the split."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from xstage.report import build_view, compare_views
from xstage.report.html import render_compare, render_report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "svg", "script")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "svg", "script")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return re.sub(r"\s+", " ", " ".join(parser.parts))


def _fetches(html: str) -> list[str]:
    """What a browser would fetch: scripts, links, sources, CSS urls (not SVG's #ids), remote hrefs."""
    return re.findall(r"<script|<link|<img|<iframe|\bsrc=|url\((?!#)|href=\"(?:https?:)?//", html)


def test_every_record_renders_one_self_contained_page(records):
    for name, rec in records.items():
        html = render_report(build_view(rec))
        assert html.startswith("<!DOCTYPE html>") and html.count("<html") == 1, name
        assert _fetches(html) == [], name


def test_the_page_leads_with_the_outcome_then_the_sections_in_order(records):
    text = page_text(render_report(build_view(records["split"])))
    order = [
        "placed (exit 0)",
        "Split by op type",
        "Kernel timeline",
        "Round trip",
        "Parity per output",
        "Memory",
        "Provenance",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions), text[:400]
    assert "left on the CPU: Det: det" in text


def test_plots_are_inline_svg_with_text_kept_as_text(records):
    html = render_report(build_view(records["split"]))
    assert html.count("<svg") >= 5
    assert "nodes by op type and provider" in html  # svg.fonttype none: titles are <text>


def test_text_from_the_record_is_escaped(records):
    rec = copy.deepcopy(records["error"])  # a real record, its message made hostile
    rec["outcome"]["error"]["message"] = "<script>alert(1)</script> & more"
    html = render_report(build_view(rec))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in html


def test_the_comparison_is_one_page_with_the_changes_first(records):
    html = render_compare(
        compare_views(build_view(records["ppocr-cls.ort-cpu"]), build_view(records["ppocr-cls.ort-openvino"]))
    )
    assert _fetches(html) == []
    text = page_text(html)
    assert text.index("What changed") < text.index("Nodes that changed side")
    assert "A: ort-cpu on cpu" in text and "B: ort-openvino on cpu" in text


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
)
def test_headless_chromium_shows_the_outcome_and_the_split(records, tmp_path):
    """Rendered by a real browser: the text the page shows (its DOM after load), not pixels."""
    page = tmp_path / "split.html"
    page.write_text(render_report(build_view(records["split"])), encoding="utf-8")
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = page_text(done.stdout)
    assert "placed (exit 0) — placed on cpu via ort-openvino" in text
    assert "node fraction 75.0% (plan)" in text
    assert re.search(r"Det 0 1 0 0 0 \d+ 0", text), text  # the split table's Det row: on the CPU
    assert "left on the CPU: Det: det" in text
