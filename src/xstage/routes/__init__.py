"""Routes: the specs, interpreter resolution with reason codes, probing, and route envs.

``resolve(name)`` and ``resolve_all()`` never raise for anything about a route: each
comes back ``resolved`` or ``missing`` with a ``ReasonCode``, a reason and a remedy.
"""

from xstage.routes.resolve import (
    HostInfo,
    InterpreterChoice,
    InterpreterSource,
    ReasonCode,
    RouteStatus,
    choose_interpreter,
    evaluate,
    resolve,
    resolve_all,
    resolve_specs,
)
from xstage.routes.specs import (
    DEVICE_CLASSES,
    DEVICE_PREFERENCE,
    FORMATS,
    ROUTE_NAMES,
    ROUTES,
    RouteSpec,
    get_spec,
    routes_for_class,
)

__all__ = [
    "DEVICE_CLASSES",
    "DEVICE_PREFERENCE",
    "FORMATS",
    "ROUTES",
    "ROUTE_NAMES",
    "HostInfo",
    "InterpreterChoice",
    "InterpreterSource",
    "ReasonCode",
    "RouteSpec",
    "RouteStatus",
    "choose_interpreter",
    "evaluate",
    "get_spec",
    "resolve",
    "resolve_all",
    "resolve_specs",
    "routes_for_class",
]
