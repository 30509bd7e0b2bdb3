"""Dynamo FX graph to frozen, QNN-safe ONNX."""

from qnnx_export import errors
from qnnx_export._analysis import (
    MUTATION_KINDS,
    GraphAnalysis,
    Problem,
    analyze,
    lift_mutations,
    written_arguments,
)
from qnnx_export._export import ExportedGraph, export
from qnnx_export._fast import supported_ops as fast_path_ops
from qnnx_export._fingerprint import fingerprint
from qnnx_export._options import EXPORTERS, ExportOptions
from qnnx_export._parts import Part, PartsPlan, extract_parts, plan_parts, stored_weight_bytes, weight_bytes
from qnnx_export._signature import GraphSignature, InputSpec, OutputSlot, RowWriteback
from qnnx_export._version import __version__

__all__ = [
    "EXPORTERS",
    "MUTATION_KINDS",
    "ExportOptions",
    "ExportedGraph",
    "GraphAnalysis",
    "GraphSignature",
    "InputSpec",
    "OutputSlot",
    "Part",
    "PartsPlan",
    "Problem",
    "RowWriteback",
    "__version__",
    "analyze",
    "errors",
    "export",
    "extract_parts",
    "fast_path_ops",
    "fingerprint",
    "lift_mutations",
    "plan_parts",
    "stored_weight_bytes",
    "weight_bytes",
    "written_arguments",
]
