"""The adversarial corpus's table of classes and counts, printed at the end of the run."""

from __future__ import annotations

import adv_corpus


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the table when any corpus case ran (``pytest -s`` or not)."""
    seed = getattr(adv_corpus, "SEED", None)
    if seed is None or not adv_corpus.RESULTS:
        return
    terminalreporter.write_sep("-", "adversarial corpus (issue 11)")
    terminalreporter.write_line(adv_corpus.table(seed))
