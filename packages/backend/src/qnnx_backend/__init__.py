"""torch.compile(backend='qnn'): PyTorch on Qualcomm NPUs and GPUs through the QNN execution provider of ONNX Runtime."""

from qnnx_backend._version import __version__

__all__ = ["__version__"]
