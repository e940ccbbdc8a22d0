"""A Perfetto / ``chrome://tracing`` trace of one record, in the Trace Event format.

The JSON object form: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``;
complete events ``ph: "X"`` (``ts`` and ``dur`` in µs), metadata ``ph: "M"``
(``process_name``, ``thread_name``, ``process_sort_index``) and counters ``ph: "C"``
(``args`` holds the series). onnxruntime's own profile is in the same format, so its kernels
drop in unchanged but for their clock.

Two processes:

* **client** (pid 1): the admission's phases (spawn + hello, load, warm-up, evidence) and each
  timed call's round trip, on the client's ``perf_counter`` from the moment the spawn began.
* **worker** (pid 2): onnxruntime's load spans, the profiled runs with their kernels nested
  under them (same thread; ``cat`` names the kernel's side: ``kernel,target``, ``kernel,cpu``,
  ``kernel,other``, ``,copy`` for copies; ``args.provider`` the EP), each timed call's compute,
  and a memory counter.

**Clock alignment.** The two processes keep different clocks (across WSL and Windows they are
different machines' clocks). The worker's profile is placed on the client's clock by Cristian's
method on the warm-up call: the client timed its round trip, the worker reported how long it
computed inside it; assuming the request and the reply took equally long, the first profiled
run began ``(round trip − compute) / 2`` after the request left, give or take that half — the
record's ``detail.clock`` holds the offset and its uncertainty, and ``otherData`` repeats them.
Each timed call's compute is centred in its round trip by the same rule.

.. versionadded:: 0.2
"""

from __future__ import annotations

from typing import Any

from xstage.report.view import CPU_EP, ReportView

__all__ = ["CLIENT_PID", "WORKER_PID", "trace_events"]

CLIENT_PID = 1
WORKER_PID = 2
_SESSION_TID, _RUNS_TID, _CALLS_TID = 1, 2, 3


def _meta(pid: int, name: str, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": args}


def _span(
    pid: int, tid: int, name: str, ts: float, dur: float, cat: str, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": cat,
        "ts": round(ts, 3),
        "dur": round(max(dur, 0.0), 3),
    }
    if args:
        event["args"] = args
    return event


def trace_events(view: ReportView, worker_pid: int | None = None) -> dict[str, Any]:
    """The Trace Event document of one record (module docstring: processes and clocks).

    Args:
        view: the record's view (its ``detail`` block's phases, calls, runs and kernels).
        worker_pid: the worker's real pid, shown in its process name.

    Returns:
        ``{"traceEvents", "displayTimeUnit", "otherData"}``; only the metadata events when the
        record has no detail (no worker warmed up).
    """
    events: list[dict[str, Any]] = [
        _meta(CLIENT_PID, "process_name", {"name": "xstage client"}),
        _meta(CLIENT_PID, "process_sort_index", {"sort_index": 0}),
        _meta(CLIENT_PID, "thread_name", {"name": "admission and calls"}, tid=_SESSION_TID),
        _meta(
            WORKER_PID,
            "process_name",
            {"name": f"worker {view.route or ''}" + (f", OS pid {worker_pid}" if worker_pid else "")},
        ),
        _meta(WORKER_PID, "process_sort_index", {"sort_index": 1}),
        _meta(WORKER_PID, "thread_name", {"name": "onnxruntime session"}, tid=_SESSION_TID),
        _meta(WORKER_PID, "thread_name", {"name": "profiled runs"}, tid=_RUNS_TID),
        _meta(WORKER_PID, "thread_name", {"name": "calls: compute"}, tid=_CALLS_TID),
    ]
    events += _client_events(view)
    clock = view.clock or {}
    offset = clock.get("profile_offset_us")
    if isinstance(offset, (int, float)):
        events += _profile_events(view, float(offset))
    other = {
        "xstage": "xstage report --trace",
        "clock": "µs on the client's perf_counter since the worker's spawn began",
        "profile_offset_us": offset,
        "profile_offset_uncertainty_us": clock.get("profile_offset_uncertainty_us"),
        "alignment": clock.get("method") or "no profile in this record: worker spans not placed",
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _client_events(view: ReportView) -> list[dict[str, Any]]:
    """The client's admission phases and timed calls, each call's compute centred in its round
    trip on the worker's calls thread, and the worker's memory as a counter."""
    events: list[dict[str, Any]] = []
    for phase in view.phases:
        events.append(
            _span(
                CLIENT_PID,
                _SESSION_TID,
                str(phase["name"]),
                float(phase["start_us"]),
                float(phase["dur_us"]),
                "admission",
            )
        )
    if view.calls:
        first, last = view.calls[0], view.calls[-1]
        events.append(
            _span(
                CLIENT_PID,
                _SESSION_TID,
                f"{len(view.calls)} timed calls",
                first.start_us,
                last.start_us + last.round_trip_us - first.start_us,
                "calls",
            )
        )
    for i, call in enumerate(view.calls, start=1):
        events.append(
            _span(
                CLIENT_PID,
                _SESSION_TID,
                f"call {i}",
                call.start_us,
                call.round_trip_us,
                "call",
                {
                    "round_trip_us": call.round_trip_us,
                    "compute_us": call.compute_us,
                    "copy_in_us": call.copy_in_us,
                    "copy_out_us": call.copy_out_us,
                },
            )
        )
        slack = max(0.0, call.round_trip_us - call.compute_us) / 2
        events.append(
            _span(WORKER_PID, _CALLS_TID, f"compute {i}", call.start_us + slack, call.compute_us, "call")
        )
        if isinstance(call.rss_bytes, int):
            events.append(
                {
                    "ph": "C",
                    "pid": WORKER_PID,
                    "tid": 0,
                    "name": "memory (MiB)",
                    "ts": round(call.start_us, 3),
                    "args": {"rss": round(call.rss_bytes / 2**20, 2)},
                }
            )
    return events


def _profile_events(view: ReportView, offset: float) -> list[dict[str, Any]]:
    """The worker's onnxruntime session events, profiled runs and kernels, placed on the
    client's clock by ``offset`` (each kernel nests under the run that holds it)."""
    events: list[dict[str, Any]] = []
    for e in view.session_events:
        if isinstance(e.get("ts_us"), int):
            events.append(
                _span(
                    WORKER_PID,
                    _SESSION_TID,
                    str(e["name"]),
                    e["ts_us"] + offset,
                    float(e["dur_us"]),
                    "onnxruntime",
                )
            )
    timed = set(view.timed_runs)
    for run in view.runs:
        if isinstance(run.get("ts_us"), int):
            events.append(
                _span(
                    WORKER_PID,
                    _RUNS_TID,
                    f"profiled run {run['run']}",
                    run["ts_us"] + offset,
                    float(run["dur_us"]),
                    "profiled run",
                    {"timed": run["run"] in timed},
                )
            )
    for k in view.kernels:  # on the runs' thread: each nests under the run that holds it
        if isinstance(k.get("ts_us"), int):
            provider = str(k["provider"])
            role = "target" if provider == view.target_ep else "cpu" if provider == CPU_EP else "other"
            events.append(
                _span(
                    WORKER_PID,
                    _RUNS_TID,
                    str(k["node"]),
                    k["ts_us"] + offset,
                    float(k["dur_us"]),
                    f"kernel,{role}" + (",copy" if k.get("kind") == "copy" else ""),
                    {
                        "op": k.get("op"),
                        "run": k.get("run"),
                        "provider": provider,
                        "name_checked": k.get("checked"),
                    },
                )
            )
    return events
