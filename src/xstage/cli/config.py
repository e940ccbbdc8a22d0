"""``xstage config trust [PATH]``: trust a project's ``xstage.toml`` (``xstage.routes.config``)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK
from xstage.routes import config as cfg

__all__ = ["register"]

_TRUST_EPILOG = """A project file names interpreters that xstage runs and libraries it loads, so
./xstage.toml is used only once trusted: read it, then trust it. This records its real path and
the sha256 of its bytes in the user config (XSTAGE_CONFIG, or the platform's config folder); a
file that changes is untrusted again until you trust it again. Until then it is named in one
line on stderr and ignored. `--project-config PATH` on any command uses PATH for that run."""


def _trust(args: argparse.Namespace, out: Output) -> int:
    path, digest, config = cfg.trust(args.path)
    out.emit({"kind": "xstage.config.trust", "path": str(path), "sha256": digest, "user_config": str(config)})
    if not out.json_mode:
        out.result(f"trusted {escape(str(path))} (sha256 {digest[:12]}) in {escape(str(config))}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``config`` and its ``trust`` subcommand."""
    parser = sub.add_parser("config", help="the user config: trust a project's xstage.toml")
    inner = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND",
                                  parser_class=type(parser))
    trust = inner.add_parser("trust", help="trust ./xstage.toml (or PATH) as it is now",
                             epilog=_TRUST_EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    trust.add_argument("path", nargs="?", default=None,
                       help="the project file (default: ./xstage.toml)")
    add_json_flag(trust, "the trusted file, its sha256 and the user config", files=("path",))
    trust.set_defaults(func=_trust)
