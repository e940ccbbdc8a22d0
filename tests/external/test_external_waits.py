"""``xstage external --verbose`` says what the doorbell decided over the timed runs."""

from __future__ import annotations

import re


def test_verbose_prints_the_doorbells_decisions_on_both_sides(external):
    r = external("-v")
    assert r.code == 0, r.stderr
    for side in ("caller", "worker"):
        line = re.search(rf"doorbell \({side}\): spin \d+ \(.*\), block \d+ \(.*\)", r.stderr)
        assert line, f"no decision line for the {side} in:\n{r.stderr}"


def test_without_verbose_the_decisions_are_not_printed(external):
    r = external()
    assert r.code == 0, r.stderr
    assert "doorbell (" not in r.stderr
