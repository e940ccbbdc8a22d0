"""The one exception tree of xstage.

Everything xstage raises on purpose is an ``XstageError``; anything else is a bug and stays
loud. The CLI maps each class to one line and a hint (``xstage.cli._errors``).

::

    XstageError
    ├── UsageError                 the caller asked for something inconsistent
    │   └── ForkedStage            a stage used from a forked child of its process
    ├── ArtifactError              a graph or artifact file cannot be used
    ├── InputError                 inputs do not match the stage's declared signature
    ├── RecordError                a record is unreadable or fails its schema
    ├── EnvError                   building or removing a route environment failed
    ├── StageClosed                a call after close() or after the worker died (a RuntimeError too)
    ├── RouteMissing               a route was required and did not resolve
    ├── RuntimeMissing             this interpreter has no onnxruntime, or one too old
    ├── NoSpace                    a file could not be written for want of space (an OSError too)
    ├── SlotsBusy                  no slot set came free for ``input_slots`` in its timeout
    ├── StateUncertain             a call after an interrupted one may have moved the state
    ├── Refused                    every candidate was refused (``.refusals`` says why)
    ├── ProtocolError              a frame broke the wire spec (docs/wire.md)
    │   ├── LocalProtocolError     we were about to send a bad frame
    │   └── RemoteProtocolError    the worker sent a bad frame
    └── WorkerError                the worker process failed us
        ├── WorkerDied             it exited (status and log tail attached)
        ├── WorkerRaised           it raised (remote traceback attached)
        └── WorkerTimeout          a phase deadline passed
            ├── SpawnTimeout
            ├── HelloTimeout
            ├── LoadTimeout
            ├── WarmupTimeout
            ├── CallTimeout
            └── ShutdownTimeout

Misuse of an object's lifecycle is also a ``RuntimeError``, apart from operational failures:
``StageClosed`` (a call after ``close()`` or after the worker died) is an ``XstageError`` and a
``RuntimeError``, so ``except XstageError`` catches every error xstage raises on purpose.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "ArtifactError",
    "CallTimeout",
    "EnvError",
    "ForkedStage",
    "HelloTimeout",
    "InputError",
    "LoadTimeout",
    "LocalProtocolError",
    "NoSpace",
    "ProtocolError",
    "RecordError",
    "Refused",
    "RemoteProtocolError",
    "RouteMissing",
    "RuntimeMissing",
    "ShutdownTimeout",
    "SlotsBusy",
    "SpawnTimeout",
    "StageClosed",
    "StateUncertain",
    "UsageError",
    "WarmupTimeout",
    "WorkerDied",
    "WorkerError",
    "WorkerRaised",
    "WorkerTimeout",
    "XstageError",
]


class XstageError(Exception):
    """Raised for every failure xstage anticipates; carries an optional remedy.

    ``record`` is the record of the run the error ended, where the API made one
    (``open_stage`` attaches it), so the CLI writes the API's record instead of its own.
    """

    record: dict[str, Any] | None = None

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy


class UsageError(XstageError):
    """Raised when flags or arguments contradict each other or name nothing that exists."""


class ForkedStage(UsageError):
    """Raised when a stage or worker client is used from a process that did not open it.

    A forked child (``os.fork``, multiprocessing's fork start method, a DataLoader worker);
    open the stage in the child instead.
    """


class ArtifactError(XstageError):
    """Raised when a graph or artifact cannot be read, parsed or loaded."""


class InputError(XstageError):
    """Raised when inputs differ from the stage's declared names, dtypes or shapes."""


class RecordError(XstageError):
    """Raised when a record file is unreadable or does not match its schema."""


class EnvError(XstageError):
    """Raised when a route environment cannot be created, listed or removed."""


class RouteMissing(XstageError):
    """Raised when a route was pinned and did not resolve; carries its reason code."""

    def __init__(self, message: str, *, reason_code: str, remedy: str | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.reason_code = reason_code


class RuntimeMissing(XstageError):
    """Raised when this interpreter has no onnxruntime distribution, or one older than supported."""


class NoSpace(XstageError, OSError):
    """Raised when a file could not be written for want of space (``ENOSPC``, ``EDQUOT``).

    An ``OSError`` too (``errno``, ``filename``), so code that caught the raw error still does;
    the message names the path and the remedy the folder to free or to move ``XSTAGE_HOME`` to.
    """

    def __init__(self, path: str | os.PathLike[str], cause: OSError, *,
                 what: str = "write") -> None:
        where = os.fspath(path) if os.path.isdir(path) else os.path.dirname(os.fspath(path)) or "."
        XstageError.__init__(
            self, f"no space left to {what} {os.fspath(path)} "
            f"({cause.strerror or os.strerror(_errno.ENOSPC)})",
            remedy=f"free space on the file system that holds {where} (df {where}), or set "
            "XSTAGE_HOME to a folder on a disk with room")
        self.errno = cause.errno if cause.errno is not None else _errno.ENOSPC
        self.strerror = cause.strerror or os.strerror(_errno.ENOSPC)
        self.filename = os.fspath(path)

    def __str__(self) -> str:
        return self.message


#: The errors that mean "no room": a full file system or a user's quota.
_FULL = frozenset({_errno.ENOSPC, getattr(_errno, "EDQUOT", _errno.ENOSPC)})


def is_full_disk(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for want of space (``shutil.Error`` included)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in _FULL:
        return True
    reasons = exc.args[0] if exc.args and isinstance(exc.args[0], list) else ()
    full = os.strerror(_errno.ENOSPC)
    return any(isinstance(r, tuple) and full in str(r[-1]) for r in reasons)


@contextlib.contextmanager
def naming_full_disk(path: str | os.PathLike[str], *, what: str = "write") -> Iterator[None]:
    """Turn a full disk while writing ``path`` into ``NoSpace`` naming it; the rest passes."""
    try:
        yield
    except NoSpace:
        raise
    except OSError as exc:
        if is_full_disk(exc):
            raise NoSpace(path, exc, what=what) from exc
        raise


class SlotsBusy(XstageError):
    """Raised when ``input_slots(timeout=...)`` found no free slot set in time.

    Every set was in flight or reserved by slots handed out before; nothing was reserved.
    """


class StateUncertain(XstageError):
    """Raised when a call of a stage with state follows an interrupted call that moved it.

    Or may have moved it; ``reset_state()`` ends it (the next call runs from the initial state).
    """


class Refused(XstageError):
    """Raised when no candidate passed; ``refusals`` holds each structured refusal.

    Raised only where nothing usable can be returned (``xstage.open_stage``); the CLI turns
    it into a record and exit status 2.
    """

    def __init__(self, message: str, *, refusals: Sequence[Any], remedy: str | None = None,
                 record: dict[str, Any] | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.refusals = list(refusals)
        self.record = record


class ProtocolError(XstageError):
    """Raised when a frame breaks the wire spec."""


class LocalProtocolError(ProtocolError):
    """Raised when the client was about to send a frame the spec forbids."""


class RemoteProtocolError(ProtocolError):
    """Raised when the worker sent a frame the spec forbids."""


class WorkerError(XstageError):
    """Raised when the worker process fails; names the route, pid and generation where known."""

    def __init__(
        self,
        message: str,
        *,
        remedy: str | None = None,
        pid: int | None = None,
        log_tail: str = "",
        generation: int | None = None,
    ) -> None:
        super().__init__(message, remedy=remedy)
        self.pid = pid
        self.log_tail = log_tail
        #: The worker's generation in its stage (1 for the first worker), where known.
        self.generation = generation


class WorkerDied(WorkerError):
    """Raised when the worker exited; ``exit_status``, ``generation`` and ``log_tail`` say how.

    ``idle`` is true when the worker had exited before the call that raised it sent anything
    (it died while idle): that call never reached it, and a restarted stage serves it.
    """

    idle = False

    def __init__(
        self,
        message: str,
        *,
        exit_status: int | None,
        remedy: str | None = None,
        pid: int | None = None,
        log_tail: str = "",
        generation: int | None = None,
    ) -> None:
        super().__init__(message, remedy=remedy, pid=pid, log_tail=log_tail,
                         generation=generation)
        self.exit_status = exit_status


class WorkerRaised(WorkerError):
    """Raised when the worker caught an exception; ``kind`` and ``remote_traceback`` say which."""

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        remote_traceback: str = "",
        remedy: str | None = None,
        pid: int | None = None,
    ) -> None:
        super().__init__(message, remedy=remedy, pid=pid)
        self.kind = kind
        self.remote_traceback = remote_traceback


class WorkerTimeout(WorkerError):
    """Raised when a phase deadline passed; ``phase`` and ``seconds`` say which."""

    phase = "call"

    def __init__(self, seconds: float, *, pid: int | None = None, log_tail: str = "") -> None:
        super().__init__(
            f"worker {self.phase} deadline of {seconds:g} s passed",
            remedy=f"raise the {self.phase} deadline (Deadlines({self.phase}=...)) "
            "if the device is slow, or look at the worker log",
            pid=pid,
            log_tail=log_tail,
        )
        self.seconds = seconds


class SpawnTimeout(WorkerTimeout):
    """Raised when the interpreter did not start in time."""

    phase = "spawn"


class HelloTimeout(WorkerTimeout):
    """Raised when the worker started but sent no hello in time."""

    phase = "hello"


class LoadTimeout(WorkerTimeout):
    """Raised when loading (session creation, compilation) took too long."""

    phase = "load"


class WarmupTimeout(WorkerTimeout):
    """Raised when the profiled warm-up run took too long."""

    phase = "warmup"


class CallTimeout(WorkerTimeout):
    """Raised when one call took too long; the worker is killed, the stage is dead."""

    phase = "call"


class ShutdownTimeout(WorkerTimeout):
    """Raised when the worker did not exit in time after being asked; it is then killed."""

    phase = "shutdown"


class StageClosed(XstageError, RuntimeError):
    """Raised on a call to a worker or stage that was closed or whose worker died."""
