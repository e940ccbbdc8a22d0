"""The authenticated channel: frames as records with integrity over one connection, after a
handshake (docs/wire.md, docs/security.md). The top layer of ``xstage_remote.wire``: it sends
what ``frames`` encodes and checks a frame's head through ``frames.check_head``; a codec's
``Lane`` and ``ExpectedFrame`` are its zero-copy hooks (read by their public attributes; this
module imports no codec).

Its thread count for hashing large frames comes from ``TransportTuning.mac_threads`` (None:
this process's default, ``default_mac_threads``), never from the environment.
"""

import hashlib
import hmac
import json
import os

import numpy as np

from .frames import Frame, PeerClosed, check_head, encode_frame, read_prefix, send_parts, validate_head
from .spec import (
    COUNTER,
    FAST_MAGIC,
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    PREFIX,
    SMALL_FRAME,
    TRAILER_BYTES,
    ProtocolError,
)


def auth_token(secret, pid):
    """The hello's proof that the worker holds the secret the client wrote to its stdin."""
    return hmac.new(secret.encode("utf-8"), ("xstage-hello:%d" % pid).encode(), hashlib.sha256).hexdigest()

# ----------------------------------------------------------------- authenticated channel
#
# Across the OS boundary (TCP connect-back) the stream is authenticated (docs/security.md):
#
#   worker → client  hello    {..., nonce: Nw}            fresh 32 random bytes, hex
#   client → worker  auth     {nonce: Nc, proof: Pc}      Pc = HMAC(secret, "client" | T)
#   worker → client  auth_ok  {proof: Pw}                 Pw = HMAC(secret, "worker" | T)
#
# where T = SHA-256("xstage-handshake-v1" | digest(hello header) | Nw | Nc). Each side
# derives one key per direction from the secret and T, and every later frame travels as
# records: the bytes, then a trailer of an 8-byte record counter and HMAC-SHA256(key,
# counter | bytes). A frame of at most SMALL_FRAME bytes is one record; a larger one is
# prefix + header, then its payload in CHUNK_BYTES records, each checked as it arrives.

#: The MAC of every record, by name (docs/security.md, docs/performance.md#channel).
MAC_NAME = "HMAC-SHA256"
NONCE_BYTES = 32
_HANDSHAKE = b"xstage-handshake-v1\0"


