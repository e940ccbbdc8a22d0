"""``xstage cache list|clear [--json[=PATH]]``: the artifact snapshots and the compile caches
under ``XSTAGE_HOME``.

Thin: ``xstage.snapshot`` and ``xstage.compile_cache`` do the work; this module only renders it.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from rich.markup import escape

from xstage import compile_cache, ledger, snapshot
from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK

__all__ = ["register"]

_EPILOG = f"""Every artifact xstage runs is copied first into one private snapshot,
XSTAGE_HOME/cache/artifacts/<sha256>/, hashed while copied: the bytes that run are the bytes
the record hashes. Past {snapshot.CACHE_BYTES_ENV} (default
{ledger.format_bytes(snapshot.CACHE_BYTES_DEFAULT)}) the least recently used snapshots go first;
one a live stage reads is never removed, by eviction or by `clear`.

Compile caches, XSTAGE_HOME/cache/compiled/<key>/: a route's own runtime cache (OpenVINO's
cache_dir, TensorRT's engine cache) per artifact, route, runtime version and compile options,
verified against its manifest before each use ({compile_cache.ENV}=off turns them off)."""


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _list(args: argparse.Namespace, out: Output) -> int:
    found = snapshot.list_snapshots()
    compiled = compile_cache.list_entries()
    cap = snapshot.cache_bytes()
    total = sum(s.bytes for s in found)
    if out.json_mode:
        out.json({"kind": "xstage.cache", "folder": str(snapshot.artifacts_dir()),
                  "cap_bytes": cap, "total_bytes": total,
                  "snapshots": [s.to_dict() for s in found],
                  "compiled": [e.to_dict() for e in compiled]})
        return EXIT_OK
    _list_compiled(compiled, out)
    if not found:
        out.result(f"no snapshots in {escape(str(snapshot.artifacts_dir()))}")
        return EXIT_OK
    out.table(
        f"Artifact snapshots in {escape(str(snapshot.artifacts_dir()))} (least recently used first; "
        f"{ledger.format_bytes(total) if total else '0 B'} of {ledger.format_bytes(cap)})",
        ["sha256", "files", "size", "last used (UTC)", "in use"],
        [[s.sha256[:16], escape(", ".join(s.files)), ledger.format_bytes(s.bytes) if s.bytes else "0 B",
          _when(s.last_used), "yes" if s.in_use else "-"] for s in found])
    return EXIT_OK


def _list_compiled(compiled: list[compile_cache.CompiledEntry], out: Output) -> None:
    if not compiled:
        return
    out.table(
        "Compile caches (least recently used first)",
        ["key", "route", "artifact", "files", "size", "last used (UTC)", "sealed"],
        [[e.key[:16], escape(e.route or "-"), (e.artifact_sha256 or "-")[:16], e.files,
          ledger.format_bytes(e.bytes) if e.bytes else "0 B", _when(e.last_used),
          ("yes" if e.sealed else "no") + (f"; unread {e.unread}: not handed over" if e.unread else "")]
         for e in compiled])


def _clear(args: argparse.Namespace, out: Output) -> int:
    compiled = compile_cache.clear() if args.which in ("all", "compiled") else []
    removed, kept = snapshot.clear() if args.which in ("all", "snapshots") else ([], [])
    if out.json_mode:
        out.json({"kind": "xstage.cache.clear", "removed": removed, "kept_in_use": kept,
                  "removed_compiled": compiled})
        return EXIT_OK
    if args.which != "snapshots":
        out.result(f"removed {len(compiled)} compile cache{'s' if len(compiled) != 1 else ''}")
    if args.which == "compiled":
        return EXIT_OK
    out.result(f"removed {len(removed)} snapshot{'s' if len(removed) != 1 else ''}")
    for sha in kept:
        out.warning(f"kept {sha[:16]}: a live stage is reading it")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``cache list`` and ``cache clear`` to the ``xstage`` parser."""
    parser = sub.add_parser(
        "cache", help="list or clear the artifact snapshots and the compile caches",
        description="The private snapshots of the artifacts xstage has run, and the runtimes' "
        "compile caches.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="every snapshot: hash, files, size, last use",
                               epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(listing, "every snapshot")
    listing.set_defaults(func=_list)
    clearing = verbs.add_parser("clear", help="remove every snapshot no live stage reads, and every "
                                "compile cache",
                                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = clearing.add_mutually_exclusive_group()
    which.add_argument("--snapshots", dest="which", action="store_const", const="snapshots",
                       help="only the artifact snapshots")
    which.add_argument("--compiled", dest="which", action="store_const", const="compiled",
                       help="only the compile caches")
    clearing.set_defaults(which="all")
    add_json_flag(clearing, "what was removed and what was kept")
    clearing.set_defaults(func=_clear)
