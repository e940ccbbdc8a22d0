"""Per-phase deadlines for a worker: each phase has its own limit and its own timeout class."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Deadlines"]


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
