"""xstage: run one model stage on a device the host engine cannot drive, and prove where it ran.

The public surface is small on purpose: ``open_stage()`` → ``Stage`` (placed, proven, gated),
``devices()`` and ``plan()`` for the device table and the planner, ``Ledger`` for the memory
pools stages are budgeted against, ``Refused`` with its
``Refusal`` values, ``WorkerClient`` and ``Deadlines`` for one worker, ``resolve``/``resolve_all``
for routes, and the error tree of ``xstage.errors`` (every class importable from here, each an
``XstageError``). The package is typed (``py.typed``).
"""

from __future__ import annotations

from xstage._version import __version__
from xstage.client import Deadlines, WorkerClient, WorkerState
from xstage.device_table import DeviceReport, devices
from xstage.errors import (
    ArtifactError,
    CallTimeout,
    EnvError,
    ForkedStage,
    HelloTimeout,
    InputError,
    LoadTimeout,
    LocalProtocolError,
    NoSpace,
    ProtocolError,
    RecordError,
    Refused,
    RemoteProtocolError,
    RouteMissing,
    RuntimeMissing,
    ShutdownTimeout,
    SlotsBusy,
    SpawnTimeout,
    StageClosed,
    StateUncertain,
    UsageError,
    WarmupTimeout,
    WorkerDied,
    WorkerError,
    WorkerRaised,
    WorkerTimeout,
    XstageError,
)
from xstage.planner import Plan, plan
from xstage.refusal import Refusal, RefusalCode
from xstage.routes import ReasonCode, RouteSpec, RouteStatus, resolve, resolve_all
from xstage.stage import Stage, open_stage
from xstage.stage.ledger import Ledger

__all__ = [
    "ArtifactError",
    "CallTimeout",
    "Deadlines",
    "DeviceReport",
    "EnvError",
    "ForkedStage",
    "HelloTimeout",
    "InputError",
    "Ledger",
    "LoadTimeout",
    "LocalProtocolError",
    "NoSpace",
    "Plan",
    "ProtocolError",
    "ReasonCode",
    "RecordError",
    "Refusal",
    "RefusalCode",
    "Refused",
    "RemoteProtocolError",
    "RouteMissing",
    "RouteSpec",
    "RouteStatus",
    "RuntimeMissing",
    "ShutdownTimeout",
    "SlotsBusy",
    "SpawnTimeout",
    "Stage",
    "StageClosed",
    "StateUncertain",
    "UsageError",
    "WarmupTimeout",
    "WorkerClient",
    "WorkerDied",
    "WorkerError",
    "WorkerRaised",
    "WorkerState",
    "WorkerTimeout",
    "XstageError",
    "__version__",
    "devices",
    "open_stage",
    "plan",
    "resolve",
    "resolve_all",
]
