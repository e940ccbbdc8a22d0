"""The ledger's arithmetic (pure) and the process-wide Ledger's bookkeeping."""

from __future__ import annotations

import threading

import pytest

from xstage import errors, ledger
from xstage.host.hardware import Device
from xstage.ledger import Pool, Reservation
from xstage.stage.ledger import Ledger

MiB = 1 << 20


def _res(purpose, n, lifetime, pool="host_ram", evidence="E"):
    return Reservation(purpose, n * MiB, pool, lifetime, evidence, "test")


def _budget(load=10, session=50, request=30, pool="host_ram"):
    return ledger.make_budget([_res("parsed", load, "load", pool), _res("weights", session, "session", pool),
                               _res("acts", request, "request", pool)], pool=pool)


def test_budget_is_the_larger_phase_not_the_sum():
    b = _budget(load=10, session=50, request=30)
    # load phase 60, steady phase 80: the steady phase decides; the margin is 25% of it.
    assert b.phase == "steady"
    assert b.budget_bytes == (80 + 20) * MiB
    assert b.budget_bytes < (10 + 50 + 30) * MiB * 1.25  # never the naive sum


def test_load_phase_can_decide():
    b = _budget(load=100, session=50, request=30)
    assert b.phase == "load" and b.budget_bytes == int(150 * MiB * 1.25)


def test_margin_is_a_reservation_of_its_own():
    b = _budget()
    margin = b.reservations[-1]
    assert margin.purpose == "margin" and margin.evidence == "E" and margin.bytes == 20 * MiB
    assert "25%" in margin.basis


@pytest.mark.parametrize(("field", "value"), [("lifetime", "forever"), ("evidence", "X")])
def test_reservation_rejects_unknown_kinds(field, value):
    kwargs = dict(purpose="p", bytes=1, pool="host_ram", lifetime="load", evidence="D", basis="b")
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        Reservation(**kwargs)


def test_budget_refuses_a_reservation_from_another_pool():
    with pytest.raises(ValueError, match="vram"):
        ledger.make_budget([_res("w", 1, "session", pool="vram:gpu_discrete:nvidia:0")],
                           pool="host_ram")


def test_fit_counts_what_is_already_held():
    pool = Pool("host_ram", 200 * MiB, "test")
    b = _budget()  # 100 MiB
    assert ledger.check_fit(pool, 0, b).fits
    assert ledger.check_fit(pool, 100 * MiB, b).fits  # exactly full
    fit = ledger.check_fit(pool, 101 * MiB, b)
    assert not fit.fits and fit.cause == "over_budget" and fit.free_bytes == 99 * MiB
    assert "does not fit" in fit.message() and "held by open stages" in fit.message()


def test_unknown_capacity_is_refused_never_skipped():
    fit = ledger.check_fit(Pool("vram:gpu_discrete:x:0", None, "no memory figure"), 0, _budget())
    assert not fit.fits and fit.cause == "capacity_unknown"
    assert "--pool vram:gpu_discrete:x:0=" in fit.remedy()


@pytest.mark.parametrize(("peak", "verdict", "cause"), [
    (None, "unreported", "peak_unreported"),
    (0, "unreported", "peak_unreported"),
    (50 * MiB, "within", None),
    (100 * MiB, "within", None),
    (101 * MiB, "over", "peak_over_budget"),
])
def test_measured_verdicts(peak, verdict, cause):
    m = ledger.check_measured(100 * MiB, peak)
    assert (m.verdict, m.cause) == (verdict, cause)
    if peak:
        assert m.budget_over_measured == pytest.approx(100 * MiB / peak)
    else:
        assert m.budget_over_measured is None


@pytest.mark.parametrize(("text", "expected"), [
    ("4GiB", 4 << 30), ("8GB", 8 * 10**9), ("512MiB", 512 * MiB), ("1.5G", 1_500_000_000),
    ("123", 123), (" 2 gib ", 2 << 30), (77, 77),
])
def test_sizes(text, expected):
    assert ledger.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "4 parsecs", "-1GiB", "GiB", "1e9", "four"])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(errors.UsageError):
        ledger.parse_size(text)


def test_pool_argument_splits_on_the_last_equals_sign():
    assert ledger.parse_pool_arg("vram:gpu_discrete:nvidia:0=8GB") == (
        "vram:gpu_discrete:nvidia:0", 8 * 10**9)
    assert ledger.parse_pool_arg("host_ram=4GiB") == ("host_ram", 4 << 30)
    for bad in ("host_ram", "=4GiB", "host_ram=lots"):
        with pytest.raises(errors.UsageError):
            ledger.parse_pool_arg(bad)


def _dev(id_, kind, pool, memory=0, available=0):
    return Device(id=id_, kind=kind, vendor="v", name=id_, pool=pool, memory_bytes=memory,
                  available_bytes=available, sources=("test",))


