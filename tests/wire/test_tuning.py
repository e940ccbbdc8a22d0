"""The transport's knobs as one value: parsed once, every malformed one named, sent as is."""

from __future__ import annotations

import pytest

from xstage_remote import tuning
from xstage_remote.tuning import TransportTuning


def test_unset_environment_gives_the_defaults() -> None:
    value, problems = tuning.from_environ({})
    assert value == TransportTuning() and problems == []


def test_every_knob_is_read_from_its_variable() -> None:
    env = {"XSTAGE_SPIN_SECONDS": "0.01", "XSTAGE_CROWD_BLOCKS": "1", "XSTAGE_DOORBELL": "socket",
           "XSTAGE_SHM": "off", "XSTAGE_MAC_THREADS": "2", "XSTAGE_MAX_REGION_BYTES": "1024",
           "XSTAGE_WAIT_TRACE": "/tmp/w"}
    value, problems = tuning.from_environ(env)
    assert problems == []
    assert (value.spin_seconds, value.crowd_blocks, value.doorbell, value.shm, value.mac_threads,
            value.max_region_bytes, value.wait_trace) == (0.01, True, "socket", "off", 2, 1024, "/tmp/w")
    assert len(tuning.KNOBS) == len(TransportTuning.__dataclass_fields__) == 15


@pytest.mark.parametrize("variable, raw", [
    ("XSTAGE_SPIN_SECONDS", "fast"), ("XSTAGE_SPIN_SECONDS", "-1"), ("XSTAGE_NEAR_END_SECONDS", "inf"),
    ("XSTAGE_SHM", "tmpfs"), ("XSTAGE_MAC_THREADS", "17"), ("XSTAGE_MAX_REGION_BYTES", "1.5")])
def test_a_malformed_knob_is_named_with_a_value_that_works(variable: str, raw: str) -> None:
    value, problems = tuning.from_environ({variable: raw})
    assert value == TransportTuning()
    assert len(problems) == 1 and problems[0].startswith(f"{variable}={raw!r} is not")
    assert "e.g." in problems[0]


def test_the_wire_form_round_trips_and_tolerates_other_versions() -> None:
    value = TransportTuning(spin_seconds=0.0, mac_threads=0, wait_trace="/tmp/t")
    assert TransportTuning.from_wire(value.to_wire()) == value
    assert TransportTuning.from_wire({**value.to_wire(), "a_newer_knob": 3}) == value
    assert TransportTuning.from_wire({"spin_seconds": 0.5}) == TransportTuning(spin_seconds=0.5)
    assert TransportTuning.from_wire(None) == TransportTuning()
    with pytest.raises(ValueError, match="spin_seconds='0.5' is not a number"):
        TransportTuning.from_wire({"spin_seconds": "0.5"})
    with pytest.raises(ValueError, match="shm='tmpfs'"):
        TransportTuning.from_wire({"shm": "tmpfs"})


def test_overrides_win_and_are_checked() -> None:
    value, problems = tuning.from_environ({"XSTAGE_SPIN_SECONDS": "0.01"}, {"spin_seconds": 0.0})
    assert value.spin_seconds == 0.0 and problems == []
    _, problems = tuning.from_environ({}, {"spin_secs": 1})
    assert problems and "not a transport knob" in problems[0]
