"""Errors raised by qnnx_opcheck.

Every error derives from :class:`QnnxOpcheckError` and from the builtin that matches the misuse, so
``except ValueError`` keeps working for callers that do not know this package.

An unsupported operator is a normal result (see :class:`qnnx_opcheck.OpCheckReport`); it becomes an
exception only when the caller asks for one with
:meth:`qnnx_opcheck.OpCheckReport.raise_for_unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from qnnx_clikit import renamed_attributes

if TYPE_CHECKING:
    from qnnx_opcheck._report import NodeVerdict

__all__ = [
    "InvalidShapeError",
    "InvalidVersionError",
    "ModelLoadError",
    "QnnxOpcheckError",
    "TableError",
    "UnknownBackendError",
    "UnsupportedOperatorsError",
]


class QnnxOpcheckError(Exception):
    """Root of every error raised by qnnx_opcheck."""


class UnknownBackendError(QnnxOpcheckError, ValueError):
    """The backend name is not one of the accepted names."""

    def __init__(self, backend: object, accepted: Sequence[str]) -> None:
        self.backend = backend
        self.accepted = tuple(accepted)
        super().__init__(
            f"unknown QNN backend {backend!r}; accepted: {', '.join(self.accepted)} "
            f"('npu' is an alias of 'htp'). Pass backend='htp' for the NPU or backend='gpu' for Adreno."
        )


class InvalidVersionError(QnnxOpcheckError, ValueError):
    """An onnxruntime-qnn version string could not be parsed."""

    def __init__(self, version: object, known: Sequence[str]) -> None:
        self.version = version
        self.known = tuple(known)
        super().__init__(
            f"cannot parse onnxruntime-qnn version {version!r}; expected 'MAJOR.MINOR[.PATCH]' such as "
            f"'2.7.0'. Tables exist for: {', '.join(self.known)}."
        )


class InvalidShapeError(QnnxOpcheckError, ValueError):
    """A requested input size (``free_dims`` / ``--dim``, ``input_shapes`` / ``--shape``) is malformed or contradicts
    the model's graph inputs. The message names the value, the accepted values and the fix."""


class ModelLoadError(QnnxOpcheckError, ValueError):
    """The input is not a readable, valid ONNX model."""

    def __init__(self, source: str, cause: str) -> None:
        self.source = source
        self.cause = cause
        super().__init__(
            f"cannot read ONNX model from {source}: {cause}. Pass an onnx.ModelProto, serialized model bytes, "
            f"or the path of a .onnx file."
        )


class TableError(QnnxOpcheckError, RuntimeError):
    """A packaged operator table is missing or malformed (a broken installation)."""


class UnsupportedOperatorsError(QnnxOpcheckError, ValueError):
    """One or more nodes cannot run on the chosen QNN backend. Lists all of them."""

    def __init__(self, verdicts: Sequence[NodeVerdict], backend: str, onnxruntime_qnn: str) -> None:
        self.verdicts = tuple(verdicts)
        self.backend = backend
        self.onnxruntime_qnn = onnxruntime_qnn
        lines = [
            f"{len(self.verdicts)} node(s) cannot run on QNN {backend} (onnxruntime-qnn {onnxruntime_qnn}):",
        ]
        for v in self.verdicts:
            op = v.op_type if not v.domain else f"{v.domain}::{v.op_type}"
            lines.append(f"  - {v.node_name or '<unnamed>'} ({op}): {v.reason}")
        lines.append(
            "Fix: rewrite or remove these nodes, let them fall back to the CPU (non-strict mode), "
            "or choose another backend; `qnnx-opcheck model.onnx` shows the full table."
        )
        super().__init__("\n".join(lines))


# Former names, kept for one minor release: importing them warns.
__getattr__ = renamed_attributes(__name__, {"OpcheckError": "QnnxOpcheckError"}, globals())
