"""Per-backend QNN operator tables and a checker for ONNX models."""

from qnnx_opcheck import errors
from qnnx_opcheck._check import check_model, installed_onnxruntime_qnn
from qnnx_opcheck._live import LiveReport, live_check
from qnnx_opcheck._narrow import NarrowReport, narrow_failure
from qnnx_opcheck._report import NodeVerdict, OpCheckReport
from qnnx_opcheck._tables import BACKENDS, OpTable, available_tables, load_table
from qnnx_opcheck._version import __version__

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
