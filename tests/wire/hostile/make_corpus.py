"""Write the hostile-frame corpus next to this file: ``python tests/wire/hostile/make_corpus.py``.

Each ``<name>.bin`` is one attack on the wire decoder (docs/wire.md, "Threat model"). Every
file MUST be refused with ``ProtocolError`` by ``parse_frame`` and by ``recv_frame``, except
the ``truncated_*`` ones, which ``recv_frame`` reports as ``PeerClosed(partial=True)``
because the stream ends inside the frame. ``tests/wire/test_wire_hostile.py`` checks that
the files on disk are exactly what ``build()`` returns, so edit this script, not the files.

Deterministic: no randomness, no clock. Frames are built by hand with ``struct`` and
``json`` (not with ``xstage_remote.wire``, whose encoder would refuse them). The pickle
samples are literal bytes: this script never imports ``pickle``, and nothing ever loads them.
"""

import json
import os
import struct
import sys

MAGIC = b"XSW1"
MAX_HEADER_BYTES = 1 << 20

#: ``posix.system("true")`` as a protocol-4 pickle (PROTO, FRAME, STACK_GLOBAL, REDUCE, STOP),
#: written out by hand. It is data here and is never unpickled.
PICKLE_PROTO4 = (
    b"\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00"
    b"\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94."
)
#: The same call as a protocol-0 pickle: printable ASCII, so it passes the UTF-8 check.
PICKLE_PROTO0 = b"cposix\nsystem\n(S'true'\ntR."


