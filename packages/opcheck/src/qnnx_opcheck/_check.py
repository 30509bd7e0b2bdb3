"""The checker: one verdict per node from the table entry, the node's dtypes/ranks/attributes and the
multi-node patterns the table lists."""

from __future__ import annotations

import functools
import logging
import math
from importlib import metadata
from typing import Any, cast

import attrs
import onnx

from qnnx_opcheck._model import GraphFacts, ModelInput, NodeView, load_model, read_facts
from qnnx_opcheck._report import NodeVerdict, OpCheckReport
from qnnx_opcheck._tables import OpTable, load_table, normalize_backend

__all__ = ["check_model", "installed_onnxruntime_qnn"]

_log = logging.getLogger(__name__)

# Table outcome -> report status. Everything that stops the node (or the whole session) is unsupported;
# a known-wrong numerical result is unsupported too: a silent wrong answer is worse than a fallback.
_KIND_STATUS = {
    "supported": "supported",
    "fused": "supported",
    "constant_folded": "supported",
    "removed": "supported",
    "caveat": "hazard",
    "unknown_dtype": "hazard",
    "unverified": "hazard",
    "rejected": "unsupported",
    "finalize_error": "unsupported",
    "session_error": "unsupported",
    "crash": "unsupported",
    "wrong_result": "unsupported",
    "run_error": "unsupported",
    "error": "unsupported",
    "unknown_op": "unsupported",
    "unlisted_dtype": "unsupported",
}
_KIND_TEXT = {
    "rejected": "the QNN EP declines it (it would fall back to the CPU EP)",
    "finalize_error": "the QNN EP takes it, then QNN graph finalize fails (CPU fallback does not rescue this)",
    "session_error": "session creation fails even with CPU fallback allowed",
    "crash": "it crashes the process (segfault inside the QNN EP)",
    "wrong_result": "QNN runs it but returns wrong values (silent)",
    "run_error": "the session builds but Run() fails",
    "error": "session creation fails",
    "unverified": "support is documented for float only; this dtype is unverified on this backend",
}
_FLOATS = ("float32", "float16", "bfloat16")
# QuantizeLinear/DequantizeLinear in either domain onnxruntime's quantizer writes: the QNN EP takes both alike.
_QDQ_DOMAINS = ("", "com.microsoft")
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# onnx.TensorProto element types of floats (FLOAT, DOUBLE, FLOAT16, BFLOAT16): a Cast to another type truncates.
_FLOAT_ELEM_TYPES = (1, 11, 10, 16)
# Ops whose output is finite (or bool) for an infinite input: an infinity stops there, as a -inf mask does in
# attention's Softmax.
_ABSORB_INFINITY = frozenset(
    {
        "Softmax",
        "Exp",
        "Sigmoid",
        "Tanh",
        "Relu",
        "Clip",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "IsInf",
        "IsNaN",
        "Not",
        "Shape",
        "Size",
        "Cast",
        "HardSigmoid",
        "Erf",
        "Softsign",
    }
)
# Ops whose results are >= 0 whatever they are given, and ops that keep "all inputs >= 0" (how many leading
# inputs are data: the rest are shapes, axes or indices).
_NON_NEGATIVE_OPS = frozenset(
    {
        "Abs",
        "Exp",
        "Relu",
        "Sigmoid",
        "Softplus",
        "Softmax",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "Sqrt",
        "HardSigmoid",
        "Shape",
        "Size",
    }
)
_KEEPS_NON_NEGATIVE = {
    "Add": 2,
    "Mul": 2,
    "Div": 2,
    "ReduceSum": 1,
    "ReduceMean": 1,
    "ReduceMax": 1,
    "ReduceMin": 1,
    "Min": 8,
    "Reshape": 1,
    "Transpose": 1,
    "Squeeze": 1,
    "Unsqueeze": 1,
    "Expand": 1,
    "Slice": 1,
    "Concat": 8,
    "Identity": 1,
    "Cast": 1,
    "Pad": 1,
    "Gather": 1,
    "AveragePool": 1,
    "MaxPool": 1,
    "Tile": 1,
    "Flatten": 1,
}
_COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Max", "Min", "Clip"})


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


@functools.cache
def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except Exception:  # unknown op / domain: no defaults known
        return None


