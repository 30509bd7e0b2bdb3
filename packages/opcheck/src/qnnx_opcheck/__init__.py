"""Per-backend QNN operator tables and a checker for ONNX models."""

from qnnx_opcheck._version import __version__

__all__ = ["__version__"]
