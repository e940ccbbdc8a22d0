"""Every ``xstage …`` command line in README.md and docs/*.md code blocks parses with the real
parser (``xstage.cli.main.build_parser``; nothing is run), and writes ``--json`` as the CLI
means it (``--json=PATH`` or ``--json -``; docs/external.md).

Which lines count (the rules, in order):

1. Lines of fenced code blocks whose language is none, ``bash``, ``sh``, ``shell``, ``console``
   or ``text``; a ``python`` block is code, not a command line. A line ending in ``\\`` goes on
   with the next; a ``$ `` prompt is dropped; ``# …`` comments are dropped.
2. A command starts at ``xstage`` or ``python[3] -m xstage`` in command position: the start of
   the line or after ``|``, ``&&``, ``||`` or ``;``, past any ``NAME=value`` assignments. It
   ends at the next of those; redirections (``> f``, ``2>&1``) are dropped.
3. A **synopsis** (a line that contains ``[``, ``…`` or ``...``, or a ``(a | b)`` choice, and
   the indented lines that continue it) is not parsed as a whole: each ``--flag`` it names must
   be a flag of its command, and ``--json`` must not be shown taking a separate value.
4. An inline code span in prose that starts with ``xstage `` (``xstage export … --out PATH`` in
   backticks, a heading too) is read as a synopsis: often a fragment, its flags must still exist.
5. Any other command line is parsed whole. ``<placeholder>`` values and upper-case metavars are
   values like any other, so they parse; a flag that does not exist, a missing required
   argument or a bad choice fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from xstage.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
SEPARATORS = {"|", "||", "&&", ";"}
REDIRECT = re.compile(r"(?<!\S)\d*(?:>>?|<)&?\s*\S+")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
SYNOPSIS = re.compile(r"\[|…|\.\.\.|\(\S[^)]*\|[^)]*\)")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    argv: tuple[str, ...]
    synopsis: bool

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: xstage {' '.join(self.argv)}"


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each fenced block of a shell-like language (rule 1)."""
    out, lines, start, lang = [], None, 0, ""
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```\s*([A-Za-z0-9_+-]*)", line)
        if fence and lines is None:
            lines, start, lang = [], number + 1, fence.group(1).lower()
        elif fence:
            if lang in SHELL_LANGS:
                out.append((start, lines))
            lines = None
        elif lines is not None:
            lines.append(line)
    return out


def _is_synopsis(text: str) -> bool:
    """Rule 3, on the text from the first ``xstage`` on (``pip install '.[cpu]' && xstage …`` is
    a command line)."""
    at = re.search(r"\bxstage\s", text)
    return at is not None and bool(SYNOPSIS.search(text[at.start():]))


def _logical_lines(start: int, lines: list[str]) -> list[tuple[int, str, bool]]:
    """(line number, text, synopsis) with ``\\`` continuations and synopsis indents joined."""
    out: list[tuple[int, str, bool]] = []
    for offset, raw in enumerate(lines):
        text = raw.rstrip()
        continues = out and (out[-1][1].endswith("\\")
                             or (out[-1][2] and raw[:1].isspace() and text.strip()))
        if continues:
            number, prev, _ = out.pop()
            joined = f"{prev[:-1] if prev.endswith(chr(92)) else prev} {text.strip()}"
            out.append((number, joined, _is_synopsis(joined)))
        else:
            out.append((start + offset, text, _is_synopsis(text)))
    return out


def _tokens(text: str) -> list[str]:
    text = re.sub(r"^\s*\$\s+", "", text)
    lexer = shlex.shlex(REDIRECT.sub(" ", text), posix=True, punctuation_chars="|&;")
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _commands(tokens: list[str]) -> list[list[str]]:
    """Rule 2: the argv after ``xstage`` of each command in command position."""
    found, segment = [], []
    for token in [*tokens, ";"]:
        if token not in SEPARATORS:
            segment.append(token)
            continue
        words = list(segment)
        segment = []
        while words and ASSIGNMENT.fullmatch(words[0]):
            words.pop(0)
        if words[:1] == ["xstage"]:
            found.append(words[1:])
        elif len(words) >= 3 and re.fullmatch(r"python[0-9.]*", words[0]) and words[1:3] == ["-m", "xstage"]:
            found.append(words[3:])
    return found


def _inline(text: str) -> list[tuple[int, str]]:
    """Rule 4: (line number, words after ``xstage``) of each inline span outside fenced blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*```", line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(number, m.group(1)) for m in re.finditer(r"(?<!`)`xstage ([^`]+)`", line)]
    return out


def doc_commands() -> list[Command]:
    out = []
    for doc in DOCS:
        name, text = str(doc.relative_to(REPO)), doc.read_text(encoding="utf-8")
        out += [Command(name, n, tuple(span.split()), True) for n, span in _inline(text)]
        for start, lines in _blocks(text):
            for number, line, synopsis in _logical_lines(start, lines):
                if synopsis:  # its | and ( ) are markup, not shell: the words after xstage
                    words = re.sub(r"^\s*\$\s+", "", line).split("#")[0].split()
                    at = words.index("xstage")
                    if all(ASSIGNMENT.fullmatch(w) for w in words[:at]):
                        out.append(Command(name, number, tuple(words[at + 1:]), True))
                    continue
                try:
                    tokens = _tokens(line)
                except ValueError:  # an unbalanced quote: output shown in the block, split plainly
                    tokens = REDIRECT.sub(" ", line.split("#")[0]).split()
                out += [Command(name, number, tuple(argv), False) for argv in _commands(tokens)]
    return out


def _parser_for(parser: argparse.ArgumentParser, argv: tuple[str, ...]) -> argparse.ArgumentParser:
    """The (sub)parser the leading words of ``argv`` select (``export vision-tower`` → its own)."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The parser's flags and, where a synopsis leaves its subcommand open
    (``xstage export ... --for-torch 2.4``), those of every subcommand below it."""
    flags = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _flags(sub)
    return flags


def _json_with_a_separate_value(argv: tuple[str, ...]) -> bool:
    """``--json PATH`` (rules 3 to 5): the value must be joined (``--json=PATH``) or ``-``."""
    for i, word in enumerate(argv[:-1]):
        if word.lstrip("[(") == "--json" and not word.endswith("]"):
            value = argv[i + 1].strip("[]()")
            if value and not value.startswith("-"):
                return True
    return False


def _problem(command: Command) -> str | None:
    parser = build_parser()
    if _json_with_a_separate_value(command.argv):
        return "--json takes its path as --json=PATH (or --json - for stdout)"
    if command.synopsis:
        known = _flags(_parser_for(parser, command.argv))
        named = {m.group(0) for w in command.argv for m in [re.search(r"--[a-z0-9][a-z0-9-]*", w)] if m}
        unknown = sorted(named - known)
        return f"no such flag: {', '.join(unknown)}" if unknown else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(list(command.argv))
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


COMMANDS = doc_commands()


def test_the_docs_show_commands_of_every_kind():
    """The scan finds what it should: concrete lines and synopses, in README.md and docs/."""
    assert sum(not c.synopsis for c in COMMANDS) >= 20
    assert {c.doc for c in COMMANDS if c.synopsis} >= {"docs/external.md", "docs/bisect.md"}
    assert any(c.doc == "README.md" for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_doc_command_parses(command: Command) -> None:
    assert _problem(command) is None, f"{command}: {_problem(command)}"


@pytest.mark.parametrize("argv, synopsis, problem", [
    (("external", "--bogus"), False, "unrecognized arguments: --bogus"),
    (("external", "--json", "rec.json"), False, "--json takes its path"),
    (("external", "[--json", "PATH]"), True, "--json takes its path"),
    (("bisect", "--graph", "G", "[--nope", "N]"), True, "no such flag: --nope"),
    (("export", "...", "--for-torch", "2.4"), True, None),
    (("export", "...", "--nope"), True, "no such flag: --nope"),
    (("external", "--json=rec.json"), False, None),
    (("devices", "--json"), False, None),
])
def test_the_check_rejects_what_it_must(argv, synopsis, problem):
    found = _problem(Command("x.md", 1, argv, synopsis))
    assert (found is None) if problem is None else (found is not None and problem in found), found
