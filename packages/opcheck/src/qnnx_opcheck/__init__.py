"""Per-backend QNN operator tables and a checker for ONNX models."""

from typing import TYPE_CHECKING

from qnnx_opcheck import errors
from qnnx_opcheck._check import check_model, installed_onnxruntime_qnn
from qnnx_opcheck._report import NodeVerdict, OpCheckReport
from qnnx_opcheck._tables import BACKENDS, OpTable, available_tables, load_table
from qnnx_opcheck._version import __version__

if TYPE_CHECKING:
    from qnnx_opcheck._live import LiveReport, live_check
    from qnnx_opcheck._narrow import NarrowReport, narrow_failure

# Imported on first access: a compile checks its model with check_model only, and building these modules' attrs
# classes took about 2 ms of every cold first call (the live check and the narrowing run only after a failure).
_LAZY = {
    "LiveReport": "qnnx_opcheck._live",
    "live_check": "qnnx_opcheck._live",
    "NarrowReport": "qnnx_opcheck._narrow",
    "narrow_failure": "qnnx_opcheck._narrow",
}

__all__ = [
    "BACKENDS",
    "LiveReport",
    "NarrowReport",
    "NodeVerdict",
    "OpCheckReport",
    "OpTable",
    "__version__",
    "available_tables",
    "check_model",
    "errors",
    "installed_onnxruntime_qnn",
    "live_check",
    "load_table",
    "narrow_failure",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
