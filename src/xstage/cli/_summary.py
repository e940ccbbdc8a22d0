"""Prints a record's summary: ``external`` and ``report`` call this, so both show one table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.markup import escape

from xstage.cli._output import Output
from xstage.record import summary_rows

__all__ = ["show_summary"]


def show_summary(doc: Mapping[str, Any], out: Output, *, title: str) -> None:
    """The rows of ``xstage.record.summary``; only the title differs between the commands."""
    # Record text is data, not markup: "[input_ids]" in a message must print as written.
    out.table(escape(title), ["", ""], [[field, escape(text)] for field, text in summary_rows(doc)])
