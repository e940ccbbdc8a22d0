"""Record documents for the record tests: one per outcome, shaped like what ``external`` writes.

Each builder returns a fresh copy in which no two places share an object, so a test may mutate
what it gets.
"""

from __future__ import annotations

import json
from typing import Any

_SHA = "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"

_HOST = {
    "hostname": "dev-vm",
    "platform": "Linux-6.1.0-x86_64-with-glibc2.36",
    "python": "3.11.7",
    "machine": "x86_64",
    "cpu": "AMD EPYC",
    "memory_bytes": 25_217_007_616,
}

_REQUEST = {
    "device": None,
    "prefer": ["npu:amd", "cpu"],
    "route": None,
    "min_placement": 0.5,
    "tolerance": None,
    "ep_options": {"INFERENCE_PRECISION_HINT": "f32"},
    "threads": None,
    "graph_opt_level": "all",
    "runs": 20,
    "warmup": 3,
    "inputs": {"source": "synthesized", "seed": 0, "shapes": {"x": [1, 3, 640, 640]}},
}

_NO_ROUTE = {
    "code": "device_unreachable_from_this_process",
    "cause": "route_missing",
    "device": "npu:amd",
    "route": "ort-vitisai",
    "message": "ort-vitisai needs Windows (natively, or reached from WSL); this host is Linux (not WSL)",
    "remedy": "run xstage on Windows or in WSL on a Windows machine to use ort-vitisai",
    "evidence": {"reason_code": "wrong_os"},
}

_PLACED: dict[str, Any] = {
    "schema_version": "1.1",
    "kind": "xstage.external",
    "xstage_version": "0.1.0",
    "argv": ["xstage", "external", "--graph", "det.onnx", "--prefer", "npu:amd,cpu"],
    "started": "2026-11-29T19:42:30.559003Z",
    "finished": "2026-11-29T19:42:34.112000Z",
    "host": _HOST,
    "outcome": {"status": "placed", "exit_code": 0, "refusals": [_NO_ROUTE], "error": None},
    "artifact": {
        "path": "/tmp/det.onnx",
        "sha256": _SHA,
        "bytes": 4_745_517,
        "files": [{"path": "det.onnx", "sha256": _SHA, "bytes": 4_745_517}],
        "format": "onnx:fp32",
        "component": None,
        "format_source": "extension+initializers",
    },
    "request": _REQUEST,
    "plan": {
        "chosen": {"device": "cpu", "route": "ort-openvino"},
        "candidates": [
            {"device": "npu:amd", "route": "ort-vitisai", "status": "refused", "refusal": _NO_ROUTE},
            {"device": "cpu", "route": "ort-openvino", "status": "chosen", "refusal": None},
            {"device": "cpu", "route": "ort-cpu", "status": "not_tried", "refusal": None},
        ],
    },
    "worker": {
        "route": "ort-openvino",
        "interpreter": "/root/.cache/xstage/envs/ort-openvino/bin/python",
        "hello": {
            "v": 1,
            "worker": {
                "pid": 4242,
                "platform": "linux",
                "machine": "x86_64",
                "versions": {"python": "3.11.7", "numpy": "2.4.6", "onnxruntime": "1.24.1"},
            },
        },
        "log": "/root/.cache/xstage/logs/worker-4242.log",
    },
    "proof": {
        "verdict": "placed",
        "gate": "node_fraction",
        "node_fraction": 1.0,
        "time_fraction": 0.998,
        "target": "OpenVINOExecutionProvider",
        "cpu_nodes_by_op": {},
    },
    "parity": {
        "verdict": "passed",
        "outputs": [{"name": "sigmoid_0.tmp_0", "rel_l2": 1.1e-4, "cosine": 0.99999, "criterion": "rel_l2"}],
    },
    "timings": {
        "runs": 20,
        "compute_ms": {"p50": 41.2, "p90": 43.0, "p99": 44.9, "min": 40.1, "max": 45.0, "mean": 41.8},
        "round_trip_ms": {"p50": 42.0, "p90": 43.9, "p99": 45.7, "min": 40.8, "max": 45.8, "mean": 42.6},
    },
    "memory": {"rss_bytes": 312_000_000, "peak_bytes": 401_000_000},
    "ledger": {
        "pool": {"name": "host_ram", "capacity_bytes": 24_000_000_000,
                 "source": "available RAM when the ledger was made"},
        "held_bytes": 0,
        "reservations": [
            {"purpose": "runtime", "bytes": 125_829_120, "pool": "host_ram", "lifetime": "session",
             "evidence": "E", "basis": "ort-openvino: measured ..."},
            {"purpose": "weights", "bytes": 4_745_517, "pool": "host_ram", "lifetime": "session",
             "evidence": "D", "basis": "the artifact on disk: det.onnx 4.5 MiB"},
            {"purpose": "parsed model", "bytes": 4_745_517, "pool": "host_ram", "lifetime": "load",
             "evidence": "E", "basis": "the runtime holds the parsed graph while it builds the session"},
            {"purpose": "activations", "bytes": 132_120_576, "pool": "host_ram", "lifetime": "request",
             "evidence": "E", "basis": "liveness peak 42.0 MiB ..., x3"},
            {"purpose": "margin", "bytes": 65_000_000, "pool": "host_ram", "lifetime": "session",
             "evidence": "E", "basis": "25% of the larger phase"},
        ],
        "load_bytes": 200_320_154,
        "steady_bytes": 327_695_213,
        "budget_bytes": 327_695_213,
        "phase": "steady",
        "measured_peak_bytes": 221_000_000,
        "measured_rss_bytes": 221_000_000,
        "uss_bytes": 209_000_000,
        "pss_bytes": 214_000_000,
        "budget_over_measured": 1.48,
        "verdict": "within_budget",
        "cause": None,
        "blind_spots": [],
        "warnings": [],
    },
}