class _Checker:
    def __init__(self, table: OpTable, facts: GraphFacts) -> None:
        self.t = table
        self.f = facts
        self.patterns = table.patterns

    # Facts about one node ------------------------------------------------------------------------
    def _dtype(self, name: str) -> str | None:
        v = self.f.values.get(name) if name else None
        return v.dtype if v is not None else None

    def _shape(self, name: str) -> tuple[int | str | None, ...] | None:
        v = self.f.values.get(name) if name else None
        return v.shape if v is not None else None

    def _is_const(self, name: str) -> bool:
        return bool(name) and name in self.f.constants

    def _is_static(self, name: str) -> bool:
        """A constant, or the DequantizeLinear of one (a quantized weight: QNN takes it as a static tensor)."""
        return self._is_const(name) or self._quantized_constant(name) is not None

    def _quantized_constant(self, name: str) -> NodeView | None:
        """The DequantizeLinear (ONNX or com.microsoft) that produces ``name`` from a constant, else None."""
        producer = self._producer(name) if name else None
        if producer is None or producer.op_type != "DequantizeLinear" or producer.domain not in _QDQ_DOMAINS:
            return None
        return producer if producer.input and self._is_const(producer.input[0]) else None

    def _weight_class(self, node: NodeView) -> str | None:
        """The quantized weights a QDQ node reads, as the probe names them: the element type of each constant
        DequantizeLinear input other than an int32 bias, ``/per_channel`` when its scale has more than one element
        (sorted, comma-joined); None when the node reads no quantized constant."""
        classes = set()
        for name in node.input:
            dq = self._quantized_constant(name)
            if dq is None:
                continue
            elem = self._dtype(dq.input[0])
            if elem is None or elem == "int32":
                continue
            scale = self._shape(dq.input[1]) if len(dq.input) > 1 else ()
            channels = math.prod(d for d in scale if isinstance(d, int)) if scale else 1
            classes.add(elem + ("/per_channel" if channels > 1 else ""))
        return ",".join(sorted(classes)) or None

    def _const_value(self, name: str) -> Any:
        return self.f.const_values.get(name) if name else None

    def _attr(self, node: NodeView, name: str) -> Any:
        for a in node.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        schema = _schema(node.op_type, node.domain, self.f.opsets.get(node.domain, 1))
        if schema is not None and name in schema.attributes:
            default = schema.attributes[name].default_value
            if default.name or default.type:
                value = onnx.helper.get_attribute_value(default)
                return value.decode() if isinstance(value, bytes) else value
        return None

    def _matches(self, when: dict[str, Any], node: NodeView) -> bool:
        for key, arg in when.items():
            if key == "rank" or key == "output_rank":
                shape = self._shape(node.input[0] if key == "rank" else node.output[0])
                if shape is None or not (arg[0] <= len(shape) <= arg[1]):
                    return False
            elif key == "attr":
                for name, allowed in arg.items():
                    if self._attr(node, name) not in allowed:
                        return False
            elif key == "const_inputs":
                if not all(i < len(node.input) and self._is_static(node.input[i]) for i in arg):
                    return False
            elif key == "dynamic_inputs":
                if not all(i < len(node.input) and node.input[i] and not self._is_static(node.input[i]) for i in arg):
                    return False
            elif key == "input_dtype":
                idx, allowed = arg
                if idx >= len(node.input) or self._dtype(node.input[idx]) not in allowed:
                    return False
            elif key == "const_input_not_all":
                idx, value = arg
                val = self._const_value(node.input[idx]) if idx < len(node.input) else None
                if val is None or bool((val == value).all()):
                    return False
            elif key == "opset":
                opset = self.f.opsets.get(node.domain)
                if opset is None or not (arg[0] <= opset <= arg[1]):
                    return False
            else:  # a condition this version does not know: do not apply the variant
                return False
        return True

    def _dtype_keys(self, node: NodeView, entry: dict[str, Any]) -> tuple[str | None, str | None]:
        where, _, idx_s = entry.get("type_from", "input:0").partition(":")
        idx = int(idx_s or 0)
        names = node.input if where == "input" else node.output
        name = names[idx] if idx < len(names) else ""
        dtype = self._dtype(name)
        qdq = None
        if dtype in _FLOATS and where == "input":
            producer = self.f.producers.get(name)
            if producer is not None and self.f.nodes[producer].op_type == "DequantizeLinear":
                qtype = self._dtype(self.f.nodes[producer].input[0])
                if qtype is not None:
                    qdq = f"qdq_{qtype}"
        return dtype, qdq

    # Verdicts ------------------------------------------------------------------------------------
    def verdicts(self) -> list[NodeVerdict]:
        out = []
        for i, node in enumerate(self.f.nodes):
            try:
                out.append(self._verdict(i, node))
            except Exception as exc:  # never let one odd node break the whole check
                _log.warning("could not check node %s (%s): %s", node.name, node.op_type, exc)
                out.append(
                    NodeVerdict(
                        node_name=node.name or f"n{i}",
                        op_type=node.op_type,
                        domain=node.domain,
                        status="hazard",
                        kind="unknown_dtype",
                        reason=f"opcheck could not evaluate this node ({type(exc).__name__}: {exc})",
                    )
                )
        return self._with_node_units(out)

    def _with_node_units(self, verdicts: list[NodeVerdict]) -> list[NodeVerdict]:
        """Q/DQ nodes share the fate of the QDQ op they wrap: the QNN EP takes a DequantizeLinear -> op ->
        QuantizeLinear group as one unit, so when it refuses the op, the DequantizeLinear nodes that feed only
        refused ops and the QuantizeLinear nodes after it go to the CPU EP too (onnxruntime-qnn 2.7.0, measured)."""
        refused = {
            i for i, v in enumerate(verdicts) if v.status == "unsupported" and self.f.nodes[i].op_type not in _QDQ_OPS
        }
        if not refused:
            return verdicts
        out = list(verdicts)
        for i, node in enumerate(self.f.nodes):
            if out[i].status != "supported" or node.op_type not in _QDQ_OPS or node.domain not in _QDQ_DOMAINS:
                continue
            if node.op_type == "DequantizeLinear":
                users = self.f.consumers.get(node.output[0], ()) if node.output else ()
                owner = users[0] if users and all(u in refused for u in users) else None
                source = self.f.producers.get(node.input[0]) if node.input else None
                if not users and source is not None and out[source].status == "unsupported":
                    # A lone DequantizeLinear at a graph output after a refused unit: QNN declines it.
                    owner = self.f.producers.get(self.f.nodes[source].input[0])
                    owner = owner if owner in refused else None
            else:
                owner = self.f.producers.get(node.input[0]) if node.input else None
                owner = owner if owner in refused else None
            if owner is not None:
                out[i] = self._in_refused_unit(out[i], out[owner], self.f.nodes[owner])
        # A lone QuantizeLinear of a graph input that feeds only refused units: QNN declines it too.
        for i, node in enumerate(self.f.nodes):
            if node.op_type != "QuantizeLinear" or out[i].status != "supported" or not node.input:
                continue
            if node.input[0] in self.f.producers or not node.output:
                continue
            users = self.f.consumers.get(node.output[0], ())
            if users and all(out[u].status == "unsupported" and self.f.nodes[u].op_type in _QDQ_OPS for u in users):
                dq_users = [c for u in users for c in self.f.consumers.get(self.f.nodes[u].output[0], ())]
                owner = next((c for c in dq_users if c in refused), None)
                if owner is not None:
                    out[i] = self._in_refused_unit(out[i], out[owner], self.f.nodes[owner])
        return out

    @staticmethod
    def _in_refused_unit(verdict: NodeVerdict, owner: NodeVerdict, op: NodeView) -> NodeVerdict:
        return attrs.evolve(
            verdict,
            status="unsupported",
            kind="rejected",
            reason=f"part of the QDQ node unit of {op.op_type} '{owner.node_name}', which QNN does not take: the unit "
            "falls back to the CPU EP as a whole",
            evidence=owner.evidence,
        )

    def _verdict(self, index: int, node: NodeView) -> NodeVerdict:
        name = node.name or f"n{index}"
        domain = node.domain
        kind, reason, evidence, dtype = self._decide(index, node, domain)
        return NodeVerdict(
            node_name=name,
            op_type=node.op_type,
            domain=domain,
            status=_KIND_STATUS.get(kind, "unsupported"),  # type: ignore[arg-type]
            reason=reason,
            evidence=evidence,
            dtype=dtype,
            kind=kind,
        )

    def _pattern(self, pid: str) -> dict[str, Any] | None:
        return self.patterns.get(pid)

    def _decide(self, index: int, node: NodeView, domain: str) -> tuple[str, str | None, str | None, str | None]:
        p = self._pattern("constant_folded")
        # Constant nodes become initializers when onnxruntime loads the graph, wherever their output goes.
        if (
            p is not None
            and domain == ""
            and (node.op_type == "Constant" or (node.output and all(o in self.f.constants for o in node.output if o)))
        ):
            return "constant_folded", p["reason"], p.get("evidence"), None
        p = self._pattern("dropout_removed")
        if p is not None and node.op_type == "Dropout" and domain == "":
            mask = node.output[1] if len(node.output) > 1 else ""
            if not mask or (mask not in self.f.consumers and mask not in self.f.graph_outputs):
                return "removed", p["reason"], p.get("evidence"), None

        p = self._pattern("qdq_constant_dequantize")
        if (
            p is not None
            and node.op_type == "DequantizeLinear"
            and domain in _QDQ_DOMAINS
            and self._is_const(node.input[0])
        ):
            return "fused", p["reason"], p.get("evidence"), self._dtype(node.input[0])

        kind, reason, evidence, dtype = self._op_decision(node, domain)

        if node.op_type == "Erf" and kind != "supported":
            p = self._pattern("erf_gelu_fusion")
            if p is not None and self._is_erf_gelu(index, node):
                return "fused", p["reason"], p.get("evidence"), dtype
        if _KIND_STATUS.get(kind) == "unsupported":
            return kind, reason, evidence, dtype
        p = self._pattern("dynamic_shape")
        if p is not None and self.f.symbolic_inputs:
            dyn = self._dynamic_value(node)
            if dyn is not None:
                return p["kind"], f"{p['reason']} (value '{dyn[0]}' has shape {list(dyn[1])})", p.get("evidence"), dtype
        p = self._pattern("rank_limit")
        if p is not None:
            big = self._over_rank(node, int(p["max_rank"]))
            if big is not None:
                return p["kind"], f"{p['reason']} ('{big[0]}' has rank {big[1]})", p.get("evidence"), dtype
        p = self._pattern("empty_tensor")
        if p is not None and self._touches_empty(node):
            return p["kind"], p["reason"], p.get("evidence"), dtype
        measured = self._measured(node)
        if measured is not None:
            return measured[0], measured[1], measured[2], dtype
        for pid, matcher in (
            ("add_const_broadcast_layernorm", self._is_add_const_ln),
            ("rmsnorm_mul_weight", self._is_rmsnorm_mul),
            ("fp16_discontinuous", self._is_fp16_discontinuous),
            ("fp16_imprecise", self._is_float_op),
            ("pow_fractional_exponent", self._is_pow_fractional),
            ("averagepool_defects", self._is_avgpool_defect),
            ("nonfinite_constant", self._uses_nonfinite_constant),
            ("runtime_indices", self._has_runtime_indices),
            ("runtime_parameters", self._has_runtime_parameters),
            ("convtranspose_dilation", self._is_dilated),
        ):
            p = self._pattern(pid)
            if p is not None and node.op_type in p.get("ops", ()) and matcher(index, node):
                return p["kind"], p["reason"] + (f" Fix: {p['fix']}" if p.get("fix") else ""), p.get("evidence"), dtype
        if kind == "supported":
            p = self._pattern("int64_saturation")
            ops = p.get("ops", ()) if p is not None else ()
            if p is not None and dtype == "int64" and ("*" in ops or node.op_type in ops):
                return "caveat", p["reason"], p.get("evidence"), dtype
        return kind, reason, evidence, dtype

    def _op_decision(self, node: NodeView, domain: str) -> tuple[str, str | None, str | None, str | None]:
        entry = self.t.entry(domain, node.op_type)
        where = f"QNN {self.t.backend} table (onnxruntime-qnn {self.t.onnxruntime_qnn})"
        if entry is None:
            op = node.op_type if not domain else f"{domain}::{node.op_type}"
            why = (
                "it was not probed, so opcheck cannot vouch for it"
                if not domain
                else f"the QNN EP takes only the {domain} ops the table lists"
            )
            return "unknown_op", f"{op} is not in the {where}: {why}", None, None
        lo, hi = entry.get("opset", [1, None])
        opset = self.f.opsets.get(domain)
        if opset is not None and (opset < lo or (hi is not None and opset > hi)):
            return (
                "unknown_op",
                f"{node.op_type} at opset {opset} is outside the opsets the {where} covers ({lo}..{hi or 'latest'})",
                entry.get("evidence"),
                None,
            )
        dtype, qdq = self._dtype_keys(node, entry)
        variants = [v for v in entry["variants"] if self._matches(v.get("when", {}), node)]
        if not variants:
            return "unknown_op", f"no {where} entry matches this {node.op_type} node", entry.get("evidence"), dtype
        if dtype is None:
            return self._unknown_dtype(node, variants[0], entry)
        if qdq is not None:
            decided = self._qdq_decision(node, variants, qdq, entry)
            if decided is not None:
                return decided
        for v in variants:
            cell = v["dtypes"].get(dtype)
            if cell is not None:
                return self._from_cell(node, v, dtype, cell, entry)
        allowed = sorted(k for k, c in variants[0]["dtypes"].items() if c["status"] == "supported")
        return (
            "unlisted_dtype",
            f"{node.op_type} on {dtype} is not in the {where}; supported dtypes: {', '.join(allowed) or 'none'}",
            entry.get("evidence"),
            dtype,
        )

    def _qdq_decision(
        self, node: NodeView, variants: list[dict[str, Any]], qdq: str, entry: dict[str, Any]
    ) -> tuple[str, str | None, str | None, str | None] | None:
        """The verdict of a node in QDQ form (``qdq`` = ``qdq_<activation type>``) from the cells measured for
        that activation type and the node's quantized weights; None when no cell speaks of this form and the
        node's float dtype decides."""
        # Only the first matching variant speaks for the node: a specific condition (Conv3d, 5-D Unsqueeze...) was
        # probed apart because it behaves apart, so the plain variant's QDQ cells do not cover it.
        v = variants[0]
        cells = v["dtypes"]
        where = f"QNN {self.t.backend} table (onnxruntime-qnn {self.t.onnxruntime_qnn})"
        cell = cells.get(qdq)
        if cell is None:
            float_cell = cells.get("float32")
            if float_cell is None or float_cell["status"] != "supported":
                return None
            return (
                "unverified",
                f"{node.op_type} in QDQ form ({qdq}) was not probed in the {where}; it runs on QNN in float",
                entry.get("evidence"),
                qdq,
            )
        weights = self._weight_class(node)
        measured = cell.get("weights")
        if weights is None or measured is None or measured == weights:
            # The weights measured, or no quantized constant here, or none in the probed form (Add of two
            # activations: a constant operand is quantized as an activation): the activation type decides.
            return self._from_cell(node, v, qdq, cell, entry)
        specific = cells.get(f"{qdq}/w={weights}")
        if specific is not None:
            return self._from_cell(node, v, f"{qdq}/w={weights}", specific, entry)
        probed = sorted({measured, *(k.split("/w=", 1)[1] for k in cells if k.startswith(f"{qdq}/w="))})
        return (
            "unverified",
            f"{node.op_type} on {qdq} with {weights} weights was not measured in the {where} (measured: "
            f"{', '.join(probed)} weights)",
            entry.get("evidence"),
            qdq,
        )

    def _from_cell(
        self, node: NodeView, variant: dict[str, Any], key: str, cell: dict[str, Any], entry: dict[str, Any]
    ) -> tuple[str, str | None, str | None, str | None]:
        status = cell["status"]
        evidence = cell.get("evidence") or variant.get("evidence") or entry.get("evidence")
        if status == "supported":
            return "supported", cell.get("note"), evidence, key
        what = _KIND_TEXT.get(status, status)
        desc = variant.get("description")
        detail = cell.get("reason")
        text = f"{node.op_type} on {key}{f' ({desc})' if desc else ''}: {what}"
        if detail:
            text += f" [{detail}]"
        return status, text, evidence, key

    def _unknown_dtype(
        self, node: NodeView, variant: dict[str, Any], entry: dict[str, Any]
    ) -> tuple[str, str | None, str | None, str | None]:
        cells = {k: c["status"] for k, c in variant["dtypes"].items() if not k.startswith("qdq_")}
        ok = sorted(k for k, s in cells.items() if s == "supported")
        evidence = variant.get("evidence") or entry.get("evidence")
        if cells and len(ok) == len(cells):
            return "supported", None, evidence, None
        if not ok:
            return (
                "rejected",
                f"{node.op_type} is not supported by QNN {self.t.backend} for any dtype in the table "
                f"(input dtype unknown)",
                evidence,
                None,
            )
        return (
            "unknown_dtype",
            f"input dtype unknown (shape inference could not type it); QNN {self.t.backend} takes "
            f"{node.op_type} only for {', '.join(ok)}",
            evidence,
            None,
        )

    # Multi-node patterns -------------------------------------------------------------------------
    def _dynamic_value(self, node: NodeView) -> tuple[str, tuple[Any, ...]] | None:
        for name in list(node.input) + list(node.output):
            if not name or self._is_const(name):
                continue
            shape = self._shape(name)
            if shape is not None and any(not isinstance(d, int) for d in shape):
                return name, tuple(d if d is not None else "?" for d in shape)
        return None

    def _over_rank(self, node: NodeView, max_rank: int) -> tuple[str, int] | None:
        for name in list(node.input) + list(node.output):
            shape = self._shape(name) if name and not self._is_const(name) else None
            if shape is not None and len(shape) > max_rank:
                return name, len(shape)
        return None

    def _producer(self, name: str) -> NodeView | None:
        idx = self.f.producers.get(name)
        return self.f.nodes[idx] if idx is not None else None

    def _consumer_nodes(self, name: str) -> list[NodeView]:
        return [self.f.nodes[i] for i in self.f.consumers.get(name, ())]

    def _scalar(self, name: str) -> float | None:
        val = self._const_value(name)
        if val is None or getattr(val, "size", 0) != 1:
            return None
        try:
            return float(val.reshape(-1)[0])
        except (TypeError, ValueError):
            return None

    def _is_erf_gelu(self, index: int, node: NodeView) -> bool:
        """Erf inside x * 0.5 * (1 + erf(x / sqrt(2))): the QNN EP fuses it into one Gelu."""
        pre = self._producer(node.input[0])
        if pre is None or pre.op_type not in ("Div", "Mul") or len(pre.input) != 2:
            return False
        k = self._scalar(pre.input[1])
        want = math.sqrt(2.0) if pre.op_type == "Div" else 1 / math.sqrt(2.0)
        if k is None or abs(k - want) > 1e-3:
            return False
        x = pre.input[0]
        adds = self._consumer_nodes(node.output[0])
        if len(adds) != 1 or adds[0].op_type != "Add":
            return False
        add = adds[0]
        one = next((i for i in add.input if i != node.output[0]), "")
        if self._scalar(one) is None or abs((self._scalar(one) or 0.0) - 1.0) > 1e-6:
            return False
        muls = self._consumer_nodes(add.output[0])
        if len(muls) != 1 or muls[0].op_type != "Mul":
            return False
        mul = muls[0]
        other = next((i for i in mul.input if i != add.output[0]), "")
        # Either (x * 0.5) * (1 + erf) or x * (1 + erf) followed by * 0.5.
        if other == x:
            tail = self._consumer_nodes(mul.output[0])
            return (
                len(tail) == 1
                and tail[0].op_type == "Mul"
                and any(abs((self._scalar(i) or 0.0) - 0.5) < 1e-6 for i in tail[0].input)
            )
        half = self._producer(other)
        return (
            half is not None
            and half.op_type == "Mul"
            and x in half.input
            and any(abs((self._scalar(i) or 0.0) - 0.5) < 1e-6 for i in half.input)
        )

    def _is_add_const_ln(self, index: int, node: NodeView) -> bool:
        """Add/Mul(x[N>1,...], const[1,...]) feeding LayerNormalization (wrong rows >= 1 on HTP)."""
        if len(node.input) != 2:
            return False
        a, b = node.input
        if self._is_const(a) == self._is_const(b):
            return False
        const, x = (a, b) if self._is_const(a) else (b, a)
        cs, xs = self._shape(const), self._shape(x)
        if cs is None or xs is None or len(cs) < 2 or len(cs) != len(xs):
            return False
        if cs[0] != 1 or not isinstance(xs[0], int) or xs[0] <= 1:
            return False
        return any(
            c.op_type == "LayerNormalization" and c.input[0] == node.output[0]
            for c in self._consumer_nodes(node.output[0])
        )

    def _is_rmsnorm_mul(self, index: int, node: NodeView) -> bool:
        """Mul(weight_const, x * 1/sqrt(mean(x^2) + eps)) as written by Llama/T5-style RMSNorm."""
        p = self._pattern("rmsnorm_mul_weight") or {}
        orders = p.get("orders", ["const_first"])
        if len(node.input) != 2:
            return False
        a, b = node.input
        if self._is_const(a) and not self._is_const(b) and "const_first" in orders:
            inner = b
        elif self._is_const(b) and not self._is_const(a) and "const_second" in orders:
            inner = a
        else:
            return False
        mul = self._producer(inner)
        if mul is None or mul.op_type != "Mul":
            return False
        for name in mul.input:
            prod = self._producer(name)
            if prod is None:
                continue
            if prod.op_type == "Reciprocal":
                root = self._producer(prod.input[0])
                if root is not None and root.op_type == "Sqrt":
                    return True
            if prod.op_type == "Div" and self._scalar(prod.input[0]) == 1.0:
                root = self._producer(prod.input[1])
                if root is not None and root.op_type == "Sqrt":
                    return True
        return False

    # fp16 semantics and attribute-dependent defects ---------------------------------------------------------------
    def _is_float_op(self, index: int, node: NodeView) -> bool:
        """A float input (HTP computes every float op in fp16)."""
        return bool(node.input) and self._dtype(node.input[0]) in _FLOATS

    def _is_fp16_discontinuous(self, index: int, node: NodeView) -> bool:
        """Floor/Ceil/Round/Mod/TopK on float, and Cast float -> integer or bool: rounding the input to fp16 moves
        it across an integer or reorders near-equal values, so the result changes by a whole step."""
        if not self._is_float_op(index, node):
            return False
        if node.op_type == "Cast":
            to = self._attr(node, "to")
            return to is not None and to not in _FLOAT_ELEM_TYPES
        return True

    def _is_pow_fractional(self, index: int, node: NodeView) -> bool:
        """Pow on float whose exponent is a runtime value or a constant with a non-integer element, unless the base
        cannot be negative (a positive constant, or computed by ops whose results are >= 0: x^2, |x|, exp, a sum of
        squares... as L2 normalization and vector norms write it)."""
        if not self._is_float_op(index, node) or len(node.input) < 2:
            return False
        import numpy as np

        exponent = self._const_value(node.input[1])
        if exponent is not None:
            try:
                values = np.asarray(exponent, dtype=np.float64)
                if not bool((values != np.round(values)).any()):
                    return False
            except (TypeError, ValueError):
                pass
        return not self._non_negative(node.input[0])

    def _non_negative(self, name: str, depth: int = 0) -> bool:
        """Whether ``name`` is >= 0 by construction (NaN aside): a constant >= 0, or the output of an op that only
        gives non-negative values from what it is given."""
        import numpy as np

        if depth > 12 or not name:
            return False
        if self._is_const(name):
            value = self._const_value(name)
            return value is not None and getattr(value, "size", 0) > 0 and bool((np.asarray(value) >= 0).all())
        idx = self.f.producers.get(name)
        if idx is None:
            return False
        node = self.f.nodes[idx]
        op = node.op_type
        if op in _NON_NEGATIVE_OPS:
            return True
        if op == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
            return True  # x * x
        if op == "Pow" and len(node.input) == 2:
            exponent = self._const_value(node.input[1])
            if (
                exponent is not None
                and np.asarray(exponent).size == 1
                and float(np.asarray(exponent).reshape(-1)[0]) % 2 == 0
            ):
                return True  # an even power
        if op in _KEEPS_NON_NEGATIVE:
            data = [i for i in node.input[: _KEEPS_NON_NEGATIVE[op]] if i]
            return bool(data) and all(self._non_negative(i, depth + 1) for i in data)
        if op == "Clip" and len(node.input) > 1 and node.input[1]:
            return self._non_negative(node.input[1], depth + 1)  # a lower bound >= 0
        if op == "Max":
            return any(self._non_negative(i, depth + 1) for i in node.input if i)
        return False

    def _touches_empty(self, node: NodeView) -> bool:
        """Whether an input or output of the node has no elements (a static dimension of 0)."""
        for name in (*node.input, *node.output):
            shape = self._shape(name) if name else None
            if shape is not None and any(d == 0 for d in shape):
                return True
        return False

    def _has_runtime_indices(self, index: int, node: NodeView) -> bool:
        """GatherElements/ScatterElements whose indices are computed at run time (they may be negative, which
        QNN HTP gets wrong; constant indices are made non-negative at export or checked here)."""
        if len(node.input) < 2 or not node.input[1]:
            return False
        if not self._is_const(node.input[1]):
            return not self._non_negative(node.input[1])  # e.g. Max(index, 0), as qnnx writes index_copy
        value = self._const_value(node.input[1])
        return value is not None and bool((value < 0).any())

    def _has_runtime_parameters(self, index: int, node: NodeView) -> bool:
        """A shape-like parameter input (Slice starts/ends/axes/steps, Tile repeats, Expand shape) that is not a
        constant: QNN HTP refuses the node at session creation."""
        p = self._pattern("runtime_parameters") or {}
        positions = p.get("inputs", {}).get(node.op_type, [])
        return any(i < len(node.input) and node.input[i] and not self._is_const(node.input[i]) for i in positions)

    def _is_dilated(self, index: int, node: NodeView) -> bool:
        """ConvTranspose with a dilation above 1 (QNN HTP refuses it)."""
        return any(d != 1 for d in (self._attr(node, "dilations") or []))

    def _uses_nonfinite_constant(self, index: int, node: NodeView) -> bool:
        """A constant holding inf or NaN that is compared against, or that can reach a graph output unchanged:
        HTP has no infinities (-inf saturates near -65504), so the comparison is never true and the output is
        finite where PyTorch's is not. A -inf mask added before a Softmax is fine and is not matched."""
        nonfinite = [name for name in node.input if name and self._is_const(name) and self._const_nonfinite(name)]
        if not nonfinite:
            return False
        if node.op_type in _COMPARISONS:
            # Wrong only when an infinity can arrive on the other side at run time: a float graph input, or a
            # value computed from another inf/NaN constant. A mask built from integers with finfo.min (Hugging
            # Face's) never holds one, and the comparison is then false in PyTorch too.
            others = [name for name in node.input if name and name not in nonfinite]
            return any(self._may_hold_nonfinite(name) for name in others)
        return any(self._reaches_output_unabsorbed(o) for o in node.output if o)

    def _reaches_output_unabsorbed(self, name: str) -> bool:
        """Whether an infinity in ``name`` can reach a graph output, i.e. a path to an output that does not pass
        through an op turning -inf into a finite number (Softmax, Exp, Sigmoid, Relu...) or into a bool."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in self.f.graph_outputs:
                return True
            for idx in self.f.consumers.get(cur, ()):
                consumer = self.f.nodes[idx]
                if consumer.op_type in _ABSORB_INFINITY:
                    continue
                stack.extend(o for o in consumer.output if o)
        return False

    def _const_nonfinite(self, name: str) -> bool:
        import numpy as np

        value = self._const_value(name)
        kind = getattr(getattr(value, "dtype", None), "kind", None)
        return kind == "f" and not bool(np.isfinite(value).all())

    def _may_hold_nonfinite(self, name: str) -> bool:
        """Whether ``name`` can hold inf or NaN at run time: it is (or is computed from) a float graph input or a
        non-finite constant. Overflow inside the graph (exp of a large number) is not tracked."""
        memo = self.__dict__.setdefault("_nonfinite_memo", {})
        stack = [name]
        while stack:
            cur = stack[-1]
            if cur in memo:
                stack.pop()
                continue
            if self._is_const(cur):
                memo[cur] = self._const_nonfinite(cur)
                stack.pop()
                continue
            idx = self.f.producers.get(cur)
            if idx is None:  # a graph input
                memo[cur] = self._dtype(cur) in _FLOATS
                stack.pop()
                continue
            pending = [i for i in self.f.nodes[idx].input if i and i not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[cur] = any(memo[i] for i in self.f.nodes[idx].input if i)
            stack.pop()
        return bool(memo[name])

    def _is_avgpool_defect(self, index: int, node: NodeView) -> bool:
        """AveragePool conditions QNN HTP computes wrongly (measured by tools/opcheck/conformance.py): a partial
        last window under ceil_mode, count_include_pad with padding (or at rank 5), a pad of half the kernel or
        more; an unknown input shape counts as a defect, since the conditions cannot be ruled out."""
        shape = self._shape(node.input[0]) if node.input else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return True
        spatial = len(shape) - 2
        kernel = list(self._attr(node, "kernel_shape") or [])
        if len(kernel) != spatial or (self._attr(node, "auto_pad") or "NOTSET") != "NOTSET":
            return True
        strides = list(self._attr(node, "strides") or [1] * spatial)
        pads = list(self._attr(node, "pads") or [0] * (2 * spatial))
        dilations = list(self._attr(node, "dilations") or [1] * spatial)
        if any(d != 1 for d in dilations):
            return True
        ceil = bool(self._attr(node, "ceil_mode"))
        count_pad = bool(self._attr(node, "count_include_pad"))
        if count_pad and (any(pads) or spatial >= 3):
            return True
        for axis in range(spatial):
            before, after = pads[axis], pads[axis + spatial]
            if (before or after) and 2 * max(before, after) >= kernel[axis]:
                return True
            span = shape[axis + 2] + before + after - kernel[axis]
            if ceil and span % strides[axis]:
                return True  # ceil_mode adds a last window that hangs over the end
        return False

    def _condition_key(self, node: NodeView) -> str | None:
        """The measured-condition class of a node (see :func:`condition_key`), or None for ops without one."""
        if node.op_type == "Resize" and node.domain in ("", "ai.onnx"):
            return self._resize_key(node)
        return None

    def _resize_key(self, node: NodeView) -> str:
        shape = self._shape(node.input[0]) if node.input else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return "unknown_shape"
        mode = self._attr(node, "mode") or "nearest"
        parts = [f"r{len(shape)}", str(mode)]
        if mode == "nearest":
            parts.append(str(self._attr(node, "nearest_mode") or "round_prefer_floor"))
        parts.append(str(self._attr(node, "coordinate_transformation_mode") or "half_pixel"))
        scales_name = node.input[2] if len(node.input) > 2 else ""
        sizes_name = node.input[3] if len(node.input) > 3 else ""
        kinds: set[str] = set()
        if (sizes_name and not self._is_const(sizes_name)) or (
            not sizes_name and scales_name and not self._is_const(scales_name)
        ):
            kinds.add("runtime")
        elif sizes_name or scales_name:
            given = self._const_value(sizes_name or scales_name)
            values = [float(v) for v in given.reshape(-1)] if given is not None else []
            if len(values) != len(shape):
                kinds.add("unknown")
            # Every dim is an int (checked above); mypy does not narrow a tuple through all(isinstance(...)).
            for dim, value in zip(cast("tuple[int, ...]", shape), values, strict=False):
                out = int(value) if sizes_name else math.floor(dim * value + 1e-9)
                if out == dim:
                    continue
                if not sizes_name and abs(dim * value - out) > 1e-6:
                    kinds.add("inexact")
                elif out % dim == 0:
                    kinds.add("up")
                elif dim % out == 0:
                    kinds.add("down")
                else:
                    kinds.add("frac")
        parts.append("+".join(sorted(kinds)) or "same")
        for attr, default in (("antialias", 0), ("exclude_outside", 0), ("keep_aspect_ratio_policy", "stretch")):
            value = self._attr(node, attr)
            if value is not None and value != default:
                parts.append(f"{attr}={value}")
        if self._attr(node, "axes"):
            parts.append("axes")
        if mode == "cubic" and self._attr(node, "cubic_coeff_a") not in (None, -0.75):
            parts.append("cubic_coeff_a")
        return "/".join(parts)

    def _measured(self, node: NodeView) -> tuple[str, str, str | None] | None:
        """The kind, reason and evidence of a node whose condition class was measured as not right, or whose
        class was never measured; None when it was measured right (or the op has no measured classes)."""
        p = self._pattern("measured_conditions")
        classes = (p or {}).get("ops", {}).get(node.op_type)
        if not classes:
            return None
        key = self._condition_key(node)
        if key is None:
            return None
        outcome = classes.get(key)
        evidence = p.get("evidence") if p else None
        if outcome == "right":
            return None
        if outcome is None:
            return (
                "unknown_op",
                f"{node.op_type} with this configuration ({key}) was not measured on QNN HTP, so opcheck cannot "
                "vouch for it",
                evidence,
            )
        kind = {"wrong": "wrong_result", "refused": "rejected", "crash": "crash"}.get(outcome, "wrong_result")
        return kind, f"{node.op_type} configuration {key}: {_KIND_TEXT.get(kind, kind)}", evidence


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
