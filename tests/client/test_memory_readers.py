"""The worker's memory readers: pure parsers on recorded values, and a real worker's figures."""

from __future__ import annotations

import mmap
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from xstage.client import WorkerClient
from xstage_remote import memory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
MiB = 1 << 20


def test_status_gives_rss_and_high_water_mark():
    text = (FIXTURES / "linux-status.txt").read_text()
    assert memory.parse_status(text) == (13596 * 1024, 13596 * 1024)


def test_status_peak_below_rss_is_raised_to_it():
    """The kernel updates VmHWM lazily; a stale one never reads below the current RSS."""
    assert memory.parse_status("VmHWM:\t 100 kB\nVmRSS:\t 150 kB\n") == (150 * 1024, 150 * 1024)


def test_status_without_the_fields_reads_zero():
    assert memory.parse_status("Name:\tkthreadd\nState:\tS (sleeping)\n") == (0, 0)


def test_smaps_rollup_gives_pss_and_uss():
    text = (FIXTURES / "linux-smaps_rollup.txt").read_text()
    got = memory.parse_smaps_rollup(text)
    assert got == {"rss": 13596 * 1024, "pss": 12601 * 1024, "uss": (5168 + 6864) * 1024}


def test_smaps_rollup_without_rss_is_empty():
    assert memory.parse_smaps_rollup("garbage\n") == {}


@pytest.mark.parametrize(("platform_name", "value", "expected"), [
    ("linux", 65536, 64 * MiB),    # KiB on Linux
    ("freebsd13", 65536, 64 * MiB),
    ("darwin", 64 * MiB, 64 * MiB),  # bytes on macOS
])
def test_maxrss_units_by_platform(platform_name, value, expected):
    assert memory.peak_from_maxrss(value, platform_name) == expected


def _counters(peak_ws, ws, private):
    """PROCESS_MEMORY_COUNTERS_EX as a 64-bit Windows process lays it out (cb = 80)."""
    return struct.pack("<II9Q", 80, 1234, peak_ws, ws, 0, 0, 0, 0, private, private, private)


def test_windows_counters_from_their_bytes():
    raw = _counters(peak_ws=300 * MiB, ws=250 * MiB, private=200 * MiB)
    assert memory.windows_counters_from_bytes(raw) == {
        "rss": 250 * MiB, "peak": 300 * MiB, "private": 200 * MiB}


def test_windows_peak_is_never_below_the_working_set():
    raw = _counters(peak_ws=10 * MiB, ws=20 * MiB, private=5 * MiB)
    assert memory.windows_counters_from_bytes(raw)["peak"] == 20 * MiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_real_worker_reports_its_own_peak_not_its_parents(graphs):
    """getrusage's ru_maxrss carries the exec'ing image's peak into the worker; VmHWM does not."""
    ballast = np.ones(300 * MiB // 8)  # make this client clearly larger than any worker
    try:
        with WorkerClient(sys.executable) as w:
            bare = w.ping()
            w.load(graphs["mlp"])
            w.run({"x": np.zeros((8, 256), np.float32)})
            timing = w.last_timing
            detail = w.ping()
    finally:
        del ballast
    assert bare["peak"] < 200 * MiB, bare  # a bare worker: Python + numpy, tens of MiB
    assert 0 < timing["rss"] <= timing["peak"] < 300 * MiB
    assert detail["source"] == "proc-status"
    assert 0 < detail["uss"] <= detail["pss"] <= detail["rss"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_peak_follows_growth_between_readings():
    """A reading after new page faults re-reads the high-water mark; one without reuses it."""
    rss0, _ = memory.read()
    # Fresh pages from the kernel, whatever the allocator holds from earlier tests in this
    # process (a heap that kept freed pages resident would give them back without a fault).
    block = mmap.mmap(-1, 64 * MiB)
    np.frombuffer(block, np.uint8)[:] = 1  # faults 64 MiB in
    rss1, peak1 = memory.read()
    block.close()  # unmapped at once
    rss2, peak2 = memory.read()
    assert rss1 >= rss0 + 60 * MiB
    assert peak1 >= rss1
    assert rss2 < rss1 and peak2 >= peak1  # the high-water mark never falls, though the RSS did


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clear_refs is Linux's")
def test_reset_peak_lowers_the_high_water_mark_to_what_is_still_held():
    """256 MiB touched and freed: the peak keeps it until ``reset_peak``, then reads what the
    process still holds (run in a child, so this process's own mark is left alone)."""
    import subprocess

    code = (
        "import numpy as np\n"
        "from xstage_remote import memory\n"
        "a = np.ones(64 << 20, np.float32); del a\n"
        "memory.release_freed()\n"
        "before = memory.read()[1]\n"
        "assert memory.reset_peak()\n"
        "rss, after = memory.read()\n"
        "print(before, after, rss)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    before, after, rss = (int(x) for x in out)
    assert before - after > 200 * MiB
    assert after >= rss
