"""The memory ledger's arithmetic: pools, reservations, budgets and verdicts. Pure.

CPU, integrated GPU and NPU stages all allocate from the host's RAM, so they share one pool,
``host_ram``, counted once; each discrete GPU has its own, ``vram:<device>``. A stage's
*budget* is what it may hold in its pool: the larger of its load phase (what a session holds
while it is being built: the parsed model beside the runtime's copies) and its steady phase
(the session plus what one call needs), never their naive sum, plus a margin. A pool's
*capacity* is read once when a ledger is made (the host's available RAM then), so a stage the
ledger already holds is never counted twice: once as used RAM, once as its reservation.

The verdicts: before any worker starts, a budget that does not fit what the pool has left is
``over_budget``, and a pool whose capacity could not be read is ``capacity_unknown`` (never a
silent pass). After the warm-up, the worker's own measured peak is compared with the budget:
``peak_over_budget`` above it, ``peak_unreported`` when there is no figure at all.

Numbers carry their evidence: ``D`` read from files, ``E`` estimated (with the measurement
behind the estimate written beside it), ``M`` measured in this run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from xstage import errors

__all__ = [
    "EVIDENCE",
    "HOST_POOL",
    "LIFETIMES",
    "MARGIN",
    "Budget",
    "Fit",
    "Pool",
    "Reservation",
    "blind_spots",
    "check_fit",
    "format_bytes",
    "make_budget",
    "parse_pool_arg",
    "parse_size",
    "pools_from_devices",
]

HOST_POOL = "host_ram"
LIFETIMES = ("load", "session", "request")
EVIDENCE = ("D", "E", "M")
#: Share of the larger phase added on top. The estimates below it were each calibrated to
#: cover the measured peak on their own; the margin absorbs what a calibration run did not
#: see (allocator rounding, a runtime version's drift). A measured peak over the budget is
#: still caught after the warm-up, so the margin is not the last line.
MARGIN = 0.25


@dataclass(frozen=True)
class Pool:
    """A memory pool and what it can hold (``None``: its capacity could not be read)."""

    name: str
    capacity_bytes: int | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "capacity_bytes": self.capacity_bytes, "source": self.source}


@dataclass(frozen=True)
class Reservation:
    """One thing a stage holds: what, how many bytes, where, for how long, how we know."""

    purpose: str
    bytes: int
    pool: str
    lifetime: str  # load | session | request
    evidence: str  # D | E | M
    basis: str  # why the number is what it is

    def __post_init__(self) -> None:
        if self.lifetime not in LIFETIMES:
            raise ValueError(f"lifetime {self.lifetime!r} is not one of {LIFETIMES}")
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r} is not one of {EVIDENCE}")
        if self.bytes < 0:
            raise ValueError(f"reservation {self.purpose!r} has {self.bytes} bytes")

    def to_dict(self) -> dict[str, Any]:
        return {"purpose": self.purpose, "bytes": self.bytes, "pool": self.pool,
                "lifetime": self.lifetime, "evidence": self.evidence, "basis": self.basis}


@dataclass(frozen=True)
class Budget:
    """A stage's reservations in one pool and the budget they add up to."""

    pool: str
    reservations: tuple[Reservation, ...]
    load_bytes: int  # load + session lifetimes
    steady_bytes: int  # session + request lifetimes
    budget_bytes: int  # the larger phase, margin included

    @property
    def phase(self) -> str:
        """The phase that sets the budget."""
        return "load" if self.load_bytes > self.steady_bytes else "steady"

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "reservations": [r.to_dict() for r in self.reservations],
                "load_bytes": self.load_bytes, "steady_bytes": self.steady_bytes,
                "budget_bytes": self.budget_bytes, "phase": self.phase}


def make_budget(reservations: Iterable[Reservation], *, pool: str,
                margin: float = MARGIN) -> Budget:
    """The budget of ``reservations`` (all in ``pool``): max(load, steady) plus the margin,
    which is added as a reservation of its own so the record shows it.

    Raises:
        ValueError: a reservation in another pool.
    """
    items = list(reservations)
    for r in items:
        if r.pool != pool:
            raise ValueError(f"reservation {r.purpose!r} is in {r.pool}, the budget in {pool}")
    load = sum(r.bytes for r in items if r.lifetime in ("load", "session"))
    steady = sum(r.bytes for r in items if r.lifetime in ("session", "request"))
    extra = math.ceil(max(load, steady) * margin)
    items.append(Reservation(
        "margin", extra, pool, "session", "E",
        f"{margin:.0%} of the larger phase ({'load' if load > steady else 'steady'}, "
        f"{format_bytes(max(load, steady))}): what the calibration runs did not see"))
    return Budget(pool=pool, reservations=tuple(items), load_bytes=load + extra,
                  steady_bytes=steady + extra, budget_bytes=max(load, steady) + extra)


