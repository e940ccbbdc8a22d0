"""The process-wide ``Ledger``: the open stages' reservations against pools read once.

State lives here and only here; every number and verdict comes from the pure ``ledger``
module. A ledger reads each pool's capacity once (the host's available RAM when the ledger is
made; a discrete GPU's memory from the device report the first time that pool is asked for),
so the stages it holds are never counted twice — once in "used RAM", once as reservations.

A reservation is taken *before* its worker starts (two threads opening stages at once cannot
both squeeze into the same room) and released when the stage closes, its worker dies, or
opening it fails. The numeric gate's own processes (its reference worker, its float64
tie-break's child) hold theirs in the same way, only while they run
(``xstage.stage.reference.transient``; docs/memory.md, "The gate's transient reservations").
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xstage import ledger
from xstage.ledger import HOST_POOL, Budget, Fit, Pool

__all__ = ["Holding", "Ledger"]


@dataclass(frozen=True)
class Holding:
    """One open stage's budget, as the ledger holds it."""

    token: int
    label: str
    budget: Budget


def _host_available() -> tuple[int | None, str]:
    try:
        import psutil

        return int(psutil.virtual_memory().available), "available RAM when the ledger was made"
    except Exception as exc:  # noqa: BLE001 - unreadable means unknown, never a silent pass
        return None, f"available RAM could not be read: {exc}"


class Ledger:
    """Pools, read once, and the budgets of the stages open against them. Thread-safe.

    ``capacity`` sets pools by hand (``{"host_ram": "4GiB"}``): to plan for a smaller
    machine, or to give a pool whose capacity cannot be read a number.
    """

    _default: ClassVar[Ledger | None] = None
    _default_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, capacity: Mapping[str, int | str] | None = None) -> None:
        self._overrides = {name: ledger.parse_size(v) for name, v in (capacity or {}).items()}
        available, source = _host_available()
        self._pools: dict[str, Pool] = {HOST_POOL: Pool(HOST_POOL, available, source)}
        for name, size in self._overrides.items():
            self._pools[name] = Pool(name, size, "set by the user")
        self._held: dict[int, tuple[str, Holding]] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def named_pools(self) -> tuple[str, ...]:
        """The pools ``capacity`` named (open_stage checks them against the device table's)."""
        return tuple(self._overrides)

    @classmethod
    def default(cls) -> Ledger:
        """The process-wide ledger ``open_stage`` uses when given none."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def pool(self, name: str, devices: Sequence[Any] = ()) -> Pool:
        """Pool ``name``; a discrete GPU's is read from ``devices`` (device rows) once."""
        with self._lock:
            if name not in self._pools:
                found = ledger.pools_from_devices(devices, host_available=None, host_source="")
                self._pools[name] = found.get(name) or Pool(name, None, "no device row names it")
            return self._pools[name]

    def pools(self) -> list[Pool]:
        """Every pool the ledger knows so far."""
        with self._lock:
            return list(self._pools.values())

    def held_bytes(self, pool: str) -> int:
        """Bytes held in ``pool`` by the stages open now."""
        with self._lock:
            return sum(h.budget.budget_bytes for p, h in self._held.values() if p == pool)

    def holdings(self, pool: str | None = None) -> list[Holding]:
        """The holdings of the open stages (in ``pool``, or all)."""
        with self._lock:
            return [h for p, h in self._held.values() if pool is None or p == pool]

    def reserve(self, budget: Budget, label: str, devices: Sequence[Any] = (),
                also: Sequence[Budget] = ()) -> tuple[Holding | None, Fit]:
        """Hold ``budget`` and ``also`` if all fit; else nothing is held.

        ``also``: budgets of the same stage in other pools (a GPU stage's page-locked host
        memory). The ``Fit`` of the first that does not fit says why; releasing the holding
        releases them all.
        """
        pools = [self.pool(b.pool, devices) for b in (budget, *also)]
        with self._lock:
            fits = []
            for pool, b in zip(pools, (budget, *also), strict=True):
                held = sum(h.budget.budget_bytes for p, h in self._held.values() if p == b.pool)
                fits.append(ledger.check_fit(pool, held, b))
                if not fits[-1].fits:
                    return None, fits[-1]
            holding = Holding(next(self._tokens), label, budget)
            self._held[holding.token] = (budget.pool, holding)
            for b in also:
                self._held[-next(self._tokens)] = (b.pool, Holding(holding.token, label, b))
            return holding, fits[0]

    def release(self, holding: Holding | None) -> None:
        """Give a holding back (idempotent)."""
        if holding is not None:
            with self._lock:
                self._held.pop(holding.token, None)
                for key in [k for k, (_, h) in self._held.items()
                            if k < 0 and h.token == holding.token]:
                    del self._held[key]  # its budgets in other pools