def test_pools_from_devices_share_host_ram_and_split_discrete_gpus():
    devices = [
        _dev("cpu", "cpu", "host_ram", 32 << 30, 20 << 30),
        _dev("gpu_integrated:amd", "gpu_integrated", "host_ram"),
        _dev("npu:amd", "npu", "host_ram"),
        _dev("gpu_discrete:nvidia:0", "gpu_discrete", "vram:gpu_discrete:nvidia:0", 24 << 30, 22 << 30),
        _dev("gpu_discrete:nvidia:1", "gpu_discrete", "vram:gpu_discrete:nvidia:1", 24 << 30),
        _dev("gpu_discrete:amd:0", "gpu_discrete", "vram:gpu_discrete:amd:0"),
    ]
    pools = ledger.pools_from_devices(devices, host_available=20 << 30, host_source="now")
    assert list(pools) == ["host_ram", "vram:gpu_discrete:nvidia:0", "vram:gpu_discrete:nvidia:1",
                           "vram:gpu_discrete:amd:0"]
    assert pools["host_ram"].capacity_bytes == 20 << 30  # counted once for cpu, iGPU and NPU
    assert pools["vram:gpu_discrete:nvidia:0"].capacity_bytes == 22 << 30  # free, when reported
    assert pools["vram:gpu_discrete:nvidia:1"].capacity_bytes == 24 << 30
    assert "free memory was not reported" in pools["vram:gpu_discrete:nvidia:1"].source
    assert pools["vram:gpu_discrete:amd:0"].capacity_bytes is None


def test_blind_spots_name_shared_memory_devices():
    assert ledger.blind_spots("cpu", "host_ram") == []
    (spot,) = ledger.blind_spots("gpu_integrated", "host_ram")
    assert "outside the worker's working set" in spot
    assert ledger.blind_spots("npu", "host_ram")
    (spot,) = ledger.blind_spots("gpu_discrete", "vram:gpu_discrete:nvidia:0")
    assert "not charged to host_ram" in spot


def test_record_block_verdicts():
    b = _budget()
    pool = Pool("host_ram", 1 << 30, "test")
    fit = ledger.check_fit(pool, 0, b)
    ok = ledger.record_block(b, fit, ledger.check_measured(b.budget_bytes, 50 * MiB),
                             memory={"rss": 40 * MiB, "uss": 30 * MiB, "pss": 35 * MiB})
    assert ok["verdict"] == "within_budget" and ok["cause"] is None
    assert ok["budget_over_measured"] == pytest.approx(2.0) and ok["uss_bytes"] == 30 * MiB
    over = ledger.record_block(b, fit, ledger.check_measured(b.budget_bytes, 200 * MiB))
    assert (over["verdict"], over["cause"]) == ("refused", "peak_over_budget")
    small = Pool("host_ram", 10 * MiB, "test")
    before = ledger.record_block(b, ledger.check_fit(small, 0, b), None)
    assert (before["verdict"], before["cause"]) == ("refused", "over_budget")
    assert before["measured_peak_bytes"] is None


# --------------------------------------------------------------------------- the Ledger
def test_ledger_snapshots_host_ram_once():
    book = Ledger()
    first = book.pool("host_ram")
    assert first.capacity_bytes and first.capacity_bytes > 0
    assert book.pool("host_ram") is first  # never re-read: held stages are not counted twice


def test_ledger_holds_and_releases():
    book = Ledger(capacity={"host_ram": "150MiB"})
    b = _budget()  # 100 MiB
    h1, fit = book.reserve(b, "first")
    assert h1 is not None and fit.fits
    h2, fit2 = book.reserve(b, "second")
    assert h2 is None and fit2.cause == "over_budget" and fit2.held_bytes == 100 * MiB
    book.release(h1)
    book.release(h1)  # idempotent
    h3, _ = book.reserve(b, "second again")
    assert h3 is not None and book.held_bytes("host_ram") == 100 * MiB


def test_ledger_reservation_is_atomic_across_threads():
    book = Ledger(capacity={"host_ram": "250MiB"})
    got = []
    barrier = threading.Barrier(8)

    def take():
        barrier.wait()
        got.append(book.reserve(_budget(), "t")[0])

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(h is not None for h in got) == 2  # 2 x 100 MiB fit in 250 MiB, never 3


