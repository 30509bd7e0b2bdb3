"""ONNX -> ONNX rewrites that make exported graphs safe for the QNN execution provider.

Each pass is an ``onnx_ir`` in-place pass with a precondition (``requires``), the rewrite
(``call``, which reports whether it changed the graph) and a postcondition (``ensures``) that
checks the defect it targets is gone. Every rewrite is exact or within fp16 rounding: a pass never
trades accuracy for placement. Defects cite onnxruntime-qnn 2.7.0 (QNN SDK 2.51) on the x86 HTP
simulator with ``soc_model=60``, where they were reproduced.

A pass is declared once, in the module of its family: ``@register(order=N)`` on its class puts it in the registry
and in the default pipeline, which runs the passes by ascending ``order``. Nothing else lists it: the registry,
``DEFAULT_PASSES`` (read from the same declarations without importing them, for the options) and the class names
exported here are derived from the declarations.

Modules: ``_base`` (:class:`QnnPass` and :func:`register`), ``_graph`` (the graph helpers the passes share), one
module per pass family (``_fusions``, ``_layout``, ``_high_rank``, ``_gathers``, ``_matmuls``, ``_numerics``,
``_pooling``, ``_convolutions``, ``_transcendental``, ``_dtypes``) and ``_registry`` (the registry and
:func:`run_passes`).
"""

from __future__ import annotations

from qnnx_export._pass_names import DEFAULT_PASSES
from qnnx_export._passes._base import QnnPass, register
from qnnx_export._passes._registry import PASS_REGISTRY, pass_table, run_passes

# Every registered pass class by its class name (qnnx_export._passes.FuseErfGelu): the declarations are the list.
_CLASSES: dict[str, type[QnnPass]] = {cls.__name__: cls for cls in PASS_REGISTRY.values()}


def __getattr__(name: str) -> type[QnnPass]:
    if name in _CLASSES:
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_PASSES", "PASS_REGISTRY", "QnnPass", *_CLASSES, "pass_table", "register", "run_passes"]
