"""Checking a model: load it (without weights), read its facts, judge every node against the table, assemble the
report."""

from __future__ import annotations

import logging
from importlib import metadata

from qnnx_opcheck._model import ModelInput, load_model, read_facts
from qnnx_opcheck._report import OpCheckReport
from qnnx_opcheck._rules import _Checker
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

    Returns:
        The report. An unsupported node is a normal result; call
        :meth:`OpCheckReport.raise_for_unsupported` to turn it into an exception.

    Raises:
        qnnx_opcheck.errors.UnknownBackendError: ``backend`` is not htp, npu or gpu.
        qnnx_opcheck.errors.InvalidVersionError: ``onnxruntime_qnn`` is not a version string.
        qnnx_opcheck.errors.ModelLoadError: The input is not a readable, valid ONNX model.
    """
    backend = normalize_backend(backend)
    requested = onnxruntime_qnn if onnxruntime_qnn is not None else installed_onnxruntime_qnn()
    table, table_notes = load_table(backend, requested, soc_model)
    proto, source, load_notes = load_model(model)
    facts = read_facts(proto, load_notes, source)
    verdicts = tuple(_Checker(table, facts).verdicts())
    notes = list(table_notes) + list(facts.notes) + list(table.notes)
    for name, dims in facts.symbolic_inputs.items():
        if "dynamic_shape" in table.patterns:
            notes.append(
                f"graph input '{name}' has symbolic dims {list(dims)}: QNN needs static shapes; fix them with "
                f"SessionOptions.add_free_dimension_override_by_name or re-export with static shapes"
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


def condition_keys(model: ModelInput) -> dict[str, str]:
    """Node name -> measured-condition class (e.g. ``r4/nearest/floor/asymmetric/up`` for a Resize), for the
    nodes of ops whose behaviour on QNN HTP depends on attributes and shapes (used by the conformance tool)."""
    table, _ = load_table("htp", None, None)
    proto, source, load_notes = load_model(model)
    checker = _Checker(table, read_facts(proto, load_notes, source))
    keys = {}
    for i, node in enumerate(checker.f.nodes):
        key = checker._condition_key(node)
        if key is not None:
            keys[node.name or f"n{i}"] = key
    return keys
