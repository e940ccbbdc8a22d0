"""The encoder's and the readers' signature caches change no outcome.

``encode_frame`` reuses the descriptor JSON of a signature it encoded before, and
``_validate_head`` reuses the checked descriptor list of a header whose ``t`` member is
byte-identical to one it checked before. Each test here runs a case twice (a cold cache,
then a warm one) and asserts the same bytes, the same header, or the same refusal, word for
word, as the full path.
"""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from xstage_remote import wire


@pytest.fixture(autouse=True)
def _cold() -> None:
    wire._SIGNATURES.clear()
    wire._CHECKED_T.clear()


def _full_path_bytes(header, arrays) -> bytes:
    """What the encoder writes with its cache empty (the descriptors built afresh)."""
    wire._SIGNATURES.clear()
    return b"".join(bytes(p) for p in wire.encode_frame(header, arrays))


@pytest.mark.parametrize("make", [
    lambda: np.arange(12, dtype=np.float32).reshape(3, 4),
    lambda: np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],           # not contiguous
    lambda: np.arange(12, dtype=">f4").reshape(3, 4),                       # big-endian
    lambda: np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16),      # no buffer protocol
    lambda: np.zeros((2, 0, 3), np.float32),                                # empty
    lambda: np.float64(2.5) * np.ones(()),                                  # rank 0
])
def test_a_warm_signature_encodes_the_same_bytes(make) -> None:
    header = {"op": "result", "id": 4, "gen": 1, "timing": {"worker_ns": 7}}
    want = _full_path_bytes(header, {"y": make(), "z": np.ones(3, np.int64)})
    for i in range(3):  # cold, then warm twice: fresh arrays of the same signature
        got = b"".join(bytes(p) for p in wire.encode_frame(header, {"y": make(),
                                                                      "z": np.ones(3, np.int64)}))
        assert got == want, i
        frame = wire.parse_frame(got)
        np.testing.assert_array_equal(frame.arrays()["y"].astype(np.float64),
                                      np.asarray(make()).astype(np.float64))


def test_the_encoder_writes_t_last_and_a_bad_name_is_still_refused() -> None:
    raw = bytes(wire.encode_frame({"op": "run", "id": 1, "t": "ignored"},
                                  {"x": np.zeros(2, np.float32)})[1])
    assert raw.endswith(b"]}") and list(json.loads(raw))[-1] == "t"
    for _ in range(2):
        with pytest.raises(wire.ProtocolError, match="tensor name"):
            wire.encode_frame({"op": "run", "id": 1}, {"": np.zeros(2, np.float32)})


def _frame(header: bytes, plen: int = 8) -> bytes:
    """A frame built by hand around ``header`` (no encoder checks), with a zero payload."""
    return struct.pack("<4sIQ", wire.MAGIC, len(header), plen) + header + bytes(plen)


T8 = b'[{"name":"x","dtype":"float32","shape":[2],"offset":0,"nbytes":8}]'


def _outcome(data: bytes):
    try:
        frame = wire.parse_frame(data)
    except wire.ProtocolError as exc:
        return "refused", str(exc)
    return "parsed", frame.header


@pytest.mark.parametrize("header", [
    b'{"op":"run","id":1,"t":' + T8 + b"}",                                   # the encoder's form
    b'{"op":"run","id":1,"options":{"t":[1]},"t":' + T8 + b"}",
    b'{"op":"run","t":' + T8 + b',"id":1}',                                   # t not last
    b'{"op":"run","id":1,"t":[],"t":' + T8 + b"}",                            # t twice
    b'{ ,"t":' + T8 + b"}",                                                    # nothing before t
    b'{ "op":"run","id":1 ,"t":' + T8 + b"}",                                 # whitespace
    b'{"op":"run","id":1,"options":{"a":"x","t":' + T8 + b"}",                # t in a nested object
    b'{"op":"run","id":1,"options":{"a":"\\",\\"t\\":[","b":1},"t":' + T8 + b"}",  # in a string
    b'{"op":"run","id":1,"options":{"a":[1,2]},"t":' + T8 + b"}",
    b'{"op":"run","id":"1","t":' + T8 + b"}",                                 # a bad id
    b'{"op":"run","id":1,"gen":0,"t":' + T8 + b"}",                           # a bad generation
    b'{"op":"run","id":1,"extra":0,"t":' + T8 + b"}",                         # an unknown field
    b'{"op":"result","id":1,"t":' + T8 + b"}",
])
def test_a_warm_descriptor_list_changes_no_outcome(header: bytes) -> None:
    wire._CHECKED_T.clear()
    cold = _outcome(_frame(header))
    wire._CHECKED_T.clear()
    _outcome(_frame(b'{"op":"run","id":9,"t":' + T8 + b"}"))  # warm the cache with this list
    assert wire._CHECKED_T
    assert _outcome(_frame(header)) == cold


def test_a_cached_list_is_not_shared_with_callers() -> None:
    data = _frame(b'{"op":"run","id":1,"t":' + T8 + b"}")
    first = wire.parse_frame(data)
    first.header["t"][0]["name"] = "changed"
    second = wire.parse_frame(data)
    assert second.header["t"][0]["name"] == "x" and list(second.arrays()) == ["x"]


def test_the_same_list_under_another_payload_length_is_checked_again() -> None:
    wire.parse_frame(_frame(b'{"op":"run","id":1,"t":' + T8 + b"}"))
    with pytest.raises(wire.ProtocolError, match="cover 8 bytes of a 12-byte payload"):
        wire.parse_frame(_frame(b'{"op":"run","id":2,"t":' + T8 + b"}", plen=12))


def test_only_small_descriptor_lists_are_kept() -> None:
    many = {f"tensor-{i:04d}": np.zeros(1, np.float32) for i in range(300)}
    data = b"".join(bytes(p) for p in wire.encode_frame({"op": "run", "id": 1}, many))
    assert len(data) > 2 * wire._MAX_CACHED_T_BYTES and not wire._SIGNATURES
    wire.parse_frame(data)
    assert not wire._CHECKED_T
