"""The transport's tuning knobs as one value: read once by the client, sent to the worker.

Why one value: the knobs were environment variables read at import in whichever module used
them, in both processes, so a worker started with another environment (a route env, a remote
host) could wait by other rules than its client. The client builds a ``TransportTuning`` once
(``from_environ``), refuses to start a worker while any knob is malformed (each problem names
the variable and a value that works), and sends ``to_wire()`` in ``load``; the worker takes
``from_wire`` and never reads these variables itself. The defaults and why each is what it is
are in ``docs/configuration.md`` (transport tuning) and next to their uses in ``shm``.

Runs under the worker's interpreter too (Python >= 3.9, standard library only).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

#: Shared-memory modes (``XSTAGE_SHM``).
SHM_MODES = ("auto", "memfd", "named", "off")
#: Doorbells (``XSTAGE_DOORBELL``).
DOORBELLS = ("eventfd", "socket")
#: The most hashing threads (``XSTAGE_MAC_THREADS``) and copy helpers (``XSTAGE_COPY_THREADS``)
#: a knob may ask for.
MAX_THREADS = 16
MAX_COPY_THREADS = 64


@dataclasses.dataclass(frozen=True)
class TransportTuning:
    """Every knob of the transport, with its default; ``None`` for a thread count means
    "this process's default" (it depends on the CPUs the process may run on)."""

    spin_seconds: float = 0.002
    worker_spin_seconds: float = 0.0003
    spin_yield_seconds: float = 0.00005
    heads_up_seconds: float = 0.0001
    near_end_seconds: float = 0.0001
    preempted_seconds: float = 0.0002
    long_call_seconds: float = 0.0002
    crowd_blocks: bool = False
    doorbell: str = "eventfd"
    shm: str = "auto"
    mac_threads: Optional[int] = None
    copy_threads: Optional[int] = None
    max_region_bytes: int = 4 << 30
    attach_fd_seconds: float = 10.0
    wait_trace: Optional[str] = None

    def to_wire(self) -> Dict[str, Any]:
        """The value as the ``load`` message carries it (JSON types only)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, doc: Optional[Mapping[str, Any]]) -> "TransportTuning":
        """The value a client sent; unknown keys (a newer client) are ignored, missing ones
        (an older client) keep their defaults. Raises ``ValueError`` naming a bad field."""
        if not doc:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in doc.items() if k in names}
        problems = [p for p in (_check(k, v) for k, v in kept.items()) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**kept)


_Parser = Callable[[str], Any]


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError
    return value


def _whole(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError
    return value


def _threads(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= MAX_THREADS:
        raise ValueError
    return value


def _copy_threads(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= MAX_COPY_THREADS:
        raise ValueError
    return value


def _flag(raw: str) -> bool:
    return bool(_whole(raw))


def _shm(raw: str) -> str:
    if raw not in SHM_MODES:
        raise ValueError
    return raw


def _doorbell(raw: str) -> str:
    if raw not in DOORBELLS:
        raise ValueError
    return raw


def _path(raw: str) -> str:
    return raw


_SECONDS = "a number >= 0"
_WHOLE = "a whole number >= 0"
#: (environment variable, field, parser, what a good value is, an example), one row per knob.
KNOBS: Tuple[Tuple[str, str, _Parser, str, str], ...] = (
    ("XSTAGE_SPIN_SECONDS", "spin_seconds", _seconds, _SECONDS, "0.002"),
    ("XSTAGE_WORKER_SPIN_SECONDS", "worker_spin_seconds", _seconds, _SECONDS, "0.0003"),
    ("XSTAGE_SPIN_YIELD_SECONDS", "spin_yield_seconds", _seconds, _SECONDS, "0.00005"),
    ("XSTAGE_HEADS_UP_SECONDS", "heads_up_seconds", _seconds, _SECONDS, "0.0001"),
    ("XSTAGE_NEAR_END_SECONDS", "near_end_seconds", _seconds, _SECONDS, "0.0001"),
    ("XSTAGE_PREEMPTED_SECONDS", "preempted_seconds", _seconds, _SECONDS, "0.0002"),
    ("XSTAGE_LONG_CALL_SECONDS", "long_call_seconds", _seconds, _SECONDS, "0.0002"),
    ("XSTAGE_CROWD_BLOCKS", "crowd_blocks", _flag, _WHOLE, "1"),
    ("XSTAGE_DOORBELL", "doorbell", _doorbell, "one of " + ", ".join(DOORBELLS), "socket"),
    ("XSTAGE_SHM", "shm", _shm, "one of " + ", ".join(SHM_MODES), "auto"),
    ("XSTAGE_MAC_THREADS", "mac_threads", _threads, "a whole number from 0 to %d" % MAX_THREADS, "0"),
    ("XSTAGE_COPY_THREADS", "copy_threads", _copy_threads, "a whole number from 0 to %d" % MAX_COPY_THREADS,
     "0"),
    ("XSTAGE_MAX_REGION_BYTES", "max_region_bytes", _whole, _WHOLE, "4294967296"),
    ("XSTAGE_ATTACH_FD_SECONDS", "attach_fd_seconds", _seconds, _SECONDS, "10"),
    ("XSTAGE_WAIT_TRACE", "wait_trace", _path, "a folder", "/tmp/xstage-waits"),
)
#: Fields whose ``None`` means "this process's default".
_OPTIONAL = ("mac_threads", "copy_threads", "wait_trace")


def _check(field: str, value: Any) -> Optional[str]:
    """The problem with one field's value (sent in ``load`` or given as an override), or None."""
    for _variable, name, parse, what, example in KNOBS:
        if name != field:
            continue
        if value is None and name in _OPTIONAL:
            return None
        numeric = parse not in (_shm, _doorbell, _path)
        if numeric and (isinstance(value, str) or value is None):
            return "%s=%r is not %s (e.g. %s)" % (field, value, what, example)
        try:
            parse(str(int(value)) if isinstance(value, bool) else str(value))
        except (TypeError, ValueError):
            return "%s=%r is not %s (e.g. %s)" % (field, value, what, example)
        return None
    return "%r is not a transport knob (known: %s)" % (field, ", ".join(k[1] for k in KNOBS))


def from_environ(environ: Optional[Mapping[str, str]] = None,
                 overrides: Optional[Mapping[str, Any]] = None) -> Tuple[TransportTuning, List[str]]:
    """(the tuning, one problem line per malformed variable): defaults where unset or malformed.

    ``overrides`` (field name to value: a config file's, say) win over the environment. The
    caller refuses to start a worker while the list is not empty.
    """
    env = os.environ if environ is None else environ
    values: Dict[str, Any] = {}
    problems: List[str] = []
    for variable, field, parse, what, example in KNOBS:
        raw = env.get(variable)
        if raw is None or not raw.strip() and field in _OPTIONAL:
            continue
        try:
            values[field] = parse(raw.strip())
        except ValueError:
            problems.append("%s=%r is not %s: unset it or set e.g. %s=%s"
                            % (variable, raw, what, variable, example))
    for field, value in (overrides or {}).items():
        problem = _check(field, value)
        if problem:
            problems.append(problem)
        else:
            values[field] = value
    return TransportTuning(**values), problems
