"""Exit codes, the one definition (DESIGN §5).

The API writes them into records (``outcome.exit_code``) and the CLI exits with them, so both
read them from here.
"""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE"]

#: Placed and passed.
EXIT_OK = 0
#: An error: a corrupt graph, inputs that do not match, a worker that died (a record is written).
EXIT_ERROR = 1
#: Refused: every candidate was refused; the record says why.
EXIT_REFUSED = 2
#: A usage error: the flags contradict each other; nothing ran and no record is written.
EXIT_USAGE = 64
