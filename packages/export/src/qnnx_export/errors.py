"""Errors raised by qnnx-export.

Every error derives from :class:`QnnxExportError` and also from the builtin that matches its
meaning, so callers can catch either ``qnnx_export.errors.QnnxExportError`` or, say, ``ValueError``.
"""

from __future__ import annotations

from qnnx_clikit import renamed_attributes

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
__getattr__ = renamed_attributes(__name__, {"OptionsError": "InvalidOptionsError"}, globals())
