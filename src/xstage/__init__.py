"""xstage: run one model stage on a device the host engine cannot drive, and prove where it ran.

The public surface is small on purpose: ``devices()`` for the table of devices and routes,
``WorkerClient`` and ``Deadlines`` for one worker, ``resolve``/``resolve_all`` for routes, and
the error tree in ``xstage.errors``.
"""

from __future__ import annotations

from xstage._version import __version__
from xstage.client import Deadlines, WorkerClient, WorkerState
from xstage.device_table import DeviceReport, devices
from xstage.errors import XstageError
from xstage.routes import ReasonCode, RouteSpec, RouteStatus, resolve, resolve_all

__all__ = [
    "Deadlines",
    "DeviceReport",
    "ReasonCode",
    "RouteSpec",
    "RouteStatus",
    "WorkerClient",
    "WorkerState",
    "XstageError",
    "__version__",
    "devices",
    "resolve",
    "resolve_all",
]
