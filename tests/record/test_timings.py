"""``xstage.timings``: percentiles only where the runs resolve them, and the throughput block."""

from __future__ import annotations

import pytest
import record_docs

from xstage.record import summary_rows, validate_record
from xstage.timings import needs_runs, parse_percentiles, summarize, throughput_block


@pytest.mark.parametrize(("q", "runs"), [(50, 1), (25, 1), (90, 10), (99, 100), (99.9, 1000), (75, 4)])
def test_a_percentile_needs_one_sample_above_it(q, runs):
    assert needs_runs(q) == runs


def test_percentiles_parse_sorted_and_unique():
    assert parse_percentiles("99.9, 50,90") == (50.0, 90.0, 99.9)


@pytest.mark.parametrize(("text", "why"), [("50,x", "'x' is not a number"), ("0", "outside (0, 100)"),
                                          ("100", "outside (0, 100)"), ("90,90", "named twice")])
def test_a_bad_percentile_names_itself(text, why):
    with pytest.raises(ValueError, match=__import__("re").escape(why)):
        parse_percentiles(text)


def test_an_unresolved_percentile_is_none_with_the_runs_it_needs():
    t = summarize([0.001] * 20, [0.002] * 20, warmup=0, percentiles=(50, 90, 99, 99.9))
    by_key = {p["key"]: p for p in t["percentiles"]}
    assert list(by_key) == ["p50", "p90", "p99", "p99.9"]
    assert by_key["p90"]["round_trip_ms"] == pytest.approx(2.0)
    assert by_key["p99"]["round_trip_ms"] is None and by_key["p99"]["needs_runs"] == 100
    assert by_key["p99.9"]["compute_ms"] is None and by_key["p99.9"]["needs_runs"] == 1000


def test_the_summary_prints_the_percentiles_and_throughput_and_the_record_validates():
    doc = record_docs.placed()
    doc["timings"] = summarize([0.001] * 12, [0.002] * 12, warmup=1)
    doc["timings"]["throughput"] = throughput_block(depth=4, requests=40, wall_s=0.5,
                                                    latency_s=[0.004] * 40)
    validate_record(doc)
    rows = dict(summary_rows(doc))
    assert rows["round trip pctl"] == "p50 2.000 ms · p90 2.000 ms · p99 n/a (needs ≥ 100 runs)"
    assert rows["throughput"] == ("80.0 requests/s at depth 4 (40 requests in 0.5 s); latency "
                                  "p50 4.000 ms · p90 4.000 ms · p99 n/a (needs ≥ 100 runs)")