def frame(header, payload=b"", *, magic=MAGIC, hlen=None, plen=None):
    """Prefix + header + payload; ``header`` is a dict (compact JSON), str or bytes."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    hlen = len(header) if hlen is None else hlen
    plen = len(payload) if plen is None else plen
    return struct.pack("<4sIQ", magic, hlen, plen) + header + payload


def desc(name, dtype, shape, offset, nbytes):
    return {"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes}


def run(*descs):
    return {"op": "run", "id": 1, "t": list(descs)}


def build():
    """name → bytes for every corpus file, in a fixed order."""
    c = {}
    # --- lengths: the prefix alone must stop these, before anything is allocated.
    # A valid run header whose one tensor covers a 2^40-byte payload that never comes.
    c["huge_payload_2e40"] = frame(run(desc("x", "uint8", [1 << 40], 0, 1 << 40)),
                                   plen=1 << 40)
    c["huge_payload_u64_max"] = frame({"op": "ping", "id": 1}, plen=(1 << 64) - 1)
    c["huge_header_u32_max"] = frame({"op": "ping", "id": 1}, hlen=(1 << 32) - 1)
    c["header_one_byte_over_limit"] = frame(b"{" + b" " * 64, hlen=MAX_HEADER_BYTES + 1)
    c["header_length_zero"] = frame(b"", plen=0)
    c["bad_magic"] = frame({"op": "ping", "id": 1}, magic=b"XSW0")
    # --- pickle: never a header, never a frame.
    c["pickle_proto4_as_frame"] = PICKLE_PROTO4
    c["pickle_proto4_as_header"] = frame(PICKLE_PROTO4)
    c["pickle_proto0_as_header"] = frame(PICKLE_PROTO0)
    c["pickle_in_payload_of_ping"] = frame({"op": "ping", "id": 1}, PICKLE_PROTO4)
    c["pickle_op_reduce"] = frame({"op": "__reduce__", "id": 1})
    # --- JSON bombs and non-JSON numbers.
    depth = 50_000
    bomb = "[" * depth + "]" * depth
    c["json_bomb_nesting"] = frame('{"op":"pong","id":1,"info":{"a":' + bomb + "}}")
    c["json_bomb_nesting_unclosed"] = frame("[" * 100_000 + "{")
    c["json_huge_integer_id"] = frame('{"op":"ping","id":%s}' % ("7" * 20_000))
    c["json_nan"] = frame('{"op":"pong","id":1,"info":{"x":NaN}}')
    c["json_infinity_by_overflow"] = frame('{"op":"pong","id":1,"info":{"x":1e99999}}')
    c["json_duplicate_keys_polyglot"] = frame(
        '{"op":"run","id":1,"t":[],"t":[{"name":"x","dtype":"uint8","shape":[4],'
        '"offset":0,"nbytes":4}]}', b"\0\0\0\0")
    c["header_not_utf8"] = frame(b'{"op":"ping","id":1,"\xed\xa0\x80":1}')
    c["header_utf8_bom"] = frame(b'\xef\xbb\xbf{"op":"ping","id":1}')
    c["header_nul_padding"] = frame(b'{"op":"ping","id":1}' + b"\0" * 8)
    # --- shapes: products that overflow, wrap, or exceed numpy's limits.
    c["shape_product_overflows_int64"] = frame(
        run(desc("x", "float64", [1 << 40, 1 << 40, 1 << 40], 0, 8)), bytes(8))
    c["shape_product_wraps_to_zero"] = frame(
        run(desc("x", "uint8", [1 << 32, 1 << 32], 0, 0)))
    # 8 * (2^62 + 1) = 2^65 + 8: a decoder multiplying in wrapping u64 would read 8 bytes.
    c["shape_product_wraps_to_eight"] = frame(
        run(desc("x", "uint8", [8, 5, 5581, 8681, 49477, 384773], 0, 8)), bytes(8))
    c["shape_empty_but_numpy_overflow"] = frame(
        run(desc("x", "float64", [0, 1 << 40, 1 << 40], 0, 0)))
    c["shape_negative_dims"] = frame(run(desc("x", "uint8", [-2, -4], 0, 8)), bytes(8))
    c["shape_dim_2e63"] = frame(run(desc("x", "uint8", [1 << 63], 0, 1 << 63)))
    c["shape_rank_33"] = frame(run(desc("x", "uint8", [1] * 33, 0, 1)), b"\0")
    c["shape_rank_10000"] = frame(run(desc("x", "uint8", [1] * 10_000, 0, 1)), b"\0")
    # --- tensor lists: names, dtypes, offsets.
    c["duplicate_names"] = frame(run(desc("x", "uint8", [4], 0, 4), desc("x", "uint8", [4], 4, 4)),
                                 bytes(8))
    c["overlapping_offsets"] = frame(
        run(desc("a", "uint8", [8], 0, 8), desc("b", "float64", [1], 0, 8)), bytes(8))
    c["hole_between_tensors"] = frame(
        run(desc("a", "uint8", [4], 0, 4), desc("b", "uint8", [4], 8, 4)), bytes(12))
    c["trailing_payload_bytes"] = frame(run(desc("a", "uint8", [4], 0, 4)), bytes(4) + b"HIDE")
    c["negative_offset"] = frame(run(desc("a", "uint8", [4], -4, 4)), bytes(4))
    c["nbytes_lies"] = frame(run(desc("a", "float32", [4], 0, 4)), bytes(4))
    c["dtype_object"] = frame(run(desc("a", "object", [1], 0, 8)), bytes(8))
    c["dtype_numpy_spelling"] = frame(run(desc("a", "<f8", [1], 0, 8)), bytes(8))
    c["descriptor_with_strides"] = frame(
        run(dict(desc("a", "uint8", [2, 2], 0, 4), strides=[-2, 1])), bytes(4))
    # The count is checked before any descriptor is looked at, so the entries can be junk.
    c["too_many_tensors"] = frame({"op": "run", "id": 1, "t": [0] * 4097})
    c["name_too_long"] = frame(run(desc("n" * 5000, "uint8", [1], 0, 1)), b"\0")
    c["tensors_on_hello"] = frame({"op": "hello", "id": 0, "v": 1, "features": [], "worker": {},
                                   "package_hash": "", "auth": "", "t": []})
    c["id_2e63"] = frame({"op": "ping", "id": 1 << 63})
    # --- streams that end inside a frame.
    whole = frame(run(desc("x", "float32", [4], 0, 16)), bytes(16))
    c["truncated_prefix"] = whole[:10]
    c["truncated_header"] = whole[:30]
    c["truncated_payload"] = whole[:-1]
    return c


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    corpus = build()
    for old in os.listdir(here):
        if old.endswith(".bin") and old[:-4] not in corpus:
            os.remove(os.path.join(here, old))
    for name, data in corpus.items():
        with open(os.path.join(here, name + ".bin"), "wb") as f:
            f.write(data)
    sys.stdout.write(f"wrote {len(corpus)} files to {here}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
