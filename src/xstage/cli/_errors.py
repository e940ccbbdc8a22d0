"""Error wording: exception type → one line and a hint; subclasses first."""

from __future__ import annotations

from collections.abc import Callable

from xstage import errors as E

__all__ = ["CLI_ERROR_FORMATTERS", "format_known"]


def _worker_died(exc: E.WorkerDied) -> tuple[str, str | None]:
    tail = exc.log_tail.strip()
    line = exc.message + (f"\n--- worker log (last lines) ---\n{tail}" if tail else "")
    return line, exc.remedy


def _worker_raised(exc: E.WorkerRaised) -> tuple[str, str | None]:
    return f"{exc.message} ({exc.kind})", exc.remedy


def _default(exc: E.XstageError) -> tuple[str, str | None]:
    return exc.message, exc.remedy


#: Ordered: the first isinstance match wins, so subclasses come before their parents.
CLI_ERROR_FORMATTERS: list[tuple[type[E.XstageError], Callable]] = [
    (E.WorkerDied, _worker_died),
    (E.WorkerRaised, _worker_raised),
    (E.XstageError, _default),
]


def format_known(exc: BaseException) -> tuple[str, str | None] | None:
    """(line, hint) for a known exception, or None for a bug that must stay loud."""
    for typ, fmt in CLI_ERROR_FORMATTERS:
        if isinstance(exc, typ):
            return fmt(exc)
    return None