def placed() -> dict[str, Any]:
    """A run that chose cpu via ort-openvino after the NPU's route was missing."""
    return json.loads(json.dumps(_PLACED))  # a deep copy that shares no object between two places


def refused() -> dict[str, Any]:
    """``--min-placement 0.999`` on a graph with one ``Det`` node left on the CPU: exit 2."""
    doc = placed()
    declined = {
        "code": "execution_provider_declined_graph",
        "cause": "declined",
        "device": "cpu",
        "route": "ort-openvino",
        "message": "OpenVINOExecutionProvider took 4 of 5 nodes (0.8 < 0.999); left on the CPU: Det",
        "remedy": "lower --min-placement, or replace the Det node before exporting",
        "evidence": {"node_fraction": 0.8, "cpu_nodes_by_op": {"Det": ["det_0"]}},
    }
    doc["outcome"] = {"status": "refused", "exit_code": 2, "refusals": [declined], "error": None}
    doc["plan"]["chosen"] = None
    doc["plan"]["candidates"][1] = {"device": "cpu", "route": "ort-openvino", "status": "refused",
                                    "refusal": declined}
    doc["proof"]["verdict"] = "declined"
    doc["proof"]["node_fraction"] = 0.8
    doc["parity"] = None
    doc["timings"] = None
    return json.loads(json.dumps(doc))


def over_budget() -> dict[str, Any]:
    """``--pool host_ram=64MiB``: refused before any worker started (schema 1.1)."""
    doc = placed()
    refusal = {
        "code": "budget_exceeds_device", "cause": "over_budget", "device": "cpu",
        "route": "ort-openvino",
        "message": "ort-openvino on cpu: a budget of 312.5 MiB does not fit pool host_ram: "
                   "64.0 MiB (set by the user), 64.0 MiB free",
        "remedy": "close stages this process holds ...",
        "evidence": {},
    }
    doc["outcome"] = {"status": "refused", "exit_code": 2, "refusals": [refusal], "error": None}
    doc["plan"]["chosen"] = None
    doc["plan"]["candidates"][1] = {"device": "cpu", "route": "ort-openvino", "status": "refused",
                                    "refusal": refusal}
    for key in ("worker", "proof", "parity", "timings", "memory"):
        doc[key] = None
    book = doc["ledger"]
    book["pool"] = {"name": "host_ram", "capacity_bytes": 64 << 20, "source": "set by the user"}
    book.update(measured_peak_bytes=None, measured_rss_bytes=None, uss_bytes=None, pss_bytes=None,
                budget_over_measured=None, verdict="refused", cause="over_budget")
    refusal["evidence"] = {"ledger": json.loads(json.dumps(book))}
    return json.loads(json.dumps(doc))


def schema_1_0() -> dict[str, Any]:
    """A record as xstage wrote it before the ledger (schema 1.0): still read."""
    doc = placed()
    del doc["ledger"]
    doc["schema_version"] = "1.0"
    return doc


def error() -> dict[str, Any]:
    """A corrupt graph: exit 1, nothing planned, nothing ran."""
    doc = placed()
    doc["outcome"] = {
        "status": "error",
        "exit_code": 1,
        "refusals": [],
        "error": {"type": "ArtifactError", "message": "det.onnx is not an ONNX model: truncated protobuf",
                  "remedy": "export the graph again"},
    }
    for key in ("artifact", "plan", "worker", "proof", "parity", "timings", "memory", "ledger"):
        doc[key] = None
    return doc


ALL = {"placed": placed, "refused": refused, "error": error, "over_budget": over_budget,
       "schema_1_0": schema_1_0}
