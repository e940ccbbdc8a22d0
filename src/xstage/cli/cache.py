"""``xstage cache list|clear [--json[=PATH]]``: the artifact snapshots under ``XSTAGE_HOME``.

Thin: ``xstage.snapshot`` does the work; this module only renders it.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from rich.markup import escape

from xstage import ledger, snapshot
from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK

__all__ = ["register"]

_EPILOG = f"""Every artifact xstage runs is copied first into one private snapshot,
XSTAGE_HOME/cache/artifacts/<sha256>/, hashed while copied: the bytes that run are the bytes
the record hashes. Past {snapshot.CACHE_BYTES_ENV} (default
{ledger.format_bytes(snapshot.CACHE_BYTES_DEFAULT)}) the least recently used snapshots go first;
one a live stage reads is never removed, by eviction or by `clear`."""


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _list(args: argparse.Namespace, out: Output) -> int:
    found = snapshot.list_snapshots()
    cap = snapshot.cache_bytes()
    total = sum(s.bytes for s in found)
    if out.json_mode:
        out.json({"kind": "xstage.cache", "folder": str(snapshot.artifacts_dir()),
                  "cap_bytes": cap, "total_bytes": total,
                  "snapshots": [s.to_dict() for s in found]})
        return EXIT_OK
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


def _clear(args: argparse.Namespace, out: Output) -> int:
    removed, kept = snapshot.clear()
    if out.json_mode:
        out.json({"kind": "xstage.cache.clear", "removed": removed, "kept_in_use": kept})
        return EXIT_OK
    out.result(f"removed {len(removed)} snapshot{'s' if len(removed) != 1 else ''}")
    for sha in kept:
        out.warning(f"kept {sha[:16]}: a live stage is reading it")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``cache list`` and ``cache clear`` to the ``xstage`` parser."""
    parser = sub.add_parser(
        "cache", help="list or clear the artifact snapshots (the bytes every run reads)",
        description="The private snapshots of the artifacts xstage has run.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="every snapshot: hash, files, size, last use",
                               epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(listing, "every snapshot")
    listing.set_defaults(func=_list)
    clearing = verbs.add_parser("clear", help="remove every snapshot no live stage reads",
                                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(clearing, "what was removed and what was kept")
    clearing.set_defaults(func=_clear)