def test_ledger_reads_a_discrete_gpu_pool_from_the_device_rows():
    book = Ledger()
    gpu = _dev("gpu_discrete:nvidia:0", "gpu_discrete", "vram:gpu_discrete:nvidia:0", 24 << 30, 20 << 30)
    pool = book.pool("vram:gpu_discrete:nvidia:0", [gpu])
    assert pool.capacity_bytes == 20 << 30
    unknown = book.pool("vram:gpu_discrete:amd:0", [_dev("gpu_discrete:amd:0", "gpu_discrete",
                                                             "vram:gpu_discrete:amd:0")])
    assert unknown.capacity_bytes is None
    b = ledger.make_budget([_res("w", 1, "session", pool="vram:gpu_discrete:amd:0")],
                           pool="vram:gpu_discrete:amd:0")
    holding, fit = book.reserve(b, "x")
    assert holding is None and fit.cause == "capacity_unknown"


def test_user_capacity_wins_over_what_was_read():
    book = Ledger(capacity={"vram:gpu_discrete:amd:0": "8GB"})
    pool = book.pool("vram:gpu_discrete:amd:0", [])
    assert pool.capacity_bytes == 8 * 10**9 and pool.source == "set by the user"


def test_summary_rows_show_budget_measurement_and_reservations():
    from tests.record import record_docs
    from xstage.record.summary import ledger_rows, summary

    rows = dict(ledger_rows(record_docs.placed()["ledger"]))
    assert rows["budget"].startswith("312.5 MiB in host_ram (steady phase) of 22.4 GiB")
    assert "budget/measured 1.48" in rows["measured"] and "uss 199.3 MiB" in rows["measured"]
    assert rows["ledger"].startswith("within_budget · runtime 120.0 MiB E · weights 4.5 MiB D")
    refused = dict(ledger_rows(record_docs.over_budget()["ledger"]))
    assert "measured" not in refused and refused["ledger"].startswith("refused (over_budget)")
    assert any(line.startswith("budget: ") for line in summary(record_docs.over_budget()))
    assert ledger_rows(None) == [] and ledger_rows(record_docs.schema_1_0().get("ledger")) == []


def test_a_gpu_stage_holds_its_pinned_host_memory_beside_its_device_budget():
    """``reserve(also=...)``: one stage's budgets in two pools, held and released together."""
    vram = "vram:gpu_discrete:nvidia:0"
    book = Ledger(capacity={"host_ram": "300MiB", vram: "1GiB"})
    gpu = _budget(pool=vram)  # 100 MiB in the device's pool
    pinned = ledger.make_budget([_res("pinned region", 80, "session")], pool="host_ram")  # 100
    holding, fit = book.reserve(gpu, "s", also=(pinned,))
    assert holding is not None and fit.pool.name == vram
    assert book.held_bytes(vram) == 100 * MiB and book.held_bytes("host_ram") == 100 * MiB
    # the host pool now has 200 MiB left: a second stage's 250 MiB of pinned memory is refused,
    # and nothing of it is held in either pool
    big = ledger.make_budget([_res("pinned region", 200, "session")], pool="host_ram")
    none, why = book.reserve(gpu, "t", also=(big,))
    assert none is None and why.pool.name == "host_ram" and why.cause == "over_budget"
    assert book.held_bytes(vram) == 100 * MiB and book.held_bytes("host_ram") == 100 * MiB
    book.release(holding)
    assert book.held_bytes(vram) == 0 and book.held_bytes("host_ram") == 0


def test_the_pinned_block_reads_what_the_worker_registered():
    from xstage.ledger import measured

    pinned = ledger.make_budget([_res("pinned region", 8, "session")], pool="host_ram")
    doc = measured.pinned_block(pinned, {"state": "registered", "bytes": 8 * MiB})
    assert doc["budget_bytes"] == 10 * MiB and doc["measured_bytes"] == 8 * MiB
    assert doc["budget_over_measured"] == 1.25 and doc["state"] == "registered"
    failed = measured.pinned_block(pinned, {"state": "failed", "bytes": 8 * MiB, "why": "x"})
    assert failed["measured_bytes"] is None and failed["budget_over_measured"] is None
    assert measured.pinned_block(pinned, None)["state"] == "unreported"


# --------------------------------------------------------------------- a call's peak
def test_a_calls_host_peak_is_held_against_a_host_budget_only():
    """A call reports the worker's host RSS peak: over a host budget it warns; against a budget
    in a device pool it says nothing (the WebGPU tower's 223 MiB host peak against its 81.6 MiB
    of VRAM was a false warning)."""
    from xstage.ledger import HOST_POOL, call_peak_warning

    host = {"budget_bytes": 100 << 20, "pool": {"name": HOST_POOL}}
    vram = {"budget_bytes": 100 << 20, "pool": {"name": "vram:gpu_discrete:nvidia:0"}}
    warning = call_peak_warning(223 << 20, host)
    assert warning and "223.0 MiB" in warning and "100.0 MiB" in warning
    assert call_peak_warning(99 << 20, host) is None
    assert call_peak_warning(223 << 20, vram) is None
    assert call_peak_warning(None, host) is None and call_peak_warning(0, host) is None
