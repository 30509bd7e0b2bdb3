"""ONNX -> ONNX rewrites that make exported graphs safe for the QNN execution provider.

Each pass is an ``onnx_ir`` in-place pass with a precondition (``requires``), the rewrite
(``call``, which reports whether it changed the graph) and a postcondition (``ensures``) that
checks the defect it targets is gone. Every rewrite is exact or within fp16 rounding: a pass never
trades accuracy for placement. Defects cite onnxruntime-qnn 2.7.0 (QNN SDK 2.51) on the x86 HTP
simulator with ``soc_model=60``, where they were reproduced.

Modules: ``_base`` (:class:`QnnPass` and the graph helpers), one module per pass family (``_fusions``,
``_layout``, ``_numerics``, ``_dtypes``) and ``_registry`` (the registry and :func:`run_passes`).
"""

from __future__ import annotations

from qnnx_export._pass_names import DEFAULT_PASSES
from qnnx_export._passes._base import QnnPass
from qnnx_export._passes._dtypes import Int64InputsToInt32
from qnnx_export._passes._fusions import (
    FuseErfGelu,
    FuseRMSNorm,
    FuseSoftplus,
    LogSigmoidToSoftplus,
    RMSNormWeightLast,
    SoftplusStable,
)
from qnnx_export._passes._layout import (
    DropEmptyConcatInputs,
    FoldHighRankTranspose,
    GatherNDToGather,
    GatherRuntimeIndicesAsRows,
    TileLayerNormBroadcast,
    UnsqueezeInt64ToReshape,
)
from qnnx_export._passes._numerics import (
    AvgPoolDropUnusedCountIncludePad,
    FoldScaleIntoGatherTable,
    LogSoftmaxUnitAxis,
    SafeSoftmaxWithoutInf,
)
from qnnx_export._passes._registry import PASS_REGISTRY, pass_table, run_passes

__all__ = [
    "DEFAULT_PASSES",
    "PASS_REGISTRY",
    "AvgPoolDropUnusedCountIncludePad",
    "DropEmptyConcatInputs",
    "FoldHighRankTranspose",
    "FoldScaleIntoGatherTable",
    "FuseErfGelu",
    "FuseRMSNorm",
    "FuseSoftplus",
    "GatherNDToGather",
    "GatherRuntimeIndicesAsRows",
    "Int64InputsToInt32",
    "LogSigmoidToSoftplus",
    "LogSoftmaxUnitAxis",
    "QnnPass",
    "RMSNormWeightLast",
    "SafeSoftmaxWithoutInf",
    "SoftplusStable",
    "TileLayerNormBroadcast",
    "UnsqueezeInt64ToReshape",
    "pass_table",
    "run_passes",
]
