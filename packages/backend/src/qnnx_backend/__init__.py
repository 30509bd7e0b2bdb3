"""torch.compile(backend="qnn"): PyTorch on Qualcomm NPUs and GPUs through ONNX Runtime's QNN execution provider.

``torch.compile(model, backend="qnn", options={...})`` works without importing this package: the backend is
registered through the ``torch_dynamo_backends`` entry point. The public API is exactly ``__all__``.
"""

from qnnx_backend import errors
from qnnx_backend._arrays import ArrayModel, load_arrays
from qnnx_backend._backend import is_available, qnn_backend
from qnnx_backend._calibrate import calibrate
from qnnx_backend._explain import DeviceExplanation, ExplainReport, GraphExplanation, NodeExplanation, explain
from qnnx_backend._options import BackendOptions
from qnnx_backend._report import (
    Attempt,
    CompileReport,
    ExportReport,
    QuantizationReport,
    clear_compile_reports,
    compile_reports,
)
from qnnx_backend._saved import LoadedModel, SaveReport, load, save
from qnnx_backend._version import __version__

__all__ = [
    "ArrayModel",
    "Attempt",
    "BackendOptions",
    "CompileReport",
    "DeviceExplanation",
    "ExplainReport",
    "ExportReport",
    "GraphExplanation",
    "LoadedModel",
    "NodeExplanation",
    "QuantizationReport",
    "SaveReport",
    "__version__",
    "calibrate",
    "clear_compile_reports",
    "compile_reports",
    "errors",
    "explain",
    "is_available",
    "load",
    "load_arrays",
    "qnn_backend",
    "save",
]
