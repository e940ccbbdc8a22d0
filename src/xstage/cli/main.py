"""Assembles the command groups and maps known errors to exit codes.

Each command module exposes ``register(subparsers)``; the parser it adds carries
``func(args, out) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from xstage import errors
from xstage._version import __version__
from xstage.cli import _errors
from xstage.cli._flags import check_json_target
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from xstage.home import check_output, home_path
from xstage.routes.config import named_project_config

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "main"]

_EPILOG = f"""environment:
  XSTAGE_HOME      state root (envs/, cache/, records/, logs/); default: the user data dir
  XSTAGE_DEBUG=1   show tracebacks for known errors too
  XSTAGE_LOG_KEEP  worker logs kept: N newest, Nd days, both (default 100,30d), or all
  XSTAGE_ARTIFACT_CACHE_BYTES  the artifact snapshots' cap (default 20GiB; xstage cache list)
  XSTAGE_PYTHON_<ROUTE>  interpreter for one route, e.g. XSTAGE_PYTHON_ORT_OPENVINO
  XSTAGE_CONFIG    the user config file (interpreters, plugin tables, trusted project files)
  every variable and config key, with its default and range: docs/configuration.md

./xstage.toml is used only once trusted (xstage config trust); --project-config PATH names
a project file for one run.

exit codes: {EXIT_OK} ok, {EXIT_ERROR} error, {EXIT_REFUSED} refused (a record is still written), \
{EXIT_USAGE} usage error
"""


#: Errors that are not the user's doing (a worker that died, raised or hung, a bad frame): only
#: these mention XSTAGE_DEBUG=1; the others name their cause and fix in full.
_UNEXPECTED = (errors.WorkerError, errors.ProtocolError)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad flags; 2 means "refused" here, so usage errors exit 64."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from xstage.cli import (
        bisect,
        cache,
        compare,
        config,
        devices,
        env,
        export,
        external,
        quantize,
        report,
        sanitize,
    )

    parser = _Parser(
        prog="xstage",
        description="Run one model stage on a device the host engine cannot drive, "
        "in a worker process of its own, and prove where it ran.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"xstage {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more diagnostics")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors and data")
    parser.add_argument("--project-config", metavar="PATH", default=None,
                        help="use PATH as the project file for this run (in place of a "
                        "trusted ./xstage.toml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (devices, env, external, report, compare, sanitize, quantize, export, bisect, cache,
                   config):
        module.register(sub)
    # -v/-q work after the command too (`xstage devices -q`), without overriding the global ones.
    seen: set[int] = set()
    stack = list(sub.choices.values())
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                       help="more diagnostics")
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="only errors and data")
        p.add_argument("--project-config", metavar="PATH", default=argparse.SUPPRESS,
                       help="use PATH as the project file for this run")
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out = Output(json_target=getattr(args, "json", None), verbosity=-1 if args.quiet else args.verbose)
    try:
        # Cheap checks first: the --json path (never one of the command's own files, its folder
        # there), then the runtime, then the command.
        check_json_target(args)
        if out.json_target not in (None, "-"):
            check_output(out.json_target, flag="--json")
        with contextlib.ExitStack() as stack:
            if args.project_config:
                stack.enter_context(named_project_config(args.project_config))
            if getattr(args, "needs_runtime", True):
                from xstage.cli._runtime import check_onnxruntime

                check_onnxruntime()
            return int(args.func(args, out))
    except KeyboardInterrupt:
        out.error("interrupted")
        return EXIT_INTERRUPTED
    except errors.UsageError as exc:
        if os.environ.get("XSTAGE_DEBUG") == "1":
            raise
        out.error(exc.message)
        if exc.remedy:
            out.hint(exc.remedy)
        return EXIT_USAGE
    except errors.XstageError as exc:
        if os.environ.get("XSTAGE_DEBUG") == "1":
            raise
        line, hint = _errors.format_known(exc) or (str(exc), None)
        out.error(line)
        if hint:
            out.hint(hint)
        if isinstance(exc, _UNEXPECTED):  # not the user's doing: the traceback helps a bug report
            out.hint("set XSTAGE_DEBUG=1 to see the traceback")
        return EXIT_ERROR
    except OSError as exc:  # a full disk where no writer named its path: still one line
        if not errors.is_full_disk(exc) or os.environ.get("XSTAGE_DEBUG") == "1":
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        out.error(f"no space left on device{where} ({exc.strerror or exc})")
        out.hint(f"free space where xstage writes (XSTAGE_HOME is {home_path()}, and the "
                 "temporary folder), or set XSTAGE_HOME to a folder on a disk with room")
        return EXIT_ERROR


def entry() -> None:
    sys.exit(main())
