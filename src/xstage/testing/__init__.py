"""Helpers for xstage's own tests, benchmarks and docs; not part of the stage API.

``xstage.testing.thirdparty`` fetches real third-party ONNX graphs from pinned registry wheels.
"""

from __future__ import annotations

__all__: list[str] = []