def default_mac_threads():
    """Threads that hash one large frame's payload records at once (0: the caller's thread),
    where ``TransportTuning.mac_threads`` is None: half the CPUs this process may run on, at
    most 4, and none below 4 CPUs (the peer hashes the same records at the same time, and on a
    2-CPU machine a second hashing thread only takes the peer's CPU)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(4, cpus // 2) if cpus >= 4 else 0


#: The default of ``Channel.mac_threads`` in this process (its CPUs; no environment variable).
MAC_THREADS = default_mac_threads()


def mac_threads_of(tuning):
    """The hashing threads ``tuning`` asks for (None, or its ``mac_threads`` None: this
    process's default, ``MAC_THREADS``)."""
    threads = None if tuning is None else tuning.mac_threads
    return MAC_THREADS if threads is None else threads
#: Record sizes a worker may announce in its hello (``record_bytes``).
RECORD_BYTES_RANGE = (1 << 16, 1 << 22)


def record_bytes_default(threads):
    """Payload bytes per record of a large frame, for a worker hashing on ``threads`` threads.

    Small enough that the two ends' MACs overlap with the transfer, large enough that a
    record's fixed cost is noise. Each record costs the sender a system call that wakes the
    reader: on 2 vCPUs (no hashing threads) 512 KiB records took the sender 5-20 % less CPU
    per MiB than 256 KiB or 1 MiB ones; on the 16-core host, where records are hashed on
    threads, 1 MiB went 1.10 GB/s each way in 256 KiB records against 0.83 in 512 KiB ones
    (two records leave two of four threads idle) (``benchmarks/channel.py``,
    ``channel_timeline.py``, docs/performance.md#channel_timeline).
    """
    return 1 << 18 if threads else 1 << 19


#: This process's default record size (a worker announces its own, ``record_bytes_default`` of
#: its tuning's threads, in its hello; both ends use the worker's).
CHUNK_BYTES = record_bytes_default(MAC_THREADS)


def check_record_bytes(value):
    """The record size a hello announced, checked (a power of two in ``RECORD_BYTES_RANGE``)."""
    if type(value) is not int or value & (value - 1) \
            or not RECORD_BYTES_RANGE[0] <= value <= RECORD_BYTES_RANGE[1]:
        raise ProtocolError("handshake: record_bytes %r is not a power of two in [%d, %d]"
                            % ((value,) + RECORD_BYTES_RANGE))
    return value
_POOLS = {}


def _mac_pool(threads):
    """The process's pool of ``threads`` hashing threads (hashlib lets go of the GIL while it
    hashes a large buffer, so they run beside the thread that sends or receives)."""
    key = (threads, os.getpid())  # a forked child has none of its parent's threads
    pool = _POOLS.get(key)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = _POOLS.setdefault(key, ThreadPoolExecutor(threads, "xstage-mac"))
    return pool


def new_nonce():
    """A fresh handshake nonce (hex)."""
    return os.urandom(NONCE_BYTES).hex()


def _check_nonce(nonce, who):
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
        raise ProtocolError("handshake: the %s nonce is not %d hex digits" % (who, 2 * NONCE_BYTES))
    try:
        return bytes.fromhex(nonce)
    except ValueError:
        raise ProtocolError("handshake: the %s nonce is not hex" % who) from None


def transcript(hello_header, client_nonce):
    """What both proofs and both keys are bound to: this hello and both fresh nonces."""
    canon = json.dumps(hello_header, separators=(",", ":"), sort_keys=True, allow_nan=False)
    worker_nonce = _check_nonce(hello_header.get("nonce"), "worker's")
    return hashlib.sha256(_HANDSHAKE + hashlib.sha256(canon.encode("utf-8")).digest()
                          + worker_nonce + _check_nonce(client_nonce, "client's")).digest()


def _derive(secret, label, transcript_digest):
    return hmac.new(secret.encode("utf-8"), label + b"\0" + transcript_digest, "sha256").digest()


def proof(secret, role, transcript_digest):
    """The hex proof that ``role`` (``client`` or ``worker``) holds the secret, for this T."""
    return _derive(secret, b"xstage-proof-" + role.encode(), transcript_digest).hex()


def check_proof(secret, role, transcript_digest, got):
    """Constant-time check of a peer's proof; ProtocolError naming the check on a mismatch."""
    if not isinstance(got, str) or not hmac.compare_digest(
            got.encode("ascii", "replace"), proof(secret, role, transcript_digest).encode()):
        raise ProtocolError("handshake check failed (proof): the %s does not prove the session "
                            "secret for this connection's nonces" % role)


class _Mac:
    """HMAC-SHA256 (RFC 2104) under one key, with the key's two padded blocks hashed once.

    ``hmac.digest`` redoes that per call, and an ``hmac.HMAC`` copy wraps a Python object
    around it: the copies of two prepared SHA-256 states here cost about half (a record of a
    small frame pays this twice per round trip on each side). The tag equals
    ``hmac.digest(key, counter + bytes, "sha256")`` (tests/wire/test_wire_channel.py).
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, key):
        if len(key) > 64:  # never here: the keys are 32-byte HMAC outputs
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def begin(self, counter):
        """The inner hash of a record, fed its counter; ``update`` it with the bytes."""
        inner = self._inner.copy()
        inner.update(counter)
        return inner

    def finish(self, inner):
        """The tag of a record whose bytes ``inner`` has hashed."""
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def tag(self, counter, parts):
        inner = self.begin(counter)
        for part in parts:
            inner.update(part)
        return self.finish(inner)


_EMPTY = np.empty(0, dtype=np.uint8)


class Channel:
    """Frames with integrity over one connection, after the handshake.

    ``role`` is this end (``client`` or ``worker``). Every record carries a counter per
    direction; a record that does not verify fails as ``mac``, a verified record with a
    counter already seen as ``replay``, one from ahead as ``reorder``. After any of these
    the connection is unusable (docs/wire.md). Reads go through a buffer that a small frame
    is checked and parsed in place of (one ``recv`` for the whole record, usually); a large
    frame's payload is read straight into its array. No descriptors are ever passed on this
    stream.
    """

    def __init__(self, sock, secret, transcript_digest, role, tuning=None):
        c2w = _derive(secret, b"xstage-key-c2w", transcript_digest)
        w2c = _derive(secret, b"xstage-key-w2c", transcript_digest)
        self.sock = sock
        send_key, recv_key = (c2w, w2c) if role == "client" else (w2c, c2w)
        self._seal_mac = _Mac(send_key)
        self._check_mac = _Mac(recv_key)
        self.sent = 0
        self.received = 0
        #: Threads that hash a large frame's records at once (``tuning.mac_threads``, None:
        #: ``MAC_THREADS``; 0: this one).
        self.mac_threads = mac_threads_of(tuning)
        #: Payload bytes per record (both ends of a connection must agree: the worker's hello
        #: announces its own, and the client sets it).
        self.chunk_bytes = CHUNK_BYTES if tuning is None else record_bytes_default(self.mac_threads)
        #: Spins before blocking for the next frame (``sockspin.SocketSpin``; None: blocks).
        self.spin = None
        self._stall = None  # called before a receive would block (_recv_checked_behind)
        self._waker = None  # made by the first large frame received on hashing threads
        self._buf = bytearray(SMALL_FRAME + TRAILER_BYTES + 4096)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    # ------------------------------------------------------------------ sending
    def _seal(self, parts):
        counter = COUNTER.pack(self.sent)
        self.sent += 1
        return counter + self._seal_mac.tag(counter, parts)

    def send(self, header, arrays=None):
        """Encode one frame and send it as authenticated records."""
        self.send_parts(encode_frame(header, arrays))

    def send_parts(self, parts):
        """Send one frame already encoded by ``encode_frame`` as authenticated records.

        A small frame is one record and one ``send``; a large one is its head record, then
        payload records of ``CHUNK_BYTES``, each sent before it is sealed: the reader hashes a
        record's bytes as they arrive, under the counter it expects, while this end computes
        the same tag (on two CPUs, the two MACs overlap instead of following each other); the
        trailer follows, in one ``sendmsg`` with the next record's bytes (one system call and
        one wake-up of the reader per record, docs/performance.md#channel_timeline).
        """
        _, hlen, plen = PREFIX.unpack_from(parts[0])  # what the encoder wrote: the sizes
        if PREFIX.size + hlen + plen <= SMALL_FRAME:  # one record, one send
            data = b"".join(parts)
            counter = COUNTER.pack(self.sent)
            self.sent += 1
            self.sock.sendall(b"".join((data, counter, self._seal_mac.tag(counter, (data,)))))
            return
        head = parts[:2]
        body = [memoryview(p).cast("B") for p in parts[2:]]
        head = head + [self._seal(head)]
        records = []
        chunk = []
        room = self.chunk_bytes
        for view in body:
            while len(view):
                take = view[:room]
                view = view[len(take):]
                chunk.append(take)
                room -= len(take)
                if room == 0:
                    records.append(chunk)
                    chunk, room = [], self.chunk_bytes
        if chunk:
            records.append(chunk)
        if self.mac_threads and len(records) > 1:
            self._send_sealed_ahead(head, records)
            return
        ahead = head
        for chunk in records:
            ahead = self._send_record(ahead, chunk)
        send_parts(self.sock, ahead)

    def send_sealed(self, lane):
        """Send a ``_Lane``'s frame as one record, sealed in place in its trailer room.

        The record ``send_parts`` makes of the same frame (its bytes, the counter, the tag of
        counter and bytes), with no joined copy: the counter and the tag are written into the
        lane's buffer after the frame, and the buffer goes out in one ``sendall``.
        """
        n = lane.n
        buf = lane.buf
        view = lane.view
        counter = view[n:n + COUNTER.size]
        COUNTER.pack_into(buf, n, self.sent)
        self.sent += 1
        mac = self._seal_mac
        inner = mac._inner.copy()
        inner.update(counter)
        inner.update(lane.frame)
        outer = mac._outer.copy()
        outer.update(inner.digest())
        buf[n + COUNTER.size:] = outer.digest()
        self.sock.sendall(buf)

    def _send_sealed_ahead(self, ahead, records):
        """Payload records whose tags are computed on ``mac_threads`` threads at once while
        this thread sends: each record's bytes go out at once, its trailer when its tag is
        ready, with the next record's bytes (the bytes on the wire are those of
        ``_send_record``)."""
        pool = _mac_pool(self.mac_threads)
        first = self.sent
        self.sent += len(records)
        counters = [COUNTER.pack(first + i) for i in range(len(records))]
        tags = [pool.submit(self._seal_mac.tag, c, chunk) for c, chunk in zip(counters, records)]
        for counter, chunk, tag in zip(counters, records, tags):
            send_parts(self.sock, ahead + chunk)
            ahead = [counter + tag.result()]
        send_parts(self.sock, ahead)

    def _send_record(self, ahead, chunk):
        """A payload record's bytes, behind ``ahead`` (the head record, or the previous
        record's trailer) in the same system call; returns its trailer, which goes out with
        the next record's bytes or alone after the last. The bytes go before the MAC, so the
        reader hashes them while this end does (it checks nothing before the trailer has
        come), and each send wakes the reader once."""
        send_parts(self.sock, ahead + chunk)
        return [self._seal(chunk)]

    # ------------------------------------------------------------------ receiving
    def _recv_into(self, view, n):
        """One receive; with records hashed behind (``_stall`` set), first what is in is
        verified when nothing more is ready to read (this thread is about to block)."""
        if self._stall is not None:
            import select

            if not select.select([self.sock], [], [], 0)[0]:
                self._stall()
        return self.sock.recv_into(view, n)

    def _need(self, n, started=True):
        """Make the buffer hold ``n`` unread bytes (``n`` fits it); return where they start."""
        have = self._end - self._start
        if have >= n:
            return self._start
        if self._start + n > len(self._buf):  # move the unread bytes to the front
            self._buf[:have] = bytes(self._view[self._start:self._end])
            self._start, self._end = 0, have
        while self._end - self._start < n:
            k = self._recv_into(self._view[self._end:], 0)
            if k == 0:
                raise PeerClosed(started or self._end > self._start)
            self._end += k
        return self._start

    def _fill(self, target, inner=None):
        """Fill ``target`` (a memoryview) from the buffer, then the socket; ``inner`` (a hash)
        takes each piece as it lands, while it is in the cache and while the rest is on its
        way."""
        got = 0
        n = len(target)
        have = self._end - self._start
        if have:
            got = min(have, n)
            target[:got] = self._view[self._start:self._start + got]
            self._start += got
            if inner is not None:
                inner.update(target[:got])
        while got < n:
            if n - got >= len(self._buf) // 2:  # large: straight into the target
                k = self._recv_into(target[got:], n - got)
                if k == 0:
                    raise PeerClosed(True)
            else:
                s = self._need(n - got)
                k = n - got
                target[got:] = self._view[s:s + k]
                self._start = s + k
            if inner is not None:
                inner.update(target[got:got + k])
            got += k

    def _trailer(self):
        """The next record's trailer, consumed from the buffer (a copy)."""
        s = self._need(TRAILER_BYTES)
        self._start = s + TRAILER_BYTES
        return bytes(self._view[s:s + TRAILER_BYTES])

    def _verify(self, parts, trailer, what, tag=None):
        """Check a record's tag, then its counter; ProtocolError naming the failed check.

        ``tag``: the record's tag computed ahead under the expected counter (the payload's
        records are hashed as they arrive); any other counter in the trailer is hashed again
        under that counter, so each failure is named as if it had been checked afresh.
        """
        counter = trailer[:COUNTER.size]
        if tag is None or counter != COUNTER.pack(self.received):
            tag = self._check_mac.tag(counter, parts)
        if not hmac.compare_digest(tag, trailer[COUNTER.size:]):
            raise ProtocolError("frame integrity check failed (mac): record %d (%s) does not "
                                "verify under this connection's key: tampered or injected"
                                % (self.received, what))
        (number,) = COUNTER.unpack(counter)
        if number < self.received:
            raise ProtocolError("frame sequence check failed (replay): record %d arrived again "
                                "where %d was expected" % (number, self.received))
        if number > self.received:
            raise ProtocolError("frame sequence check failed (reorder): record %d arrived where "
                                "%d was expected: records reordered or dropped"
                                % (number, self.received))
        self.received += 1

    def recv(self, max_payload=MAX_PAYLOAD_BYTES, codec=None, expect=None):
        """Read, authenticate, validate and return one Frame (nothing unverified is returned).

        ``codec`` as in ``recv_frame``: binary call frames are records like any frame.
        ``expect``: a ``_Expect`` of ``codec`` (``FastCodec.expect``). Where the next frame
        is the one it describes (its fixed bytes, the id it asks for), under the counter
        expected and with a tag that verifies, that frame is taken in fewer steps: ``expect``
        itself is returned, its ``fields`` and ``payload`` the frame's. Any other frame is
        read as without it (nothing is consumed before), so a failure is named as ever.
        """
        s = self._start
        if self._end - s < PREFIX.size:
            spin = self.spin
            if spin is not None and self._end == s:  # nothing of the next frame yet: spin
                self._start = self._end = s = 0
                k = spin.recv_into(self._view)
                if k is None:
                    s = self._need(PREFIX.size, started=False)
                    spin.blocked()
                elif k == 0:
                    raise PeerClosed(False)
                else:
                    self._end = k
                    if k < PREFIX.size:
                        s = self._need(PREFIX.size)
            elif self._end == s:  # nothing of the next frame yet: one receive, at the front
                self._start = self._end = s = 0  # (no records hashed behind here: no _stall)
                k = self.sock.recv_into(self._view, 0)
                if k == 0:
                    raise PeerClosed(False)
                self._end = k
                if k < PREFIX.size:
                    s = self._need(PREFIX.size)
            else:
                s = self._need(PREFIX.size, started=False)
        if expect is not None and codec is expect.codec and expect.plen <= max_payload:
            if self._recv_expected(s, expect):
                return expect
            s = self._start  # (the wait for its bytes may have moved them to the front)
        got = self._recv_small(s, max_payload, codec)
        if got is not None:
            return got
        s = self._start  # (_recv_small may have moved the unread bytes to the buffer's front)
        fast, hlen, plen = read_prefix(bytes(self._view[s:s + PREFIX.size]), max_payload, codec)
        end = PREFIX.size + hlen
        if end + plen <= SMALL_FRAME:  # one record: checked and parsed in the buffer
            s = self._need(end + plen + TRAILER_BYTES)
            record = self._view[s:s + end + plen]
            self._verify((record,), bytes(self._view[s + end + plen:s + end + plen + TRAILER_BYTES]),
                         "frame head")
            self._start = s + end + plen + TRAILER_BYTES
            header, tensors = check_head(fast, record[PREFIX.size:end], plen, codec)
            payload = np.frombuffer(bytearray(record[end:]), dtype=np.uint8) if plen else _EMPTY
            return Frame(header, payload, tensors, fast)
        if end + TRAILER_BYTES <= len(self._buf):
            s = self._need(end + TRAILER_BYTES)
            head = self._view[s:s + end]
            self._verify((head,), bytes(self._view[s + end:s + end + TRAILER_BYTES]), "frame head")
            self._start = s + end + TRAILER_BYTES
            raw = bytes(head[PREFIX.size:])
        else:  # a header larger than the buffer
            prefix = bytes(self._view[s:s + PREFIX.size])
            self._start = s + PREFIX.size
            rest = bytearray(hlen)
            self._fill(memoryview(rest))
            self._verify((prefix, rest), self._trailer(), "frame head")
            raw = rest
        header, tensors = check_head(fast, raw, plen, codec)
        payload = np.empty(plen, dtype=np.uint8)
        view = memoryview(payload)
        mac = self._check_mac
        if self.mac_threads and plen > self.chunk_bytes:
            self._recv_checked_behind(view, plen)
            return Frame(header, payload, tensors, fast)
        for start in range(0, plen, self.chunk_bytes):
            part = view[start:start + self.chunk_bytes]
            inner = mac.begin(COUNTER.pack(self.received))  # the counter this record must carry
            self._fill(part, inner)
            self._verify((part,), self._trailer(), "payload at byte %d" % start, mac.finish(inner))
        return Frame(header, payload, tensors, fast)

    def _recv_expected(self, s, expect):
        """``recv`` of the frame ``expect`` describes, at ``s`` (``self._start``): True when the
        next frame is that one (its fixed bytes, the id it asks for, the counter expected, a tag
        that verifies), then consumed, its ``fields`` and ``payload`` in ``expect``; False with
        nothing consumed (the long path reads the same bytes and names any failure).
        """
        # The signature's frame: its fixed bytes compared, the id (and timing) read in one
        # step, the counter and tag checked; no header dict, no Frame.
        buf = self._buf
        n = expect.n
        if self._end - s < n + TRAILER_BYTES and buf.startswith(expect.prefix, s):
            s = self._need(n + TRAILER_BYTES)  # as _recv_small would, for this prefix
        if self._end - s >= n + TRAILER_BYTES and buf.startswith(expect.fixed, s) \
                and buf[s + expect.descs_at:s + expect.payload_at] == expect.descs \
                and COUNTER.unpack_from(buf, s + n)[0] == self.received:
            fields = expect.unpack(buf, s + expect.fields_at)
            rid = expect.rid
            if (fields[0] == rid) if rid is not None else (fields[0] < 1 << 63):
                view = self._view
                mac = self._check_mac
                inner = mac._inner.copy()
                inner.update(view[s + n:s + n + COUNTER.size])
                inner.update(view[s:s + n])
                outer = mac._outer.copy()
                outer.update(inner.digest())
                if hmac.compare_digest(outer.digest(),
                                       view[s + n + COUNTER.size:s + n + TRAILER_BYTES]):
                    self.received += 1
                    self._start = s + n + TRAILER_BYTES
                    expect.fields = fields
                    expect.payload = bytearray(view[s + expect.payload_at:s + n])
                    return True
        return False

    def _recv_small(self, s, max_payload, codec):
        """The common case of ``recv`` in fewer steps: a well-formed one-record frame whose
        record verifies under the counter expected. Anything else returns None before any
        state changes, and ``recv``'s full path reads the same bytes (and names the failure)."""
        buf = self._buf
        magic, hlen, plen = PREFIX.unpack_from(buf, s)
        n = PREFIX.size + hlen + plen
        if n > SMALL_FRAME or plen > max_payload or hlen > MAX_HEADER_BYTES or (
                hlen < 2 if magic == MAGIC else magic != FAST_MAGIC or codec is None
                or hlen < codec.head_bytes):
            return None
        if self._end - s < n + TRAILER_BYTES:
            s = self._need(n + TRAILER_BYTES)
        counter = COUNTER.pack(self.received)
        if buf[s + n:s + n + COUNTER.size] != counter:
            return None
        view = self._view
        mac = self._check_mac  # _Mac.tag, written out (this runs for every small frame)
        inner = mac._inner.copy()
        inner.update(counter)
        inner.update(view[s:s + n])
        outer = mac._outer.copy()
        outer.update(inner.digest())
        if not hmac.compare_digest(outer.digest(),
                                   view[s + n + COUNTER.size:s + n + TRAILER_BYTES]):
            return None
        self.received += 1
        self._start = s + n + TRAILER_BYTES
        end = s + PREFIX.size + hlen
        if magic == FAST_MAGIC:
            header, tensors = codec.decode_head(view[s + PREFIX.size:end], plen)
        else:
            header, tensors = validate_head(view[s + PREFIX.size:end], plen)
        # The payload's own bytes (a bytearray: the arrays view it, writable, no numpy wrapper).
        payload = bytearray(view[end:s + n]) if plen else _EMPTY
        return Frame(header, payload, tensors, magic == FAST_MAGIC)

    def _recv_checked_behind(self, view, plen):
        """Payload records read by this thread while ``mac_threads`` threads hash the ones
        already in, each under the counter it must carry (a record's hash starts as soon as
        its bytes are in, before its trailer comes). Every record is verified in order
        (``_verify`` names a failure) before any byte of the frame is returned. Before this
        thread blocks for more bytes it verifies the records whose tags are ready, and while
        one in front is still being hashed it waits for whichever comes first, bytes or that
        tag (``_Waker``): a stream cut short after a bad record fails on that record's check,
        as in the caller's thread, instead of waiting for bytes that never come, and the
        reader never waits for a hash while bytes are there to read."""
        pool = _mac_pool(self.mac_threads)
        mac = self._check_mac
        if self._waker is None:
            self._waker = _Waker()
        waker = self._waker
        pending = []  # [part, tag future, byte offset, trailer or None], in record order
        self._stall = lambda: self._verify_ready(pending, waker)
        try:
            for start in range(0, plen, self.chunk_bytes):
                part = view[start:start + self.chunk_bytes]
                counter = COUNTER.pack(self.received + len(pending))
                self._fill(part)
                tag = pool.submit(mac.tag, counter, (part,))
                tag.add_done_callback(waker.ring)
                entry = [part, tag, start, None]
                pending.append(entry)
                entry[3] = self._trailer()
        except EOFError:
            self._stall = None
            self._verify_pending([e for e in pending if e[3] is not None])
            raise
        finally:
            self._stall = None
        self._verify_pending(pending)

    def _verify_ready(self, pending, waker):
        """Called when a receive would block: verify the records in front whose tags are
        ready; while the one in front has its trailer but not its tag, wait for the tag or
        for bytes, whichever comes first."""
        import select

        while pending and pending[0][3] is not None:
            part, tag, start, trailer = pending[0]
            if tag.done():
                self._verify((part,), trailer, "payload at byte %d" % start, tag.result())
                del pending[0]
                continue
            ready = select.select([self.sock, waker.sock], [], [])[0]
            waker.drain()
            if self.sock in ready:
                return

    def _verify_pending(self, pending):
        for part, tag, start, trailer in pending:
            self._verify((part,), trailer, "payload at byte %d" % start, tag.result())
        del pending[:]


class _Waker:
    """A socket pair a hashing thread rings when a tag is ready, so that a reader can wait
    for bytes or a tag in one ``select`` (a socket pair, not a pipe: Windows selects sockets
    only)."""

    __slots__ = ("sock", "_bell")

    def __init__(self):
        import socket

        self.sock, self._bell = socket.socketpair()
        self.sock.setblocking(False)
        self._bell.setblocking(False)

    def ring(self, _future=None):
        try:
            self._bell.send(b"\0")
        except OSError:  # full (never: drained at each wait) or closed with its channel
            pass

    def drain(self):
        try:
            while self.sock.recv(4096):
                pass
        except OSError:
            pass
