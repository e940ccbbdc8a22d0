"""onnxruntime profile files read into events: the JSON load and the line-by-line fallback. Pure.

onnxruntime <= 1.30 writes node names unescaped, so a name with ``"`` or ``\\`` breaks the file's
JSON; a file cut short does too. :func:`parse_profile` then reads each line on its own and says
whether the file was whole: a kernel on a line it could not read could be the one that ran on the
CPU, so an incomplete profile is not evidence (``xstage.evidence.onnx``, rule 1a).
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["ParsedProfile", "parse_profile"]

_FENCE_SUFFIXES = ("_fence_before", "_fence_after")

@dataclass(frozen=True)
class ParsedProfile:
    """What :func:`parse_profile` recovered from one onnxruntime profile file.

    Attributes:
        events: the events, fence events left out, each a read-only mapping
            ``{"cat": str, "name": str, "dur": int (µs), "ts": int (µs) | None,
            "tid": int | None, "provider": str | None, "op_name": str | None}`` (the last two
            from ``args``; ``tid`` is the thread that ran it, where the file says).
        method: ``"json"`` (the file loaded as JSON), ``"lines"`` (it did not; read line by
            line) or ``"none"`` (nothing to read).
        complete: whether the file is whole: it loaded as JSON, or, read line by line, it
            opens with ``[``, closes with ``]`` and every line in between was read as an event
            (a line that was not could have held a kernel). An incomplete profile is not
            evidence.
        fences: how many fence events (onnxruntime <= 1.20) were skipped.
        unreadable: how many lines (or JSON elements) could not be read as an event.
        notes: what happened, for people.
    """

    events: tuple[Mapping[str, Any], ...]
    method: Literal["json", "lines", "none"]
    complete: bool
    fences: int = 0
    unreadable: int = 0
    notes: tuple[str, ...] = ()


# In the files of onnxruntime <= 1.30 each event is one line:
#   {"cat" : "Node","pid" :1,"dur" :44,"ph" : "X","name" :"relu "q"_kernel_time","args" : {...}},
# and the name is written unescaped. The name runs from the first `"name":"` to the last
# `","args":{`; args never hold a node name, so they still parse as JSON (regexes otherwise).
_NAME_START = re.compile(r'"name"\s*:\s*"')
_NAME_END = re.compile(r'"\s*,\s*"args"\s*:\s*(?=\{)')
_CAT = re.compile(r'"cat"\s*:\s*"([^"\\]*)"')
_DUR = re.compile(r'"dur"\s*:\s*(-?\d+)')
_TS = re.compile(r'"ts"\s*:\s*(-?\d+)')
_TID = re.compile(r'"tid"\s*:\s*(-?\d+)')
_PROVIDER = re.compile(r'"provider"\s*:\s*"([^"\\]*)"')
_OP_NAME = re.compile(r'"op_name"\s*:\s*"([^"\\]*)"')


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _as_dur(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return int(float(value))
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _normalize(raw: Any) -> dict[str, Any] | None:
    """One JSON event to the normalized shape, or None when it is not an event."""
    if not isinstance(raw, Mapping):
        return None
    cat, name = _as_text(raw.get("cat")), _as_text(raw.get("name"))
    if cat is None or name is None:
        return None
    args = raw.get("args")
    args = args if isinstance(args, Mapping) else {}
    dur = _as_dur(raw.get("dur", 0))
    ts = _as_dur(raw.get("ts"))
    tid = raw.get("tid")
    return {
        "cat": cat,
        "name": name,
        "dur": max(dur, 0) if dur is not None else 0,
        "ts": ts,
        "tid": tid if isinstance(tid, int) and not isinstance(tid, bool) else None,
        "provider": _as_text(args.get("provider")),
        "op_name": _as_text(args.get("op_name")),
    }


def _read_line(line: str) -> dict[str, Any] | None:
    """One event line: as JSON if it is, else by the regexes; None when neither reads it."""
    body = line.strip().rstrip(",").strip()
    try:
        return _normalize(json.loads(body))
    except ValueError:
        pass
    start = _NAME_START.search(body)
    ends = list(_NAME_END.finditer(body))
    if start is None or not ends or ends[-1].start() < start.end():
        return None
    end = ends[-1]
    head, name, tail = body[: start.start()], body[start.end() : end.start()], body[end.end() :]
    cat = _CAT.search(head)
    if cat is None:
        return None
    dur = _DUR.search(head)
    provider = op_name = None
    args_text = tail[: tail.rfind("}")] if tail.endswith("}") else tail  # drop the event's own "}"
    try:
        args = json.loads(args_text)
    except ValueError:
        args = None
    if isinstance(args, Mapping):
        provider, op_name = _as_text(args.get("provider")), _as_text(args.get("op_name"))
    else:
        found_provider, found_op = _PROVIDER.search(tail), _OP_NAME.search(tail)
        provider = found_provider.group(1) if found_provider else None
        op_name = found_op.group(1) if found_op else None
    ts, tid = _TS.search(head), _TID.search(head)
    return {"cat": cat.group(1), "name": name, "dur": int(dur.group(1)) if dur else 0,
            "ts": int(ts.group(1)) if ts else None, "tid": int(tid.group(1)) if tid else None,
            "provider": provider, "op_name": op_name}


def _is_fence(event: Mapping[str, Any]) -> bool:
    return bool(event["cat"] == "Node" and event["name"].endswith(_FENCE_SUFFIXES))


def parse_profile(text: str | bytes | None) -> ParsedProfile:
    r"""Read an onnxruntime profile file's text; never raises on a malformed profile.

    The normal case is ``json.loads`` (a list of events, or a ``{"traceEvents": [...]}``
    object). When that fails — onnxruntime <= 1.30 writes node names unescaped, so a name with
    ``"`` or ``\\`` breaks the file; a file cut short does too — each line is read on its own
    (as JSON, else with regexes for ``cat``, ``name``, ``dur``, ``args.provider`` and
    ``args.op_name``). Fence events (``*_fence_before``/``*_fence_after``, onnxruntime <= 1.20)
    are skipped.

    Args:
        text: the file's text (bytes are decoded as UTF-8, bad bytes replaced), or None when
            there was no profile.

    Returns:
        What could be recovered, whether the file was whole, and notes.

    Raises:
        TypeError: ``text`` is not a string, bytes or None.
    """
    if text is None:
        return ParsedProfile((), "none", False, notes=("no profile was collected",))
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"profile text must be str, bytes or None, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        return ParsedProfile((), "none", False, notes=("the profile is empty",))
    notes: list[str] = []
    error: ValueError | None
    try:
        loaded = json.loads(stripped)
    except ValueError as exc:
        loaded, error = None, exc
    else:
        error = None
    if error is None:
        raw_events = loaded.get("traceEvents") if isinstance(loaded, Mapping) else loaded
        if not isinstance(raw_events, list):
            return ParsedProfile((), "json", False, notes=(
                f"the profile is JSON but not a list of events ({type(loaded).__name__})",))
        method: Literal["json", "lines", "none"] = "json"
        complete = True
        candidates: list[dict[str, Any] | None] = [_normalize(raw) for raw in raw_events]
    else:
        method = "lines"
        lines = [line for line in stripped.splitlines() if line.strip()]
        complete = lines[0].strip() == "[" and lines[-1].strip() == "]"
        notes.append(f"the profile is not valid JSON ({error}); read line by line")
        if not complete:
            notes.append("the profile ends early (no closing bracket): it was cut short")
        candidates = [_read_line(line) for line in lines if line.strip() not in ("[", "]")]
    events, fences, unreadable = [], 0, 0
    for event in candidates:
        if event is None:
            unreadable += 1
        elif _is_fence(event):
            fences += 1
        else:
            events.append(MappingProxyType(event))
    if fences:
        notes.append(f"{fences} fence events skipped (onnxruntime <= 1.20 writes them)")
    if unreadable:
        what = "lines" if method == "lines" else "elements"
        notes.append(f"{unreadable} {what} could not be read as events")
        if method == "lines" and complete:
            complete = False  # a kernel could hide in a line we could not read
            notes.append("the profile is not whole: a line that could not be read may have held a kernel")
    return ParsedProfile(tuple(events), method, complete, fences, unreadable, tuple(notes))
