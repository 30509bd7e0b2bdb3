"""Checking a model: load it (without weights), read its facts, judge every node against the table, assemble the
report."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib import metadata

import onnx

from qnnx_opcheck._control import fold_constant_ifs
from qnnx_opcheck._model import ModelInput, load_model, read_facts
from qnnx_opcheck._report import OpCheckReport
from qnnx_opcheck._rules import Checker
from qnnx_opcheck._shapes import apply_static_shapes, fix_flags
from qnnx_opcheck._tables import load_table, normalize_backend

__all__ = ["check_model", "condition_keys", "installed_onnxruntime_qnn"]

_log = logging.getLogger(__name__)


def installed_onnxruntime_qnn() -> str | None:
    """Return the installed onnxruntime-qnn version (read from package metadata, no import), or None."""
    try:
        return metadata.version("onnxruntime-qnn")
    except metadata.PackageNotFoundError:
        return None


def check_model(
    model: ModelInput,
    backend: str = "htp",
    *,
    onnxruntime_qnn: str | None = None,
    soc_model: int | None = None,
    free_dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    outputs_range_checked: bool = False,
) -> OpCheckReport:
    """Check, node by node, whether a QNN backend can run an ONNX model.

    The model is read without external data (weights are never needed). Local functions are inlined,
    dtypes and shapes come from ONNX shape inference, and nodes that onnxruntime folds away before
    partitioning (constant subgraphs, inference Dropout) are reported as supported.

    Args:
        model: An ``onnx.ModelProto``, serialized model bytes, or the path of a ``.onnx`` file.
        backend: ``"htp"`` (NPU; ``"npu"`` is an alias) or ``"gpu"``.
        onnxruntime_qnn: The onnxruntime-qnn release to check against. None: the installed release
            (from package metadata, without importing it), else the newest table.
        soc_model: The HTP SoC (e.g. 60 for Snapdragon X Elite). None: the table's default SoC.
        free_dims: Sizes of the model's named free dimensions (``{"batch": 1, "height": 320}``), as ONNX Runtime's
            free-dimension override by name fixes them. The graph is then checked with those sizes: shapes are
            inferred through it (constant shape computations included), so Reshape and Resize targets become static.
        input_shapes: Full shapes of graph inputs by name (``{"images": (1, 3, 320, 320)}``); the named dims they
            cover are fixed everywhere, as with ``free_dims``.

    Returns:
        The report. An unsupported node is a normal result; call
        :meth:`OpCheckReport.raise_for_unsupported` to turn it into an exception.

    Raises:
        qnnx_opcheck.errors.UnknownBackendError: ``backend`` is not htp, npu or gpu.
        qnnx_opcheck.errors.InvalidVersionError: ``onnxruntime_qnn`` is not a version string.
        qnnx_opcheck.errors.ModelLoadError: The input is not a readable, valid ONNX model.
        qnnx_opcheck.errors.InvalidShapeError: A ``free_dims`` name is not a dimension name of the graph inputs,
            an ``input_shapes`` name is not a graph input, or a size is not a positive integer, has the wrong rank
            or contradicts a fixed dimension.
        outputs_range_checked: The caller checks every float output of every run for values beyond float16's
            +-65504 and does not trust such a run (qnnx's backend does). An infinity or NaN then needs no refusal
            where it reaches an output: HTP writes them there as 65536 and 98304, which that check sees. A
            comparison with one is still refused (HTP's comparison is never true, and nothing downstream shows it).
    """
    backend = normalize_backend(backend)
    requested = onnxruntime_qnn if onnxruntime_qnn is not None else installed_onnxruntime_qnn()
    table, table_notes = load_table(backend, requested, soc_model)
    proto, source, load_notes = load_model(model)
    proto, prepared = _prepare(proto, proto is model, free_dims, input_shapes)
    facts = read_facts(proto, load_notes, source)
    verdicts = tuple(Checker(table, facts, outputs_range_checked=outputs_range_checked).verdicts())
    notes = list(table_notes) + prepared + list(facts.notes) + list(table.notes)
    for name, dims in facts.symbolic_inputs.items():
        if "dynamic_shape" in table.patterns:
            notes.append(
                f"graph input '{name}' has symbolic dims {list(dims)}: QNN needs static shapes; check with the sizes "
                f"you will run: {fix_flags({name: dims})} (check_model: free_dims=, input_shapes=)"
            )
    report = OpCheckReport(
        backend=backend,
        onnxruntime_qnn=table.onnxruntime_qnn,
        soc_model=table.soc_model,
        verdicts=verdicts,
        requested_onnxruntime_qnn=requested,
        table_source=table.source,
        notes=tuple(notes),
    )
    _log.debug("checked %s: %s", source, report.summary())
    return report


def _prepare(
    proto: onnx.ModelProto,
    callers: bool,
    free_dims: Mapping[str, int] | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[onnx.ModelProto, list[str]]:
    """The model with the requested sizes written in and its constant If nodes folded, and notes saying so.
    ``callers``: ``proto`` is the caller's object, so it is copied before anything changes."""
    has_if = any(n.op_type == "If" for n in proto.graph.node)
    if not (free_dims or input_shapes or has_if):
        return proto, []
    if callers:
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        proto = copy
    notes = apply_static_shapes(proto, free_dims, input_shapes)
    if has_if:
        notes += fold_constant_ifs(proto)
    return proto, notes


def condition_keys(model: ModelInput) -> dict[str, str]:
    """Node name -> measured-condition class (e.g. ``r4/nearest/floor/asymmetric/up`` for a Resize), for the
    nodes of ops whose behaviour on QNN HTP depends on attributes and shapes (used by the conformance tool)."""
    table, _ = load_table("htp", None, None)
    proto, source, load_notes = load_model(model)
    checker = Checker(table, read_facts(proto, load_notes, source))
    keys = {}
    for i, node in enumerate(checker.f.nodes):
        key = checker.conditions.condition_key(node)
        if key is not None:
            keys[node.name or f"n{i}"] = key
    return keys
