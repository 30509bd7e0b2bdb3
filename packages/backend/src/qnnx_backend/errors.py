"""Errors and warnings raised by the ``qnn`` torch.compile backend.

Every error subclasses :class:`QnnxBackendError` and the builtin that matches its meaning, so callers can catch
either. Messages name the bad value, what is accepted, and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "InvalidOptionsError",
    "QnnDeviceError",
    "QnnFallbackWarning",
    "QnnRuntimeError",
    "QnnxBackendError",
    "QuantizationError",
    "SavedGraphError",
    "SavedInputError",
    "UnsupportedGraphError",
]


class QnnxBackendError(Exception):
    """Root of every error raised by qnnx-backend."""


class InvalidOptionsError(QnnxBackendError, ValueError):
    """The ``options`` given to ``torch.compile(..., backend="qnn")`` are not valid."""


class QnnDeviceError(QnnxBackendError, RuntimeError):
    """A graph could not be compiled or run on the requested QNN device (raised under ``strict=True``).

    Attributes:
        device: the device that failed (``"npu"``, ``"gpu"``).
        cause: a short human sentence saying why.
    """

    def __init__(self, device: str, cause: str) -> None:
        self.device = device
        self.cause = cause
        super().__init__(f"qnn backend: the graph cannot run on device={device!r}: {cause}")


class UnsupportedGraphError(QnnxBackendError, RuntimeError):
    """The graph does something the QNN path cannot reproduce faithfully (raised under ``strict=True``).

    Attributes:
        problems: every reason found, not only the first.
    """

    def __init__(self, problems: Sequence[str], hint: str) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"qnn backend: this graph cannot be compiled faithfully:\n{lines}\n{hint}")


class QnnRuntimeError(QnnxBackendError, RuntimeError):
    """A compiled graph failed while running on QNN, and recovery was not possible or not allowed."""


class QuantizationError(QnnxBackendError, RuntimeError):
    """A graph compiled with ``quantize`` cannot run quantized: it was never calibrated, onnxruntime's
    quantization failed, or its accuracy is below ``min_sqnr`` (raised under ``strict=True``; otherwise the
    graph runs in float on QNN with a :class:`QnnFallbackWarning`)."""


class SavedGraphError(QnnxBackendError, ValueError):
    """A compiled function cannot be saved (a graph runs in PyTorch, its weights are gone), or a saved one cannot be
    read (not a qnnx file, damaged, truncated, or written by a newer qnnx-backend)."""


class SavedInputError(QnnxBackendError, ValueError):
    """A model loaded with :func:`qnnx_backend.load` was called with inputs other than those it was saved for (their
    structure, a tensor's dtype or shape, a constant's value); every mismatch is named."""


class QnnFallbackWarning(UserWarning):
    """A graph runs somewhere other than where the user asked (e.g. eager PyTorch instead of QNN)."""
