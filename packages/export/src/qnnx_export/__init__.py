"""Dynamo FX graph to frozen, QNN-safe ONNX."""

from qnnx_export._version import __version__

__all__ = ["__version__"]
