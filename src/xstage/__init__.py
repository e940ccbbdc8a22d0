"""xstage: run one model stage on a device the host engine cannot drive, and prove where it ran."""

from __future__ import annotations

from xstage._version import __version__
from xstage.errors import XstageError

__all__ = ["XstageError", "__version__"]
