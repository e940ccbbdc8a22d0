"""The TCP handshake's proofs and the authenticated records (docs/wire.md, docs/security.md).

In one process over a socketpair: both directions, small frames (one record) and large ones
(head + 512 KiB payload records). Every attack on a record fails with a ``ProtocolError``
naming its check; the process-level attacker is ``tests/client/test_tcp_attacker.py``.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from taps import channel_pair, cut_records

from xstage_remote import wire

SECRET = "5e" * 16
#: float32 values of a frame of three full payload records and a short fourth (equal-sized
#: records can be swapped or replayed without moving the record boundaries).
LARGE = (3 * wire.CHUNK_BYTES + 4096) // 4


@pytest.fixture(autouse=True, params=[0, 3], ids=["mac-inline", "mac-threads"])
def mac_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every test on both ways of hashing a large frame's payload records: in the thread that
    sends or receives, and on threads that hash several records at once (the default on a
    machine of 4 CPUs or more); the bytes on the wire and every check are the same."""
    monkeypatch.setattr(wire.channel, "MAC_THREADS", request.param)
    return int(request.param)


def _pair(role_a: str = "client", role_b: str = "worker"):  # type: ignore[no-untyped-def]
    return channel_pair(SECRET, role_a, role_b)


def _wire_bytes(header, arrays=None) -> list[bytes]:
    """The bytes one frame becomes, as a client channel sends it (not delivered)."""
    tx, _, a, _ = _pair()
    a.mute = True
    tx.send(header, arrays)
    return [b"".join(a.sends)]


