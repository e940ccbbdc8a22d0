"""Per-route setup of an execution provider, reached through the route's spec.

Each spec names its option builder (``RouteSpec.ep_hook``, from ``option_hooks``); this module
runs it on the route's default options and lets the user's ``--ep-option`` values win, key by
key. ``VERIFIED`` is derived from the specs: a hook is verified where its route is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xstage import errors
from xstage.routes import option_hooks
from xstage.routes.specs import OPT_IN_SWITCHES, ROUTES, RouteSpec, get_spec
from xstage.routes.status import RouteStatus

__all__ = ["VERIFIED", "check_option_keys", "ep_options_for", "option_keys", "options_taken"]

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


def option_keys(status: RouteStatus) -> frozenset[str] | None:
    """The ``--ep-option`` keys ``status``'s route takes, or None where xstage cannot know them.

    A torch route takes its serving switches; an onnxruntime route the keys its spec lists
    (``RouteSpec.ep_option_keys``), except through a plugin library, whose options are its own.
    """
    spec = status.spec
    if spec.runtime == "torch":
        return frozenset(spec.serving_switches)
    if (status.ep_plugin or {}).get("kind") == "plugin":
        return None
    return spec.ep_option_keys


def _switch_names() -> frozenset[str]:
    """xstage's own ``on``/``off`` options, checked by ``serving_switches``/``_check_opt_in``."""
    return frozenset(OPT_IN_SWITCHES).union(*(r.serving_switches for r in ROUTES))


def options_taken(status: RouteStatus, given: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``given`` less the keys this route does not take (another route of the run does), with
    a note for each (``launch.load_options`` puts them in the load notes); unchanged where the
    route's keys are unknown, with a note saying so."""
    keys = option_keys(status)
    user = {k: v for k, v in given.items() if k not in _switch_names()}
    if not user:
        return dict(given), []
    if keys is None:
        return dict(given), [f"--ep-option {', '.join(sorted(user))}: passed to {status.spec.ep} "
                             f"unchecked (xstage does not know the keys {status.name} takes)"]
    dropped = sorted(k for k in user if k not in keys)
    return ({k: v for k, v in given.items() if k not in dropped},
            [f"--ep-option {k} is not an option of {status.name}: not passed to it" for k in dropped])


def check_option_keys(routes: Sequence[RouteStatus], given: Mapping[str, str] | None, *,
                      pinned: bool = False) -> None:
    """Every ``--ep-option`` key must be one that a route of this run takes (before any worker).

    ``routes`` are the plan's candidates (``pinned``: the one route the user named). A key that
    some route takes goes to that route and is left out of the others, with a note
    (``options_taken``); a route whose keys xstage cannot know (``option_keys`` is None) takes
    any key. The serving switches keep their own checks (``launch.serving_switches``).

    Raises:
        UsageError: a key no route of the run takes, naming each route's keys.
    """
    user = sorted(k for k in (given or {}) if k not in _switch_names())
    seen = list({s.name: s for s in routes}.values())
    keys = {s.name: option_keys(s) for s in seen}
    if not user or not seen or any(k is None for k in keys.values()):
        return
    for key in user:
        if any(key in k for k in keys.values() if k is not None):
            continue
        takes = "; ".join(f"{name}: {', '.join(sorted(k)) if k else 'none'}"
                          for name, k in keys.items() if k is not None)
        where = f"route {seen[0].name} has no such option" if pinned or len(seen) == 1 else \
            f"no route of this run ({', '.join(keys)}) takes it"
        raise errors.UsageError(f"--ep-option {key}: {where}",
                                remedy=f"options taken: {takes} (docs/routes.md, \"EP options\")")
