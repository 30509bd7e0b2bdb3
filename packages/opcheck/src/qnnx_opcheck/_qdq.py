"""QDQ models: a node between DequantizeLinear and QuantizeLinear is judged by the cells measured for its quantized
form and its quantized weights, and the Q/DQ nodes of a unit QNN refuses go to the CPU EP with it."""

from __future__ import annotations

import math
from typing import Any

import attrs

from qnnx_opcheck._model import NodeView
from qnnx_opcheck._outcomes import Decision, cell_decision
from qnnx_opcheck._report import NodeVerdict
from qnnx_opcheck._view import QDQ_DOMAINS, QDQ_OPS, GraphView

__all__ = ["QdqRules"]


class QdqRules:
    """The QDQ rules of the checker, on one graph."""

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.t = view.t
        self.f = view.f

    def _weight_class(self, node: NodeView) -> str | None:
        """The quantized weights a QDQ node reads, as the probe names them: the element type of each constant
        DequantizeLinear input other than an int32 bias, ``/per_channel`` when its scale has more than one element
        (sorted, comma-joined); None when the node reads no quantized constant."""
        classes = set()
        for name in node.input:
            dq = self.view.quantized_constant(name)
            if dq is None:
                continue
            elem = self.view.dtype(dq.input[0])
            if elem is None or elem == "int32":
                continue
            scale = self.view.shape(dq.input[1]) if len(dq.input) > 1 else ()
            channels = math.prod(d for d in scale if isinstance(d, int)) if scale else 1
            classes.add(elem + ("/per_channel" if channels > 1 else ""))
        return ",".join(sorted(classes)) or None

    def decision(
        self, node: NodeView, variants: list[dict[str, Any]], qdq: str, entry: dict[str, Any]
    ) -> Decision | None:
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
            return cell_decision(node, v, qdq, cell, entry)
        specific = cells.get(f"{qdq}/w={weights}")
        if specific is not None:
            return cell_decision(node, v, f"{qdq}/w={weights}", specific, entry)
        probed = sorted({measured, *(k.split("/w=", 1)[1] for k in cells if k.startswith(f"{qdq}/w="))})
        return (
            "unverified",
            f"{node.op_type} on {qdq} with {weights} weights was not measured in the {where} (measured: "
            f"{', '.join(probed)} weights)",
            entry.get("evidence"),
            qdq,
        )

    def with_node_units(self, verdicts: list[NodeVerdict]) -> list[NodeVerdict]:
        """Q/DQ nodes share the fate of the QDQ op they wrap: the QNN EP takes a DequantizeLinear -> op ->
        QuantizeLinear group as one unit, so when it refuses the op, the DequantizeLinear nodes that feed only
        refused ops and the QuantizeLinear nodes after it go to the CPU EP too (onnxruntime-qnn 2.7.0, measured)."""
        refused = {
            i for i, v in enumerate(verdicts) if v.status == "unsupported" and self.f.nodes[i].op_type not in QDQ_OPS
        }
        if not refused:
            return verdicts
        out = list(verdicts)
        for i, node in enumerate(self.f.nodes):
            if out[i].status != "supported" or node.op_type not in QDQ_OPS or node.domain not in QDQ_DOMAINS:
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
            if users and all(out[u].status == "unsupported" and self.f.nodes[u].op_type in QDQ_OPS for u in users):
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