def test_both_directions_round_trip_small_and_large() -> None:
    client, worker, _, _ = _pair()
    small = {"x": np.arange(16, dtype=np.float32)}
    large = {"x": np.arange(300_000, dtype=np.float32), "y": np.ones(70_000, np.int64)}
    for arrays in (small, large, small):
        t = threading.Thread(target=client.send, args=({"op": "run", "id": 1}, arrays))
        t.start()
        frame = worker.recv()
        t.join(10)
        for name, value in arrays.items():
            np.testing.assert_array_equal(frame.arrays()[name], value)
        worker.send({"op": "pong", "id": 1})
        assert client.recv().op == "pong"
    large_bytes = 300_000 * 4 + 70_000 * 8
    records = 1 + (1 + -(-large_bytes // wire.CHUNK_BYTES)) + 1  # small, head + payload, small
    assert client.sent == worker.received == records


def _feed(data: bytes, role: str = "worker"):
    """A receiving channel of ``role`` whose peer wrote ``data`` and closed."""
    _, rx, a, _ = _pair("client", role)
    a.sock.sendall(data)
    a.sock.close()
    return rx


def test_a_flipped_bit_fails_as_mac() -> None:
    (data,) = _wire_bytes({"op": "run", "id": 1}, {"x": np.zeros(8, np.float32)})
    bad = bytearray(data)
    bad[-wire.TRAILER_BYTES - 1] ^= 1
    with pytest.raises(wire.ProtocolError, match=r"frame integrity check failed \(mac\)"):
        _feed(bytes(bad)).recv()


def test_a_forged_frame_fails_as_mac() -> None:
    forged = b"".join(wire.encode_frame({"op": "run", "id": 1}, {"x": np.zeros(8, np.float32)}))
    forged += wire.COUNTER.pack(0) + bytes(wire.TAG_BYTES)
    with pytest.raises(wire.ProtocolError, match=r"frame integrity check failed \(mac\)"):
        _feed(forged).recv()


def test_a_replayed_record_fails_as_replay() -> None:
    tx, rx, a, _ = _pair()
    tx.send({"op": "ping", "id": 1})
    assert rx.recv().op == "ping"
    tx.send({"op": "ping", "id": 2})
    assert rx.recv().id == 2
    a.sock.sendall(a.sends[-1])  # the authentic second record, again
    with pytest.raises(wire.ProtocolError, match=r"frame sequence check failed \(replay\)"):
        rx.recv()


def _records(data: bytes) -> list[bytes]:
    """One large frame's bytes cut into its records (head, then payload), with trailers."""
    return cut_records(data)


def test_a_large_frame_is_one_send_per_payload_record_and_one_for_the_last_trailer() -> None:
    """Each send carries what is ready: the head record (or the previous record's trailer)
    with the next record's bytes, so the reader hashes them while the sender does, and is
    woken once per record; the last trailer goes alone."""
    tx, _, a, _ = _pair()
    a.mute = True
    tx.send({"op": "run", "id": 1}, {"x": np.arange(LARGE, dtype=np.float32)})
    records = _records(b"".join(a.sends))
    t = wire.TRAILER_BYTES
    assert len(a.sends) == len(records)
    assert a.sends[0] == records[0] + records[1][:-t]
    for i in range(1, len(records) - 1):
        assert a.sends[i] == records[i][-t:] + records[i + 1][:-t]
    assert a.sends[-1] == records[-1][-t:]


def test_reordered_payload_records_fail_as_reorder() -> None:
    tx, rx, a, b = _pair()
    a.mute = True
    tx.send({"op": "run", "id": 1}, {"x": np.arange(LARGE, dtype=np.float32)})
    head, first, second, *rest = _records(b"".join(a.sends))

    def write() -> None:
        try:
            a.sock.sendall(head + second + first + b"".join(rest))
        except OSError:
            pass  # the reader stopped at the check and closed

    writer = threading.Thread(target=write)
    writer.start()
    with pytest.raises(wire.ProtocolError, match=r"frame sequence check failed \(reorder\)"):
        rx.recv()
    b.sock.close()
    writer.join(10)


def test_the_other_directions_key_does_not_verify() -> None:
    """A record the worker sent, reflected back to the worker, is not the client's."""
    _, worker, a, _ = _pair()
    worker.send({"op": "pong", "id": 1})
    reflected = a.sock.recv(65536)
    with pytest.raises(wire.ProtocolError, match=r"frame integrity check failed \(mac\)"):
        _feed(reflected, "worker").recv()


def test_proofs_are_bound_to_both_nonces_and_the_role() -> None:
    hello = {"op": "hello", "id": 0, "nonce": wire.new_nonce(), "worker": {"pid": 7}}
    nc = wire.new_nonce()
    t = wire.transcript(hello, nc)
    wire.check_proof(SECRET, "client", t, wire.proof(SECRET, "client", t))
    for other in (wire.transcript(hello, wire.new_nonce()),
                  wire.transcript(dict(hello, nonce=wire.new_nonce()), nc),
                  wire.transcript(dict(hello, worker={"pid": 8}), nc)):
        with pytest.raises(wire.ProtocolError, match=r"handshake check failed \(proof\)"):
            wire.check_proof(SECRET, "client", other, wire.proof(SECRET, "client", t))
    with pytest.raises(wire.ProtocolError, match=r"handshake check failed \(proof\)"):
        wire.check_proof(SECRET, "worker", t, wire.proof(SECRET, "client", t))
    with pytest.raises(wire.ProtocolError, match=r"handshake check failed \(proof\)"):
        wire.check_proof("another secret", "client", t, wire.proof(SECRET, "client", t))
    with pytest.raises(wire.ProtocolError, match="nonce is not 64 hex digits"):
        wire.transcript(dict(hello, nonce="00"), nc)


def test_the_prepared_mac_is_hmac_sha256() -> None:
    """The records' MAC, with its key's padded blocks hashed once, is HMAC-SHA256 exactly."""
    import hashlib
    import hmac
    import os

    for key in (os.urandom(32), b"", os.urandom(64), os.urandom(100)):
        mac = wire._Mac(key)
        for parts in ([b""], [b"abc", memoryview(b"defg")], [os.urandom(300_000)]):
            counter = wire.COUNTER.pack(7)
            want = hmac.new(key, counter + b"".join(bytes(p) for p in parts), hashlib.sha256).digest()
            assert mac.tag(counter, parts) == want


@pytest.mark.parametrize("attack, check", [("flip", "integrity check failed (mac)"),
                                           ("replay", "sequence check failed (replay)"),
                                           ("drop", "sequence check failed (reorder)")])
def test_a_payload_record_hashed_as_it_arrives_names_each_failure(attack: str, check: str) -> None:
    """The reader hashes payload records under the counter it expects before the trailer
    comes; a record that carries another counter is checked again under that one."""
    tx, rx, a, b = _pair()
    a.mute = True
    tx.send({"op": "run", "id": 1}, {"x": np.arange(LARGE, dtype=np.float32)})
    records = _records(b"".join(a.sends))
    if attack == "flip":
        bad = bytearray(records[2])
        bad[1000] ^= 0x10
        records[2] = bytes(bad)
    elif attack == "replay":
        records[2] = records[1]
    else:
        del records[1]

    def write() -> None:
        try:
            a.sock.sendall(b"".join(records))
        except OSError:
            pass  # the reader stopped at the check and closed

    writer = threading.Thread(target=write)
    writer.start()
    with pytest.raises(wire.ProtocolError, match=re.escape(check)):
        rx.recv()
    b.sock.close()
    writer.join(10)


def test_back_to_back_frames_of_every_size_class_arrive_whole() -> None:
    """Frames written back to back, read after: records straddle the channel's buffer (the
    unread bytes move to its front), small and large frames mix, and one frame's header is
    larger than the buffer itself (read beside it)."""
    tx, rx, _, _ = _pair()
    rng = np.random.default_rng(5)
    many = {f"t{i:04d}-" + "n" * 60: np.full(3, i, np.int32) for i in range(700)}
    frames = [{"x": rng.standard_normal(int(n)).astype(np.float32)}
              for n in rng.integers(0, 4000, size=60)]
    frames[7] = {"x": np.arange(100_000, dtype=np.float32)}  # head + payload records
    frames[30] = many                                          # a header over 64 KiB
    assert len(wire.encode_frame({"op": "run", "id": 0}, many)[1]) > len(rx._buf)

    def write() -> None:
        for i, arrays in enumerate(frames):
            tx.send({"op": "run", "id": i}, arrays)

    writer = threading.Thread(target=write)
    writer.start()
    for i, arrays in enumerate(frames):
        frame = rx.recv()
        assert frame.id == i
        got = frame.arrays()
        assert list(got) == list(arrays)
        for name, value in arrays.items():
            np.testing.assert_array_equal(got[name], value)
    writer.join(10)
    assert tx.sent == rx.received


def test_a_bad_payload_record_then_the_end_of_the_stream_fails_on_the_records_check() -> None:
    """A tampered payload record with its trailer, a few bytes of the next, then the peer
    closes: the reader names the bad record's check, not the closed stream."""
    tx, rx, a, b = _pair()
    a.mute = True
    tx.send({"op": "run", "id": 1}, {"x": np.arange(LARGE, dtype=np.float32)})
    records = _records(b"".join(a.sends))
    bad = bytearray(records[1])
    bad[10] ^= 0x01

    def write() -> None:
        try:
            a.sock.sendall(records[0] + bytes(bad) + records[2][:100])
            a.sock.close()
        except OSError:
            pass

    writer = threading.Thread(target=write)
    writer.start()
    with pytest.raises(wire.ProtocolError, match=r"frame integrity check failed \(mac\)"):
        rx.recv()
    b.sock.close()
    writer.join(10)
