"""``xstage env create|list|remove``: route environments (``xstage.routes.envs`` does the work)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.errors import UsageError
from xstage.exit_codes import EXIT_OK, EXIT_USAGE
from xstage.routes import envs
from xstage.routes.plugins import find_spec, route_names

__all__ = ["register"]

_CREATE_EPILOG = """examples:
  xstage env create ort-openvino                 # plugin EP on Intel CPUs, built-in EP elsewhere
  xstage env create ort-openvino --variant builtin
  xstage env create ort-cpu --python 3.9 --pin onnxruntime==1.19.2
  xstage env create ort-vitisai                  # Windows-side: prints PowerShell commands
  xstage env create ort-plugin:ggml              # a [plugins.ggml] table in ./xstage.toml

Windows-side routes (ort-vitisai, ort-dml, ort-qnn) are not built from WSL or Linux: the
command prints the PowerShell lines to run on Windows instead."""


def _route(name: str) -> str:
    try:
        find_spec(name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0]), remedy=f"routes: {', '.join(route_names())}") from None
    return name


def _create(args: argparse.Namespace, out: Output) -> int:
    route = _route(args.route)
    plan = envs.plan(route, python=args.python, pins=args.pin or (), variant=args.variant)
    spec = find_spec(route)
    if len(spec.variants) > 1:
        out.result(f"{route}: variant {plan.variant} ({escape(plan.variant_reason)})")
    doc = {"route": route, "action": plan.action, "variant": plan.variant, "target": str(plan.target),
           "message": plan.message or None, "powershell": list(plan.powershell or ())}
    if plan.action == "reuse":
        out.result(escape(plan.message))
        out.emit(doc)
        return EXIT_OK
    if plan.action == "powershell":
        out.result(f"{route} lives on the Windows side; run these in PowerShell on Windows:")
        out.result("")
        for line in plan.powershell:
            # Printed raw (no markup) so the commands can be copied exactly.
            out.out.print(line, markup=False, highlight=False, soft_wrap=True)
        out.result("")
        out.result(escape(plan.message))
        out.emit(doc)
        return EXIT_OK
    if args.exist_ok and not args.force and plan.target.exists():
        existing = next((e for e in envs.list_envs() if e.route == route), None)
        if existing is not None and existing.python.exists():
            out.result(f"{route} exists: {escape(str(existing.python))} (kept; --force rebuilds it)")
            out.emit({**doc, "action": "kept", "env": existing.to_dict()})
            return EXIT_OK
    out.result(
        f"building {route} with Python {plan.python_version} into {escape(str(plan.target))} "
        f"({escape(' '.join(plan.packages))}); pip's output is shown only if it fails"
    )
    with out.progress(f"building {route}") as bar:
        def step(msg: str) -> None:
            bar.update(description=msg)
            out.log(msg)

        info = envs.create(plan, force=args.force, progress=step)
    installed = ", ".join(f"{k} {v}" for k, v in info.manifest.get("installed", {}).items())
    out.result(f"created {route}: {escape(str(info.python))} ({escape(installed)})")
    out.result(f"check it: xstage devices  (the {route} row names this interpreter)")
    out.emit({**doc, "env": info.to_dict()})
    return EXIT_OK


def _list(args: argparse.Namespace, out: Output) -> int:
    found = envs.list_envs()
    out.emit({"envs_dir": str(envs.env_dir("x").parent), "envs": [e.to_dict() for e in found]})
    if out.json_mode:
        return EXIT_OK
    if not found:
        out.result(f"no route environments under {escape(str(envs.env_dir('x').parent))}")
        out.hint("create one: xstage env create ort-openvino")
        return EXIT_OK
    rows = []
    for info in found:
        doc = info.to_dict()
        installed = ", ".join(f"{k} {v}" for k, v in (doc["installed"] or {}).items())
        rows.append(
            [
                info.route,
                doc["variant"] or "-",
                doc["python_version"] or "-",
                escape(installed or "-"),
                escape(str(info.python)) + ("" if info.ok else "\n(interpreter missing)"),
                doc["created"] or "-",
            ]
        )
    out.table(
        "Route environments", ["route", "variant", "python", "packages", "interpreter", "created"], rows
    )
    return EXIT_OK


def _remove(args: argparse.Namespace, out: Output) -> int:
    path = envs.remove(args.route)
    out.result(f"removed {escape(args.route)} ({escape(str(path))})")
    out.emit({"route": args.route, "removed": str(path)})
    return EXIT_OK


def _help(parser: argparse.ArgumentParser) -> object:
    def show(args: argparse.Namespace, out: Output) -> int:
        parser.print_help()
        return EXIT_USAGE

    return show


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``env`` and its ``create``/``list``/``remove`` to the ``xstage`` parser."""
    parser = sub.add_parser(
        "env",
        help="create, list and remove route environments",
        description="Route environments: one venv per route under XSTAGE_HOME/envs, found by "
        "`xstage devices` without further configuration.",
    )
    parser.set_defaults(func=_help(parser), needs_runtime=False)  # route envs bring their own
    verbs = parser.add_subparsers(dest="env_command", metavar="VERB")

    create = verbs.add_parser(
        "create",
        help="build a route's venv (or print the PowerShell commands for a Windows-side route)",
        description="Build ROUTE's venv under XSTAGE_HOME/envs/ROUTE, in a temporary folder renamed "
        "into place when complete.",
        epilog=_CREATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    create.add_argument("route", metavar="ROUTE",
                        help="a route (xstage devices lists them), or ort-plugin:NAME for a "
                        "[plugins.NAME] table")
    create.add_argument(
        "--python", metavar="X.Y", help="Python version (pyenv, pythonX.Y, py -X.Y) or a path"
    )
    create.add_argument(
        "--pin",
        action="append",
        metavar="PKG==V",
        help="pin a package (repeatable); replaces the route's package of the same name",
    )
    create.add_argument(
        "--variant", help="package set, for routes with several (ort-openvino: plugin, builtin)"
    )
    create.add_argument("--force", action="store_true", help="replace an existing environment")
    add_json_flag(create, "what was built (or kept, or printed for Windows)")
    create.add_argument("--exist-ok", action="store_true",
                        help="succeed without rebuilding when the environment already exists")
    create.set_defaults(func=_create, needs_runtime=False)

    listing = verbs.add_parser("list", help="list route environments", description="List route environments.")
    add_json_flag(listing, "the route environments")
    listing.set_defaults(func=_list, needs_runtime=False)

    remove = verbs.add_parser("remove", help="delete a route environment", description="Delete ROUTE's venv.")
    remove.add_argument("route", metavar="ROUTE")
    add_json_flag(remove, "what was removed")
    remove.set_defaults(func=_remove, needs_runtime=False)
