"""A content-addressed store of compiled ONNX Runtime EP contexts."""

from qnnx_ctxcache._version import __version__

__all__ = ["__version__"]
