"""The region transport, by its old name: ``shm`` re-exports its three modules so callers keep
``shm.Region``, ``shm.Doorbell``, ``shm.plan_layout`` and the layout's offsets.

    doorbell        wake-ups and each wait's spin-or-block choice (``waitpolicy`` decides)
      │
    region          the mapping: create, attach, hand over, typed reads and writes
      │
    region_layout   offsets, sizes, the slot table's plan and checks (docs/wire.md)

Nothing here reads the environment: each knob comes from a ``TransportTuning`` passed as
``tuning=`` (``Doorbell``, ``eventfd_pair``, ``Region.attach``) or ``max_bytes=``
(``plan_layout``, ``validate_layout``); None takes the defaults.

A test that replaces a module global (``_yield``, ``_read_load``, ``_getcpu``, ``time``)
replaces it in the module that reads it (``doorbell``, ``region``), not here.
"""

from .doorbell import (  # noqa: F401
    CROWD_BLOCKS,
    EVENTFD_BELL,
    HEADS_UP_MAX_SECONDS,
    HEADS_UP_SECONDS,
    HEADS_UP_SLACK_SECONDS,
    LOAD_SAMPLE_SECONDS,
    LONG_CALL_SECONDS,
    MAX_TRACE,
    NEAR_END_SECONDS,
    PREEMPTED_SECONDS,
    SPIN,
    SPIN_SECONDS,
    SPIN_YIELD_SECONDS,
    WORKER_SPIN_SECONDS,
    Doorbell,
    _allowed_cpus,
    _getcpu,
    _read_load,
    _yield,
    eventfd_pair,
    make_eventfd,
    read_load,
    socketpair,
    write_traces,
)
from .region import (  # noqa: F401
    HUGE_ADVICE_BYTES,
    Region,
    RegionSpaceError,
    sweep_stale_names,
)
from .region_layout import (  # noqa: F401
    CPU_AFTER_FLAG,
    CTL_OFF,
    CTL_STRIDE,
    DATA_ALIGN,
    DESC,
    DESC_OFF,
    FLAG_DEVICE_TENSORS,
    FLAG_RESET_STATE,
    FLAG_STATE_RESET,
    IN_PLACE_MIN_BYTES,
    MAGIC,
    MAX_GENERATION,
    MAX_REGION_BYTES,
    MAX_SETS,
    MAX_SLOTS,
    NUDGE_SECONDS,
    OFF_CLIENT_ASLEEP,
    OFF_COMING,
    OFF_REQ_GEN,
    OFF_REQ_SEQ,
    OFF_RESP_GEN,
    OFF_RESP_SEQ,
    OFF_STATUS,
    OFF_WORKER_ASLEEP,
    OFF_WORKER_NS,
    PAGE,
    STATUS_CANCELLED,
    STATUS_ERROR,
    STATUS_INLINE,
    STATUS_OK,
    STREAM_CHUNK_BYTES,
    STREAM_MIN_BYTES,
    U32,
    U64,
    VERSION,
    desc_offset,
    plan_layout,
    validate_layout,
)
from .wire import (  # noqa: F401  (callers reach these through shm too)
    CODE_DTYPES,
    DTYPE_CODES,
    DTYPES,
    MAX_DIM,
    MAX_RANK,
    ProtocolError,
    dtype_of_tag,
)


def __getattr__(name):
    """``ENV_PROBLEMS``: one line per malformed transport variable in this process's
    environment (``tuning.from_environ``), read when a client asks (a worker never does): the
    client refuses to start a worker while it is not empty."""
    if name == "ENV_PROBLEMS":
        from .tuning import from_environ

        return from_environ()[1]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


__all__ = [
    "CPU_AFTER_FLAG",
    "CROWD_BLOCKS",
    "CTL_OFF",
    "CTL_STRIDE",
    "DATA_ALIGN",
    "DESC",
    "DESC_OFF",
    "Doorbell",
    "EVENTFD_BELL",
    "FLAG_DEVICE_TENSORS",
    "FLAG_RESET_STATE",
    "FLAG_STATE_RESET",
    "HEADS_UP_MAX_SECONDS",
    "HEADS_UP_SECONDS",
    "HEADS_UP_SLACK_SECONDS",
    "HUGE_ADVICE_BYTES",
    "IN_PLACE_MIN_BYTES",
    "LOAD_SAMPLE_SECONDS",
    "LONG_CALL_SECONDS",
    "MAGIC",
    "MAX_GENERATION",
    "MAX_REGION_BYTES",
    "MAX_SETS",
    "MAX_SLOTS",
    "MAX_TRACE",
    "NEAR_END_SECONDS",
    "NUDGE_SECONDS",
    "OFF_CLIENT_ASLEEP",
    "OFF_COMING",
    "OFF_REQ_GEN",
    "OFF_REQ_SEQ",
    "OFF_RESP_GEN",
    "OFF_RESP_SEQ",
    "OFF_STATUS",
    "OFF_WORKER_ASLEEP",
    "OFF_WORKER_NS",
    "PAGE",
    "PREEMPTED_SECONDS",
    "Region",
    "RegionSpaceError",
    "SPIN",
    "SPIN_SECONDS",
    "SPIN_YIELD_SECONDS",
    "STATUS_CANCELLED",
    "STATUS_ERROR",
    "STATUS_INLINE",
    "STATUS_OK",
    "STREAM_CHUNK_BYTES",
    "STREAM_MIN_BYTES",
    "VERSION",
    "WORKER_SPIN_SECONDS",
    "desc_offset",
    "eventfd_pair",
    "make_eventfd",
    "plan_layout",
    "read_load",
    "socketpair",
    "sweep_stale_names",
    "validate_layout",
    "write_traces",
]
