"""``parse_profile`` on profiles recorded from real onnxruntime runs (tests/fixtures/profiles).

Each fixture's ``meta.json`` says which onnxruntime wrote it; ``capture.py`` beside them
regenerates them. The hostile cases (cut short, garbage) are made from those files here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xstage.evidence import ParsedProfile, parse_profile

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"


def text(name: str) -> str:
    """A recorded profile's text, as onnxruntime wrote it."""
    return (PROFILES / f"{name}.profile.json").read_text()


def kernels(parsed: ParsedProfile) -> list[tuple[str, str | None, str | None]]:
    """(name, provider, op_name) of the kernel events."""
    return [(e["name"], e["provider"], e["op_name"])
            for e in parsed.events if e["name"].endswith("_kernel_time")]


QUOTED = ['relu "quoted"_kernel_time', "neg\\back\\slash_kernel_time"]


def test_recorded_132_profile_loads_as_json_with_every_event():
    parsed = parse_profile(text("ort132_cpu_mlp"))
    assert (parsed.method, parsed.complete, parsed.fences, parsed.unreadable) == ("json", True, 0, 0)
    assert len(parsed.events) == len(json.loads(text("ort132_cpu_mlp")))
    assert [k[1:] for k in kernels(parsed)] == [
        ("CPUExecutionProvider", "FusedGemm"), ("CPUExecutionProvider", "FusedGemm"),
        ("CPUExecutionProvider", "Tanh"),
    ]
    assert all(isinstance(e["dur"], int) and e["dur"] >= 0 for e in parsed.events)


def test_fence_events_of_119_are_skipped_and_counted():
    raw = json.loads(text("ort119_cpu_mlp"))
    fences = [e for e in raw if e["name"].endswith(("_fence_before", "_fence_after"))]
    assert len(fences) == 6  # before and after each of the three kernels
    parsed = parse_profile(text("ort119_cpu_mlp"))
    assert parsed.method == "json" and parsed.fences == 6
    assert not any("fence" in e["name"] for e in parsed.events)
    assert len(parsed.events) == len(raw) - 6
    assert any("fence events skipped" in note for note in parsed.notes)


@pytest.mark.parametrize("name", ["ort119_cpu_quoted", "ort130_cpu_quoted"])
def test_unescaped_names_are_not_json_and_are_read_line_by_line(name):
    with pytest.raises(json.JSONDecodeError):
        json.loads(text(name))  # onnxruntime <= 1.30 writes the quote and backslashes raw
    parsed = parse_profile(text(name))
    assert (parsed.method, parsed.complete, parsed.unreadable) == ("lines", True, 0)
    assert kernels(parsed) == [(QUOTED[0], "CPUExecutionProvider", "Relu"),
                               (QUOTED[1], "CPUExecutionProvider", "Neg")]
    assert [e["name"] for e in parsed.events if e["cat"] == "Session"][-1] == "model_run"
    assert any("not valid JSON" in note and "line by line" in note for note in parsed.notes)


def test_132_escapes_the_same_names_and_both_readings_agree():
    parsed = parse_profile(text("ort132_cpu_quoted"))
    assert parsed.method == "json"
    assert [k[0] for k in kernels(parsed)] == QUOTED
    assert [k[0] for k in kernels(parse_profile(text("ort119_cpu_quoted")))] == QUOTED


def test_line_reading_matches_json_reading_on_a_valid_profile():
    """The fallback reader gives what json.loads gives, event for event."""
    original = text("ov124_det")
    broken = original.replace("},\n", "}\n", 1)  # a comma gone: no longer JSON, still one event a line
    lines = parse_profile(broken)
    assert lines.method == "lines"
    assert [dict(e) for e in lines.events] == [dict(e) for e in parse_profile(original).events]


def test_the_regexes_recover_an_event_whose_args_do_not_parse():
    line = ('{"cat" : "Node","pid" :1,"tid" :1,"dur" :12,"ts" :3,"ph" : "X","name" :"a "b"\\c_kernel_time",'
            '"args" : {"provider" : "OpenVINOExecutionProvider","op_name" : "OpenVINO-EP-subgraph_1", '
            'broken}}')
    parsed = parse_profile("[\n" + line + "\n]\n")
    assert (parsed.method, parsed.complete) == ("lines", True)
    assert [dict(e) for e in parsed.events] == [{
        "cat": "Node", "name": 'a "b"\\c_kernel_time', "dur": 12, "ts": 3, "tid": 1,
        "provider": "OpenVINOExecutionProvider", "op_name": "OpenVINO-EP-subgraph_1",
    }]


def test_a_profile_cut_short_is_incomplete_with_a_note():
    whole = text("ort119_cpu_quoted")
    cut = whole[: len(whole) // 2]
    parsed = parse_profile(cut)
    assert parsed.method == "lines" and not parsed.complete
    assert any("cut short" in note for note in parsed.notes)


def test_an_unreadable_line_makes_a_line_read_profile_incomplete():
    # A name with a raw newline (written unescaped) splits its event over two lines.
    broken = text("ort119_cpu_quoted").replace('relu "quoted"_kernel_time', 'relu "quo\nted"_kernel_time')
    parsed = parse_profile(broken)
    assert parsed.method == "lines" and parsed.unreadable == 2 and not parsed.complete
    assert any("may have held a kernel" in note for note in parsed.notes)


def test_a_json_profile_cut_after_its_last_event_is_still_incomplete():
    whole = text("ort132_cpu_mlp")
    parsed = parse_profile(whole[: whole.rindex("]")])
    assert not parsed.complete and len(parsed.events) == len(json.loads(whole))


@pytest.mark.parametrize(
    "garbage", ["\x00\x01 not a profile", "{", "[[[", "]", "[\n]", '{"a": 1}', "42", "null"]
)
def test_garbage_gives_no_events_never_an_exception(garbage):
    parsed = parse_profile(garbage)
    assert parsed.events == () or all(e["name"] for e in parsed.events)
    assert not any(e["name"].endswith("_kernel_time") for e in parsed.events)


def test_none_and_empty_are_nothing_to_read():
    assert parse_profile(None).method == "none" and parse_profile(None).notes == ("no profile was collected",)
    assert parse_profile("  \n").method == "none" and not parse_profile("").complete


def test_bytes_are_decoded_and_trace_event_objects_accepted():
    raw = json.loads(text("ov124_whole"))
    assert parse_profile(text("ov124_whole").encode()).events == parse_profile(text("ov124_whole")).events
    wrapped = parse_profile(json.dumps({"traceEvents": raw}))
    assert wrapped.complete and len(wrapped.events) == len(raw)


def test_elements_that_are_not_events_are_counted():
    events = [{"cat": "Node"}, 3, {"cat": "Node", "name": "x_kernel_time", "dur": "7"}]
    parsed = parse_profile(json.dumps(events))
    assert parsed.unreadable == 2 and [e["dur"] for e in parsed.events] == [7]


def test_rejects_a_profile_that_is_not_text():
    with pytest.raises(TypeError, match="profile text must be str, bytes or None, not int"):
        parse_profile(3)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from('[]{}",:\\ \nabcNode_kernel_timecatnamedurargs0123'), max_size=300))
def test_never_raises_on_any_text(blob):
    parsed = parse_profile(blob)
    assert parsed.method in ("json", "lines", "none")
