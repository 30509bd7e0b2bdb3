"""Exceptions raised by qnnx_detection. Catch :class:`QnnxDetectionError` to handle any of them.

"No QNN device here" is never an exception: :func:`qnnx_detection.probe` reports it. These errors are for
misuse (a bad device name or SoC), a missing installation, and a session that QNN refused to create.
"""

from __future__ import annotations

from qnnx_clikit import renamed_attributes

__all__ = [
    "InvalidDeviceError",
    "InvalidOptionsError",
    "InvalidSocModelError",
    "QnnNotInstalledError",
    "QnnRegistrationError",
    "QnnxDetectionError",
    "SessionCreationError",
]


class QnnxDetectionError(Exception):
    """Base class for every error this package raises."""


class QnnNotInstalledError(QnnxDetectionError, ImportError):
    """onnxruntime or onnxruntime-qnn cannot be imported. Fix: ``pip install onnxruntime-qnn``."""


class QnnRegistrationError(QnnxDetectionError, RuntimeError):
    """ONNX Runtime refused to load the QNN plugin EP library (e.g. an onnxruntime too old for the plugin)."""


class InvalidDeviceError(QnnxDetectionError, ValueError):
    """A device name is not one of the accepted names (``npu``, ``gpu``, and where allowed ``cpu``/``auto``)."""


class InvalidSocModelError(QnnxDetectionError, ValueError):
    """A SoC model is neither a non-negative integer nor a known chip name."""


class InvalidOptionsError(QnnxDetectionError, ValueError):
    """Provider options or session config entries are malformed or contradict each other (all problems listed)."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class SessionCreationError(QnnxDetectionError, RuntimeError):
    """QNN could not create an ONNX Runtime session on a device.

    Attributes:
        device: ``"npu"`` or ``"gpu"``.
        cause: Short human-readable cause, derived from the native QNN/ORT log when possible.
        native_log: Text the native libraries printed during the attempt (captured, ANSI colours removed).
    """

    def __init__(self, device: str, cause: str, native_log: str = "") -> None:
        self.device = device
        self.cause = cause
        self.native_log = native_log
        super().__init__(device, cause, native_log)

    def __str__(self) -> str:
        return f"could not create a QNN session on {self.device}: {self.cause}"


# Former names, kept for one minor release: importing them warns.
__getattr__ = renamed_attributes(__name__, {"InvalidOptionError": "InvalidOptionsError"}, globals())
