"""Memory arithmetic, pure: pools, reservations, budgets and the fit verdict (``budget``), the
measured-peak verdict (``measured``), and the reservations one stage needs, computed from facts
(``footprint``).

The stateful ``Ledger`` that open stages share lives with them, in ``xstage.stage.ledger``.
"""

from __future__ import annotations

from xstage.ledger.budget import (
    EVIDENCE,
    HOST_POOL,
    LIFETIMES,
    MARGIN,
    Budget,
    Fit,
    Pool,
    Reservation,
    blind_spots,
    check_fit,
    format_bytes,
    make_budget,
    parse_pool_arg,
    parse_size,
    pools_from_devices,
)
from xstage.ledger.measured import (
    Measured,
    call_peak_warning,
    check_measured,
    record_block,
)

__all__ = [
    "Budget",
    "EVIDENCE",
    "Fit",
    "HOST_POOL",
    "LIFETIMES",
    "MARGIN",
    "Measured",
    "Pool",
    "Reservation",
    "blind_spots",
    "call_peak_warning",
    "check_fit",
    "check_measured",
    "format_bytes",
    "make_budget",
    "parse_pool_arg",
    "parse_size",
    "pools_from_devices",
    "record_block",
]
