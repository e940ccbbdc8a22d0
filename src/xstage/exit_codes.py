"""The exit codes of ``xstage``, defined once.

They live below the CLI because a record carries one too (``outcome.exit_code``, pinned by the
record schema's enum): the stage layer writes it, the CLI returns it, and a test checks that
the two and the schema agree.

Cases:

1. ``EXIT_OK`` (0): the command did what was asked (for ``external``: placed and passed).
2. ``EXIT_ERROR`` (1): an anticipated failure (a corrupt graph, a worker that died).
3. ``EXIT_REFUSED`` (2): a decision, not a failure; every refused run still writes a record.
4. ``EXIT_USAGE`` (64, sysexits' ``EX_USAGE``): bad flags. argparse's own 2 would read as
   "refused", so the CLI's parser exits 64 instead.
5. ``EXIT_INTERRUPTED`` (130 = 128 + SIGINT): Ctrl-C; never written to a record.
"""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "RECORD_EXIT_CODES",
           "exit_code_for"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
EXIT_USAGE = 64
EXIT_INTERRUPTED = 130

#: The codes a record's ``outcome.exit_code`` may hold (the schema's enum).
RECORD_EXIT_CODES = (EXIT_OK, EXIT_ERROR, EXIT_REFUSED, EXIT_USAGE)

_BY_STATUS = {"placed": EXIT_OK, "refused": EXIT_REFUSED, "error": EXIT_ERROR}


def exit_code_for(status: str) -> int:
    """The exit code of a record's ``outcome.status`` (cases 1-3)."""
    return _BY_STATUS[status]
