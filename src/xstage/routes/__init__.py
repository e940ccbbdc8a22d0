"""Routes: the specs, interpreter resolution with reason codes, probing, and route envs.

Modules by job: ``specs`` (every route as data, every per-route fact on its spec),
``status`` (what resolution says), ``interpreters`` (the precedence), ``probe`` (running
one), ``judges`` (per runtime: is it there, which devices), ``resolve`` (the orchestration),
``envs`` and ``config`` (where interpreters come from), ``hooks``/``option_hooks`` and
``launch`` (from a resolved route to a worker's load options).

``resolve(name)`` and ``resolve_all()`` never raise for anything about a route: each
comes back ``resolved`` or ``missing`` with a ``ReasonCode``, a reason and a remedy.
"""

from xstage.host.info import HostInfo
from xstage.routes.interpreters import choose_interpreter
from xstage.routes.resolve import evaluate, resolve, resolve_all, resolve_specs
from xstage.routes.specs import (
    DEVICE_CLASSES,
    DEVICE_PREFERENCE,
    FORMATS,
    ROUTE_NAMES,
    ROUTES,
    RouteSpec,
    get_spec,
    reference_spec,
    routes_for_class,
)
from xstage.routes.status import InterpreterChoice, InterpreterSource, ReasonCode, RouteStatus

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
    "reference_spec",
    "resolve",
    "resolve_all",
    "resolve_specs",
    "routes_for_class",
]
