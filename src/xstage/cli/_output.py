"""One output sink: data to stdout, diagnostics to stderr, JSON mode kept parseable.

``--json`` means one thing on every command (``_flags.add_json_flag``): without a value (or
``-``), one JSON document on stdout and nothing else there — the human view (summary, tables,
results) goes to stderr with the diagnostics; with a path, the document is written there
(``xstage.home.write_output``: atomic, a folder never created, links and devices handled) and
the human view stays on stdout.

Off a terminal, tables print at their full width (no wrapping inside a word: a pipe reads
whole cells) unless ``COLUMNS`` sets a width.

Text is data: every string a verb prints passes ``visible`` (``xstage.record._text``) first,
so a record's strings, a path or a worker's log cannot carry a terminal control sequence (ESC,
OSC, CSI, any other C0 or C1 control, a bidirectional override) to the terminal; each prints
as its ``\\xNN`` or ``\\uNNNN`` escape instead. Callers escape rich markup in data
(``rich.markup.escape``), so ``[link=…]`` in a record prints as written, never as a link.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from xstage import errors
from xstage.home import write_output
from xstage.record._text import visible

__all__ = ["Output", "Task", "dumps_json"]

#: The width a table may take off a terminal: wide enough for any row, so no cell wraps.
_PIPE_WIDTH = 10_000
#: Off a terminal, a task says where it is after this long, then at this interval (seconds):
#: a short task stays silent, a long one is never silent for long.
PIPE_FIRST_S, PIPE_EVERY_S = 2.0, 5.0


class Task:
    """One long task's progress: ``update(completed=…, description=…)`` from the work's callbacks.

    On a terminal it drives a rich progress bar (a spinner where the total is unknown); off one,
    a ticker thread prints one plain line to stderr after ``PIPE_FIRST_S`` and then every
    ``PIPE_EVERY_S`` seconds, with the count where there is one.
    """

    def __init__(self, label: str, total: int | None, unit: str) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.completed = 0
        self.description = ""
        self._bar: Progress | None = None
        self._task: Any = None

    def update(self, *, completed: int | None = None, advance: int = 0,
               description: str | None = None) -> None:
        self.completed = completed if completed is not None else self.completed + advance
        if description is not None:
            self.description = description
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, description=self.description)

    def line(self, elapsed: float) -> str:
        count = (f": {self.completed}/{self.total} {self.unit}" if self.total
                 else f": {self.completed} {self.unit}" if self.completed else "")
        detail = f" ({self.description})" if self.description else ""
        return f"{self.label}{count}{detail}, {elapsed:.0f} s"


def dumps_json(doc: Any) -> str:
    """One JSON document as every command prints it: sorted keys, indent 2, trailing newline."""
    return json.dumps(doc, indent=2, sort_keys=True, default=str, ensure_ascii=False) + "\n"


def _names_stdout(target: str | None) -> bool:
    """Whether a ``--json`` path is this process's stdout (``/dev/stdout``, or the very file
    stdout is redirected to): then it is ``-``, so the human view moves to stderr."""
    if target in (None, "-"):
        return False
    if target in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        return True
    try:
        return os.path.samestat(os.stat(target), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def _console(file: Any) -> Console:
    piped = not (hasattr(file, "isatty") and file.isatty()) and not os.environ.get("COLUMNS")
    return Console(file=file, highlight=False, soft_wrap=True, width=_PIPE_WIDTH if piped else None)


class Output:
    """Semantic verbs (result, table, json, warning, error, hint, log) over two consoles.

    Args:
        json_target: ``None`` (no JSON), ``"-"`` (one document on stdout) or a path.
        verbosity: -1 quiet, 0 normal, >0 more diagnostics.
        json_mode: the old spelling of ``json_target="-"``.
    """

    def __init__(self, *, json_target: str | None = None, verbosity: int = 0,
                 json_mode: bool = False) -> None:
        self.json_target = "-" if json_mode and json_target is None else json_target
        if _names_stdout(self.json_target):
            self.json_target = "-"
        self.verbosity = verbosity
        self.err = _console(sys.stderr)
        # With JSON on stdout, the human view goes to stderr: stdout holds the document alone.
        self.out = self.err if self.json_target == "-" else _console(sys.stdout)
        self.wrote_json: str | None = None

    @property
    def json_mode(self) -> bool:
        """Whether stdout holds one JSON document (``--json`` or ``--json -``)."""
        return self.json_target == "-"

    def json(self, doc: Any) -> None:
        """Exactly one JSON document on stdout."""
        sys.stdout.write(dumps_json(doc))
        sys.stdout.flush()

    def emit(self, doc: Any, *, text: str | None = None) -> None:
        """The command's JSON document where ``--json`` says: stdout, or its path.

        ``text`` is the document already serialized (a record's own deterministic text).

        Raises:
            UsageError: the path breaks ``write_output``'s rules.
            XstageError: the file could not be written.
        """
        if self.json_target is None:
            return
        body = text if text is not None else dumps_json(doc)
        if self.json_target == "-":
            sys.stdout.write(body)
            sys.stdout.flush()
            return
        try:
            write_output(self.json_target, body.encode("utf-8"), flag="--json")
        except OSError as exc:
            raise errors.XstageError(f"could not write --json {self.json_target}: {exc.strerror or exc}",
                                     remedy="choose a writable --json path") from None
        self.wrote_json = self.json_target
        self.log(f"JSON written to {self.json_target}")

    def emit_record(self, doc: Any, text: str, home_copy: Any) -> None:
        """A record already written to ``home_copy`` (under ``XSTAGE_HOME``): say where, then
        ``emit`` it; a ``--json`` that cannot be written names the copy that was.

        Raises:
            UsageError: the ``--json`` path breaks ``write_output``'s rules.
            XstageError: the ``--json`` file could not be written.
        """
        if self.verbosity >= 0:
            self.err.print(f"record written to {visible(home_copy)}", markup=False,
                           highlight=False)
        try:
            self.emit(doc, text=text)
        except errors.UsageError:
            raise
        except errors.XstageError as exc:
            raise errors.XstageError(exc.message, remedy=f"the record is at {home_copy}; choose a "
                                     "writable --json path") from None

    @contextlib.contextmanager
    def progress(self, label: str, *, total: int | None = None, unit: str = "") -> Iterator[Task]:
        """A progress indicator for the block (quiet: none); see ``Task``."""
        task = Task(label, total, unit)
        if self.verbosity < 0:
            yield task
            return
        if self.err.is_terminal:
            columns: list[Any] = [SpinnerColumn(), TextColumn(f"[dim]{escape(label)}[/dim]")]
            if total:
                columns += [BarColumn(), MofNCompleteColumn()]
            columns += [TextColumn("{task.description}"), TimeElapsedColumn()]
            with Progress(*columns, console=self.err, transient=True) as bar:
                task._bar, task._task = bar, bar.add_task("", total=total)
                yield task
            return
        stop = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            wait = PIPE_FIRST_S
            while not stop.wait(wait):
                sys.stderr.write(task.line(time.monotonic() - start) + "\n")
                sys.stderr.flush()
                wait = PIPE_EVERY_S

        ticker = threading.Thread(target=tick, name="xstage-progress", daemon=True)
        ticker.start()
        try:
            yield task
        finally:
            stop.set()
            ticker.join()

    def result(self, text: str) -> None:
        if self.verbosity >= 0:
            self.out.print(visible(text))

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.verbosity < 0:
            return
        table = Table(title=visible(title), title_justify="left", show_lines=False,
                      show_header=any(columns))
        for col in columns:
            table.add_column(visible(col), overflow="fold")
        for row in rows:
            table.add_row(*["" if v is None else visible(v) for v in row])
        self.out.print(table)

    def warning(self, text: str) -> None:
        if self.verbosity >= 0:
            self.err.print(f"[yellow]warning:[/yellow] {visible(text)}")

    def error(self, text: str) -> None:
        # Messages are data: "[export]" in a remedy must print as written, not as markup.
        self.err.print(f"[red]error:[/red] {escape(visible(text))}", markup=True)

    def hint(self, text: str) -> None:
        self.err.print(f"[dim]hint:[/dim] {escape(visible(text))}")

    def log(self, text: str) -> None:
        if self.verbosity > 0:
            self.err.print(visible(text), markup=False)
