"""Per-phase deadlines for a worker: each phase has its own limit and its own timeout class."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from xstage import errors

__all__ = ["PHASES", "Deadlines", "parse_timeouts"]

#: The phases, in the order a worker passes through them.
PHASES = ("spawn", "hello", "load", "warmup", "call", "shutdown")


@dataclass(frozen=True)
class Deadlines:
    """Seconds allowed per phase; ``None`` means no limit.

    The defaults are generous where devices are slow to start: an NPU compile of a large
    graph takes many minutes, so ``load`` and ``warmup`` default to 30 minutes, while a
    worker that has not said hello after a minute is broken, not slow.
    """

    spawn: float | None = 30.0
    hello: float | None = 60.0
    load: float | None = 1800.0
    warmup: float | None = 1800.0
    call: float | None = 600.0
    shutdown: float | None = 5.0

    def __post_init__(self) -> None:
        for name in ("spawn", "hello", "load", "warmup", "call", "shutdown"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"deadline {name}={value!r} must be positive or None")


def parse_timeouts(items: Iterable[str], base: Deadlines | None = None) -> Deadlines | None:
    """``--timeout PHASE=SECONDS`` (repeatable) → ``Deadlines``; None when none was given.

    Raises:
        UsageError: an item is not ``PHASE=SECONDS``, names an unknown phase or a phase
            twice, or gives seconds that are not a finite number > 0.
    """
    given: dict[str, float] = {}
    for item in items:
        phase, sep, raw = item.partition("=")
        phase = phase.strip()
        if not sep:
            raise errors.UsageError(f"--timeout {item!r} is not PHASE=SECONDS",
                                    remedy="e.g. --timeout call=30 --timeout warmup=600")
        if phase not in PHASES:
            raise errors.UsageError(f"--timeout names an unknown phase {phase!r}",
                                    remedy=f"phases: {', '.join(PHASES)}")
        if phase in given:
            raise errors.UsageError(f"--timeout names {phase} twice")
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds <= 0:
            raise errors.UsageError(f"--timeout {phase}={raw!r} is not a number of seconds > 0",
                                    remedy=f"e.g. --timeout {phase}=30")
        given[phase] = seconds
    if not given:
        return base
    return replace(base or Deadlines(), **given)