@dataclass(frozen=True)
class Fit:
    """Whether a budget fits what its pool has left, before any worker starts."""

    fits: bool
    cause: str | None  # None | over_budget | capacity_unknown
    pool: Pool
    held_bytes: int  # what the ledger already holds in this pool
    budget_bytes: int

    @property
    def free_bytes(self) -> int | None:
        if self.pool.capacity_bytes is None:
            return None
        return self.pool.capacity_bytes - self.held_bytes

    def message(self) -> str:
        cap = self.pool.capacity_bytes
        if self.cause == "capacity_unknown":
            return (f"the capacity of pool {self.pool.name} could not be read "
                    f"({self.pool.source}); a budget of {format_bytes(self.budget_bytes)} "
                    "cannot be checked against it")
        held = f", {format_bytes(self.held_bytes)} of it held by open stages" if self.held_bytes else ""
        verb = "fits" if self.fits else "does not fit"
        return (f"a budget of {format_bytes(self.budget_bytes)} {verb} pool {self.pool.name}: "
                f"{format_bytes(cap or 0)} ({self.pool.source}){held}, "
                f"{format_bytes(max(self.free_bytes or 0, 0))} free")

    def remedy(self) -> str:
        if self.cause == "capacity_unknown":
            return (f"set it: --pool {self.pool.name}=SIZE (e.g. 8GiB), or "
                    f"Ledger(capacity={{'{self.pool.name}': '8GiB'}})")
        return ("close stages this process holds, free memory on the device, or plan for a "
                f"larger pool only if it really has the room (--pool {self.pool.name}=SIZE)")

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "cause": self.cause, "pool": self.pool.to_dict(),
                "held_bytes": self.held_bytes, "free_bytes": self.free_bytes,
                "budget_bytes": self.budget_bytes}


def check_fit(pool: Pool, held_bytes: int, budget: Budget) -> Fit:
    """Does ``budget`` fit ``pool`` with ``held_bytes`` already reserved there?"""
    if pool.capacity_bytes is None:
        return Fit(False, "capacity_unknown", pool, held_bytes, budget.budget_bytes)
    fits = held_bytes + budget.budget_bytes <= pool.capacity_bytes
    return Fit(fits, None if fits else "over_budget", pool, held_bytes, budget.budget_bytes)


# --------------------------------------------------------------------------- pools
def pools_from_devices(devices: Sequence[Any], *, host_available: int | None,
                       host_source: str) -> dict[str, Pool]:
    """Each pool the device rows name, with its capacity.

    ``host_ram`` takes ``host_available`` (the caller reads it once); a discrete GPU's pool
    its free memory where the probe reported it, else its total (said so), else unknown.
    """
    pools: dict[str, Pool] = {HOST_POOL: Pool(HOST_POOL, host_available, host_source)}
    for dev in devices:
        name = dev.pool
        if name == HOST_POOL or name in pools:
            continue
        if dev.available_bytes:
            pools[name] = Pool(name, int(dev.available_bytes), f"free memory reported for {dev.id}")
        elif dev.memory_bytes:
            pools[name] = Pool(name, int(dev.memory_bytes),
                               f"total memory of {dev.id} (its free memory was not reported)")
        else:
            pools[name] = Pool(name, None, f"no memory figure for {dev.id}")
    return pools


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1 << 10, "M": 1000**2, "MB": 1000**2,
          "MIB": 1 << 20, "G": 1000**3, "GB": 1000**3, "GIB": 1 << 30, "T": 1000**4,
          "TB": 1000**4, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """``4GiB``, ``8GB``, ``512MiB``, ``1.5G`` or a plain number of bytes → bytes.

    Raises:
        UsageError: anything else.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise errors.UsageError(f"a pool size cannot be negative ({text})")
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise errors.UsageError(
            f"{text!r} is not a size", remedy="write it like 4GiB, 8GB, 512MiB or a byte count")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_pool_arg(text: str) -> tuple[str, int]:
    """``NAME=SIZE`` split on the last ``=`` (pool names hold colons), e.g.
    ``vram:gpu_discrete:nvidia:0=8GB``.

    Raises:
        UsageError: no ``=``, an empty name, or a bad size.
    """
    name, sep, size = text.rpartition("=")
    if not sep or not name.strip():
        raise errors.UsageError(f"--pool {text!r} is not NAME=SIZE",
                                remedy="e.g. --pool host_ram=4GiB")
    return name.strip(), parse_size(size)


def format_bytes(n: int | float) -> str:
    """Binary units, one decimal: ``1.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover


def blind_spots(device_kind: str, pool: str) -> list[str]:
    """What the worker's own figures cannot see for a stage on this kind of device."""
    spots = []
    if device_kind in ("gpu_integrated", "npu"):
        spots.append(
            f"memory the {device_kind.replace('_', ' ')} driver allocates for this stage in "
            "host RAM outside the worker's working set (shared GPU/NPU buffers) is not in "
            "the measured peak")
    if pool != HOST_POOL:
        spots.append(f"the worker's own host RAM is not charged to {HOST_POOL}; this stage's "
                     f"budget is in {pool}")
    return spots
