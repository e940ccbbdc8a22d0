"""One output sink: data to stdout, diagnostics to stderr, JSON mode kept parseable."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["Output"]


class Output:
    """Semantic verbs (result, table, json, warning, error, hint, log) over two consoles."""

    def __init__(self, *, json_mode: bool = False, verbosity: int = 0) -> None:
        self.json_mode = json_mode
        self.verbosity = verbosity
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err = Console(file=sys.stderr, highlight=False, soft_wrap=True)

    def json(self, doc: Any) -> None:
        """Exactly one JSON document on stdout."""
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()

    def result(self, text: str) -> None:
        if not self.json_mode and self.verbosity >= 0:
            self.out.print(text)

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.json_mode or self.verbosity < 0:
            return
        table = Table(title=title, title_justify="left", show_lines=False,
                      show_header=any(columns))
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*["" if v is None else str(v) for v in row])
        self.out.print(table)

    def warning(self, text: str) -> None:
        if self.verbosity >= 0:
            self.err.print(f"[yellow]warning:[/yellow] {text}")

    def error(self, text: str) -> None:
        # Messages are data: "[export]" in a remedy must print as written, not as markup.
        self.err.print(f"[red]error:[/red] {escape(text)}", markup=True)

    def hint(self, text: str) -> None:
        self.err.print(f"[dim]hint:[/dim] {escape(text)}")

    def log(self, text: str) -> None:
        if self.verbosity > 0:
            self.err.print(text, markup=False)
