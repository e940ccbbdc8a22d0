"""Making artifacts the device runtimes accept: the sanitizer and the exporters.

``sanitize_onnx`` is imported on first use (PEP 562), so a submodule that needs neither onnx nor
onnx-ir (``export --image-size``'s check, before torch) costs nothing to import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sanitize_onnx"]


def __getattr__(name: str) -> Any:
    if name == "sanitize_onnx":
        from xstage.export.sanitize import sanitize_onnx

        return sanitize_onnx
    raise AttributeError(f"module 'xstage.export' has no attribute {name!r}")
