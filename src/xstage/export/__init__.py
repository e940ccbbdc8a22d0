"""Making artifacts the device runtimes accept: the sanitizer (and, to come, the exporters)."""

from xstage.export.sanitize import sanitize_onnx

__all__ = ["sanitize_onnx"]
