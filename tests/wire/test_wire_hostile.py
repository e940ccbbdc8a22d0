"""The hostile corpus (tests/wire/hostile/): every file is refused, cheaply, by both decoders."""

import importlib.util
import os
import tracemalloc

import pytest

from xstage_remote import wire

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile")
FILES = sorted(f for f in os.listdir(HERE) if f.endswith(".bin"))


def load_generator():
    """Import ``hostile/make_corpus.py`` by path (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("xstage_wire_make_corpus",
                                                  os.path.join(HERE, "make_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(name):
    with open(os.path.join(HERE, name), "rb") as f:
        return f.read()


def test_corpus_matches_its_generator():
    """The files on disk are exactly what ``make_corpus.py`` writes (rerun it after edits)."""
    built = load_generator().build()
    assert sorted(n + ".bin" for n in built) == FILES
    for name, data in built.items():
        assert read(name + ".bin") == data, f"{name}.bin is stale: run make_corpus.py"


def test_corpus_is_not_empty():
    """The corpus holds the attacks the style brief names."""
    for needle in ("huge_payload_2e40", "shape_product_overflows_int64", "duplicate_names",
                   "pickle_proto4_as_header", "json_bomb_nesting"):
        assert needle + ".bin" in FILES


@pytest.mark.parametrize("name", FILES)
def test_rejects_hostile_frame_in_memory(name):
    """``parse_frame`` refuses every corpus file with ``ProtocolError`` and nothing else."""
    with pytest.raises(wire.ProtocolError):
        wire.parse_frame(read(name))


@pytest.mark.parametrize("name", FILES)
def test_rejects_hostile_frame_over_socket(name, feed_socket):
    """``recv_frame`` refuses every corpus file; a truncated one is ``PeerClosed(partial)``.

    Peak traced memory stays within 1 MiB plus a small multiple of the header bytes the
    frame actually sent: nothing is sized by a claimed length that has not passed its check.
    """
    data = read(name)
    expected = wire.PeerClosed if name.startswith("truncated_") else wire.ProtocolError
    tracemalloc.start()
    try:
        with pytest.raises(expected) as info:
            feed_socket(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if expected is wire.PeerClosed:
        assert info.value.partial is True
    assert peak < (1 << 20) + 4 * len(data), f"peak {peak} bytes for a {len(data)}-byte file"


@pytest.mark.parametrize("name", [f for f in FILES if not f.startswith("truncated_")])
def test_hostile_frame_gets_the_same_refusal_from_both_decoders(name, feed_socket):
    """``parse_frame`` and ``recv_frame`` refuse a complete hostile frame with one message."""
    data = read(name)
    with pytest.raises(wire.ProtocolError) as in_memory:
        wire.parse_frame(data)
    with pytest.raises(wire.ProtocolError) as over_socket:
        feed_socket(data)
    assert str(in_memory.value) == str(over_socket.value)


def test_fuzz_target_runs_on_corpus():
    """``fuzz_parse_frame.TestOneInput`` swallows only ProtocolError, on every corpus file."""
    spec = importlib.util.spec_from_file_location(
        "xstage_wire_fuzz_target",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_parse_frame.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in FILES:
        module.TestOneInput(read(name))
