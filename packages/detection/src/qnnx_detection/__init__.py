"""Reach Qualcomm QNN through ONNX Runtime: EP registration, truthful device probing, versions."""

from qnnx_detection._version import __version__

__all__ = ["__version__"]
