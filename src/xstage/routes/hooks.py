"""Per-route setup of an execution provider, reached through the route's spec.

Each spec names its option builder (``RouteSpec.ep_hook``, from ``option_hooks``); this module
runs it on the route's default options and lets the user's ``--ep-option`` values win, key by
key. ``VERIFIED`` is derived from the specs: a hook is verified where its route is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xstage.routes import option_hooks
from xstage.routes.specs import ROUTES, RouteSpec, get_spec

__all__ = ["VERIFIED", "ep_options_for"]

#: Hooks that ran on a machine of this project: the verified onnxruntime routes.
VERIFIED = frozenset(s.name for s in ROUTES if s.runtime == "onnxruntime" and s.verified)


def ep_options_for(
    route: str | RouteSpec,
    fmt: str,
    device: str | None,
    base: Mapping[str, Any],
    user: Mapping[str, str] | None,
) -> tuple[dict[str, str], list[str]]:
    """The EP options for ``route`` (a spec, or a route's name) and the notes explaining what
    the hook added. A name no spec has gets no hook, only the merge."""
    hook = route.ep_hook if isinstance(route, RouteSpec) else _hook_of(route)
    user = dict(user or {})
    opts = {k: str(v) for k, v in base.items()}
    notes = hook(opts, fmt, device, user)
    opts.update(user)
    return opts, notes


def _hook_of(name: str) -> option_hooks.Hook:
    try:
        return get_spec(name).ep_hook
    except KeyError:
        return option_hooks.none
