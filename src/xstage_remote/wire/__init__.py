"""The xstage worker protocol (docs/wire.md), one implementation imported by both ends.

Three layers, each a module that reads only the public names of the ones below it::

    channel   authenticated records over one connection (handshake, MACs, counters)
      │         hooks it uses: frames.check_head / read_prefix, codec.Lane, codec.ExpectedFrame
    codec     binary run/result frames of one loaded signature (FastCodec)
      │         hook it offers frames: FastCodec.decode_head, FastCodec.head_bytes
    frames    headers and arrays to bytes on a stream and back (encode, recv, parse, send)
      │
    spec      limits, dtypes, ops, header checks, prefix and record sizes (data and checks)

This package re-exports the names both ends and the tests import (``wire.Channel``,
``wire.encode_frame``, …), so a caller imports ``xstage_remote.wire`` and not its modules.
"""

from . import channel as _channel
from . import codec as _codec
from . import frames as _frames
from .channel import (
    CHUNK_BYTES,
    MAC_NAME,
    MAC_THREADS,
    NONCE_BYTES,
    RECORD_BYTES_RANGE,
    Channel,
    auth_token,
    check_proof,
    check_record_bytes,
    default_mac_threads,
    mac_threads_of,
    new_nonce,
    proof,
    record_bytes_default,
    transcript,
)
from .codec import (
    FAST_HAS_STATE,
    FAST_HEAD,
    FAST_RESET_STATE,
    FAST_RESULT,
    FAST_RUN,
    FAST_STATE_RESET,
    FAST_TENSOR,
    FAST_TIMING,
    ExpectedFrame,
    FastCodec,
    Lane,
    encode_fast,
)
from .frames import (
    Frame,
    PeerClosed,
    byte_view,
    check_head,
    decode_tensors,
    encode_frame,
    encode_tensors,
    parse_frame,
    read_prefix,
    recv_frame,
    send_encoded,
    send_frame,
    send_parts,
    validate_head,
)
from .spec import (
    CODE_DTYPES,
    COUNTER,
    DTYPE_CODES,
    DTYPES,
    FAST_MAGIC,
    GEN_FIELD,
    MAGIC,
    MAX_DIM,
    MAX_GENERATION,
    MAX_HEADER_BYTES,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_RANK,
    MAX_TENSORS,
    OPS,
    PREFIX,
    PROFILE_TENSOR,
    SET0_PREFIX,
    SETK_PREFIX,
    SMALL_FRAME,
    TAG_BYTES,
    TRAILER_BYTES,
    ProtocolError,
    dtype_of_tag,
    tag_of_dtype,
    validate_header,
    validate_header_bytes,
    validate_prefix,
    validate_tensor_descs,
    with_generation,
)

# Private names tests and benchmarks reach (the caches they clear, the MAC they compare).
_Mac, _mac_pool = _channel._Mac, _channel._mac_pool
_FIXED_BYTES, _ID_TIMING, _U64_AT = _codec._FIXED_BYTES, _codec._ID_TIMING, _codec._U64_AT
_CHECKED_T, _SIGNATURES = _frames._CHECKED_T, _frames._SIGNATURES
_MAX_CACHED_T_BYTES = _frames._MAX_CACHED_T_BYTES

#: The names of the codec's hooks before they were public (``wire._Expect``, ``wire._Lane``).
_Expect = ExpectedFrame
_Lane = Lane
#: The JSON head check by its old private name (benchmarks).
_validate_head = validate_head

__all__ = [
    "CHUNK_BYTES",
    "CODE_DTYPES",
    "COUNTER",
    "Channel",
    "DTYPES",
    "DTYPE_CODES",
    "ExpectedFrame",
    "FAST_HAS_STATE",
    "FAST_HEAD",
    "FAST_MAGIC",
    "FAST_RESET_STATE",
    "FAST_RESULT",
    "FAST_RUN",
    "FAST_STATE_RESET",
    "FAST_TENSOR",
    "FAST_TIMING",
    "FastCodec",
    "Frame",
    "GEN_FIELD",
    "Lane",
    "MAC_NAME",
    "MAC_THREADS",
    "MAGIC",
    "MAX_DIM",
    "MAX_GENERATION",
    "MAX_HEADER_BYTES",
    "MAX_NAME_CHARS",
    "MAX_PAYLOAD_BYTES",
    "MAX_RANK",
    "MAX_TENSORS",
    "NONCE_BYTES",
    "OPS",
    "PREFIX",
    "PROFILE_TENSOR",
    "SET0_PREFIX",
    "SETK_PREFIX",
    "PeerClosed",
    "ProtocolError",
    "RECORD_BYTES_RANGE",
    "SMALL_FRAME",
    "TAG_BYTES",
    "TRAILER_BYTES",
    "auth_token",
    "byte_view",
    "check_head",
    "check_proof",
    "check_record_bytes",
    "decode_tensors",
    "default_mac_threads",
    "dtype_of_tag",
    "encode_fast",
    "encode_frame",
    "encode_tensors",
    "mac_threads_of",
    "new_nonce",
    "parse_frame",
    "proof",
    "read_prefix",
    "record_bytes_default",
    "recv_frame",
    "send_encoded",
    "send_frame",
    "send_parts",
    "tag_of_dtype",
    "transcript",
    "validate_head",
    "validate_header",
    "validate_header_bytes",
    "validate_prefix",
    "validate_tensor_descs",
    "with_generation",
]
