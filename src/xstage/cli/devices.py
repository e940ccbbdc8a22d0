"""``xstage devices [--json[=PATH]] [--refresh]``: the device table, then every route.

Thin: ``xstage.devices()`` does the work; this module only renders it.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from xstage import ledger
from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.device_table import DeviceReport, devices
from xstage.exit_codes import EXIT_OK
from xstage.routes.resolve import RouteStatus

__all__ = ["format_bytes", "register", "render"]

_EPILOG = """A route that did not resolve is listed with its reason code, reason and remedy;
routes marked * are unverified (written from documentation, never run by this project).
Probes are cached under XSTAGE_HOME/cache/probes; --refresh runs them again."""


def format_bytes(n: int | None) -> str:
    """``25275160576`` → ``23.5 GiB`` (binary units, one decimal); 0 or None → ``0``."""
    return ledger.format_bytes(n) if n else "0"


def _route_label(status: RouteStatus, device_id: str) -> str:
    mark = "" if status.verified else "*"
    if status.resolved and device_id in status.devices:
        return f"{status.name}{mark} ok"
    code = status.reason_code.value if status.reason_code else "drives other devices"
    return f"{status.name}{mark} {code}"


def _versions(status: RouteStatus) -> str:
    shown = []
    for key, value in status.versions.items():
        if key in ("numpy", "torch_cuda"):
            continue
        if key == "onnxruntime_distribution":
            if value != "onnxruntime":
                shown.append(f"({value})")
            continue
        shown.append(f"{key} {value}")
    return "\n".join(shown)


def render(report: DeviceReport, out: Output) -> None:
    """The human view: the device table, the route table, then why each missing route is."""
    device_rows: list[list[Any]] = []
    for row in report.devices:
        dev = row.device
        shared = dev.pool == "host_ram" and dev.kind != "cpu"
        device_rows.append(
            [
                escape(dev.id),
                dev.kind,
                escape(dev.name),
                escape(dev.pool),
                "0 (shared)" if shared else format_bytes(dev.memory_bytes),
                "-" if shared else format_bytes(dev.available_bytes),
                escape("\n".join(_route_label(s, dev.id) for s in row.routes) or "(no route drives it)"),
            ]
        )
    out.table(
        "Devices (memory 0 = shares the host's RAM, counted once on the cpu row)",
        ["device", "kind", "name", "pool", "memory", "available", "routes"],
        device_rows,
    )
    out.table(
        "Memory pools (a stage is budgeted against its device's pool; see xstage external)",
        ["pool", "capacity", "source", "devices"],
        [[escape(p["name"]),
          format_bytes(p["capacity_bytes"]) if p["capacity_bytes"] is not None else "unknown",
          escape(p["source"]), escape(", ".join(p["devices"]))] for p in report.pools()],
    )
    route_rows: list[list[Any]] = []
    for status in report.routes:
        route_rows.append(
            [
                status.name + ("" if status.verified else " *"),
                status.status,
                status.reason_code.value if status.reason_code else "-",
                escape(", ".join(status.devices) or "-"),
                escape(status.interpreter or "-")
                + (f"\n({status.interpreter_source})" if status.interpreter else ""),
                escape(_versions(status)),
            ]
        )
    out.table(
        "Routes (* = unverified: written from documentation)",
        ["route", "status", "reason", "devices", "interpreter", "versions"],
        route_rows,
    )
    missing = [s for s in report.routes if not s.resolved]
    if missing:
        out.result("Missing routes, why, and what to do:")
    for status in missing:
        code = status.reason_code.value if status.reason_code else ""
        out.result(f"  [bold]{status.name}[/bold] ({code})")
        for line in status.reason.splitlines():
            out.result("    " + escape(line))
        for step in status.steps:  # a plugin EP's bring-up, step by step
            out.result("    step: " + escape(step))
        out.result("    remedy: " + escape(status.remedy))


def _run_cluster(args: argparse.Namespace, out: Output) -> int:
    from xstage.cluster.devices import cluster_devices

    found = cluster_devices(refresh=args.refresh)
    out.emit({"cluster": args.cluster, "nodes": [
        {"node": node, "report": report.to_dict()} for node, report in found]})
    if out.json_mode:
        return EXIT_OK
    for node, report in found:
        out.result(f"[bold]node {escape(str(node['hostname']))}[/bold] ({node['node_id']}, "
                   f"{node['address']}; Ray resources: "
                   + escape(", ".join(f"{k}={v:g}" for k, v in node["resources"].items()
                                      if k not in ("memory", "object_store_memory")))
                   + ")")
        render(report, out)
    return EXIT_OK


def _run(args: argparse.Namespace, out: Output) -> int:
    if args.cluster:
        return _run_cluster(args, out)
    report = devices(refresh=args.refresh)
    out.emit(report.to_dict())
    if not out.json_mode:
        render(report, out)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``devices`` to the ``xstage`` parser."""
    parser = sub.add_parser(
        "devices",
        help="list devices and every route (resolved, or missing with reason and remedy)",
        description="List the devices this machine shows, the routes that drive them, and every "
        "route: resolved, or missing with a reason code, reason and remedy.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_json_flag(parser, "the device table and every route")
    parser.add_argument(
        "--refresh", action="store_true", help="probe every interpreter again (ignore the cache)"
    )
    parser.add_argument("--cluster", choices=["ray"],
                        help="every node of the cluster (RAY_ADDRESS, or the local one): each "
                        "node's own devices and routes (docs/cluster.md)")
    parser.set_defaults(func=_run)
