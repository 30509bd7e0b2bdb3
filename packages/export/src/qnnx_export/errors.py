"""Errors raised by qnnx-export.

Every error derives from :class:`QnnxExportError` and also from the builtin that matches its
meaning, so callers can catch either ``qnnx_export.errors.QnnxExportError`` or, say, ``ValueError``.
"""

from __future__ import annotations

__all__ = ["ExportError", "InvalidOptionsError", "QnnxExportError", "SignatureError"]


class QnnxExportError(Exception):
    """Root of every error raised by qnnx-export."""


class InvalidOptionsError(QnnxExportError, ValueError):
    """An :class:`~qnnx_export.ExportOptions` value is invalid (the message names it and the accepted values)."""


class SignatureError(QnnxExportError, ValueError):
    """A :class:`~qnnx_export.GraphSignature` does not match the arguments or outputs it was given."""


class ExportError(QnnxExportError, RuntimeError):
    """The graph could not be exported to ONNX; the message names the node/op and the cause.

    Attributes:
        problems: Every problem found (several may be reported at once).
    """

    def __init__(self, message: str, problems: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


# Former names, kept for one minor release: importing them warns.
_RENAMED = {"OptionsError": "InvalidOptionsError"}


def __getattr__(name: str) -> type[Exception]:
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(
            f"{__name__}.{name} is deprecated and will be removed in the next minor release; use {new}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
