"""What the verdict rules read about a node and its neighbours: dtypes, shapes, constants and their values,
attributes (with the schema's defaults), producers and consumers, and the table's patterns."""

from __future__ import annotations

import functools
from typing import Any

import onnx

from qnnx_opcheck._model import GraphFacts, NodeView
from qnnx_opcheck._tables import OpTable

__all__ = ["FLOATS", "QDQ_DOMAINS", "QDQ_OPS", "GraphView"]

FLOATS = ("float32", "float16", "bfloat16")
# QuantizeLinear/DequantizeLinear in either domain onnxruntime's quantizer writes: the QNN EP takes both alike.
QDQ_DOMAINS = ("", "com.microsoft")
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@functools.cache
def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except Exception:  # unknown op / domain: no defaults known
        return None


class GraphView:
    """One graph, checked against one table: what every collaborator of the checker reads the graph through."""

    def __init__(self, table: OpTable, facts: GraphFacts) -> None:
        self.t = table
        self.f = facts
        self.patterns = table.patterns
        # Node index -> the kind of its verdict, filled in as the checker decides the nodes in graph order, so that a
        # rule may ask where a node's producers run.
        self.kinds: dict[int, str] = {}

    def dtype(self, name: str) -> str | None:
        v = self.f.values.get(name) if name else None
        return v.dtype if v is not None else None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        v = self.f.values.get(name) if name else None
        return v.shape if v is not None else None

    def is_const(self, name: str) -> bool:
        return bool(name) and name in self.f.constants

    def is_static(self, name: str) -> bool:
        """A constant, or the DequantizeLinear of one (a quantized weight: QNN takes it as a static tensor)."""
        return self.is_const(name) or self.quantized_constant(name) is not None

    def quantized_constant(self, name: str) -> NodeView | None:
        """The DequantizeLinear (ONNX or com.microsoft) that produces ``name`` from a constant, else None."""
        producer = self.producer(name) if name else None
        if producer is None or producer.op_type != "DequantizeLinear" or producer.domain not in QDQ_DOMAINS:
            return None
        return producer if producer.input and self.is_const(producer.input[0]) else None

    def const_value(self, name: str) -> Any:
        return self.f.const_values.get(name) if name else None

    def attr(self, node: NodeView, name: str) -> Any:
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

    def pattern(self, pid: str) -> dict[str, Any] | None:
        return self.patterns.get(pid)

    def producer(self, name: str) -> NodeView | None:
        idx = self.f.producers.get(name)
        return self.f.nodes[idx] if idx is not None else None

    def consumer_nodes(self, name: str) -> list[NodeView]:
        return [self.f.nodes[i] for i in self.f.consumers.get(name, ())]

    def scalar(self, name: str) -> float | None:
        val = self.const_value(name)
        if val is None or getattr(val, "size", 0) != 1:
            return None
        try:
            return float(val.reshape(-1)[0])
        except (TypeError, ValueError):
            return None
