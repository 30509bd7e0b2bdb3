"""Split an ONNX model into sequential parts whose weights fit a budget (public through the package).

A QNN HTP context addresses a bounded amount of memory, so a model whose weights exceed it is compiled as several
contexts run one after another, each part's outputs fed to the next on the host. :func:`plan_parts` chooses where
to cut: as few parts as the budget allows, and among those the cuts that pass the fewest activation bytes between
parts. That puts cuts where the model's structure is thinnest (between decoder layers or residual blocks, where
one hidden state crosses) and never inside an attention block (where queries, keys, values and the residual are
all live at once). :func:`extract_parts` writes each part as its own model, whose initializers are the same
tensors (external-data references stay references: no weight is copied).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from qnnx_export.errors import ExportError

if TYPE_CHECKING:
    import onnx

__all__ = ["Part", "PartsPlan", "extract_parts", "plan_parts", "weight_bytes"]

# Bits per element of each ONNX tensor type (onnx.TensorProto's numbers; sub-byte types are packed).
_FLOAT = 1
_GRAPH_ATTRIBUTE = 5  # onnx.AttributeProto.GRAPH
_BITS: dict[int, int] = {
    1: 32,  # FLOAT
    10: 16,  # FLOAT16
    16: 16,  # BFLOAT16
    11: 64,  # DOUBLE
    7: 64,  # INT64
    13: 64,  # UINT64
    6: 32,  # INT32
    12: 32,  # UINT32
    5: 16,  # INT16
    4: 16,  # UINT16
    3: 8,  # INT8
    2: 8,  # UINT8
    9: 8,  # BOOL
    22: 4,  # INT4
    21: 4,  # UINT4
}


def _tensor_bytes(elem_type: int, dims: Sequence[int], float32_bytes: float) -> int:
    count = int(np.prod([int(d) for d in dims], dtype=np.int64)) if dims else 1
    if elem_type == _FLOAT:
        return int(count * float32_bytes)
    return (count * _BITS.get(elem_type, 32) + 7) // 8


def weight_bytes(model: onnx.ModelProto, *, float32_bytes: float = 4) -> int:
    """The bytes of ``model``'s initializers, from their types and shapes (external data is not read).

    ``float32_bytes`` is what the target holds per float32 weight: 2 where it computes in float16 (QNN HTP)."""
    return sum(_tensor_bytes(t.data_type, t.dims, float32_bytes) for t in model.graph.initializer)


@attrs.frozen
class Part:
    """One part: the nodes ``start:stop`` of the model's graph, in order.

    Attributes:
        start: Index of the part's first node in ``model.graph.node``.
        stop: One past its last node.
        weight_bytes: The bytes of the initializers its nodes use (a tensor used by two parts counts in both).
        inputs: What the part reads from outside itself: the model's inputs and the earlier parts' outputs.
        outputs: What it hands on: the model's outputs it computes and the values later parts read.
        first_node: The name (or op type, for an unnamed node) of its first node, for reports.
    """

    start: int
    stop: int
    weight_bytes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    first_node: str


@attrs.frozen
class PartsPlan:
    """Where a model is cut, and why.

    Attributes:
        parts: The parts, in the order they run; one part when the model fits the budget.
        max_bytes: The budget the plan was made for.
        total_weight_bytes: The model's weight bytes, each tensor counted once.
        crossing_bytes: The activation bytes passed between consecutive parts, one figure per cut.
    """

    parts: tuple[Part, ...]
    max_bytes: int
    total_weight_bytes: int
    crossing_bytes: tuple[int, ...]

    @property
    def over_budget(self) -> tuple[int, ...]:
        """Indices of the parts above the budget (a single node's weights can exceed it; no cut helps there)."""
        return tuple(i for i, p in enumerate(self.parts) if p.weight_bytes > self.max_bytes)

    def describe(self) -> str:
        """One line: the parts' sizes and where each begins."""
        if len(self.parts) == 1:
            return f"1 part ({_mib(self.parts[0].weight_bytes)} of weights, budget {_mib(self.max_bytes)})"
        sizes = ", ".join(f"{_mib(p.weight_bytes)} from {p.first_node}" for p in self.parts)
        return f"{len(self.parts)} parts under {_mib(self.max_bytes)} each: {sizes}"


def _mib(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _subgraph_uses(node: onnx.NodeProto) -> Iterator[str]:
    """Names a node's subgraphs read (over-approximated: names they define themselves are filtered later)."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == _GRAPH_ATTRIBUTE else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                yield from (name for name in inner.input if name)
                yield from _subgraph_uses(inner)


def _value_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...] | None]]:
    """Element type and static shape (None when not static) of every value the model declares."""
    out: dict[str, tuple[int, tuple[int, ...] | None]] = {}
    g = model.graph
    for vi in (*g.input, *g.value_info, *g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        static = dims if tt.HasField("shape") and all(d >= 0 for d in dims) else None
        out[vi.name] = (tt.elem_type, static)
    return out


class _Graph:
    """The facts the planner needs about a model, computed once (linear in its size)."""

    def __init__(self, model: onnx.ModelProto, float32_bytes: float) -> None:
        g = model.graph
        self.nodes = list(g.node)
        n = len(self.nodes)
        self.inits = {t.name: _tensor_bytes(t.data_type, t.dims, float32_bytes) for t in g.initializer}
        self.graph_inputs = [vi.name for vi in g.input if vi.name not in self.inits]
        self.graph_outputs = [vi.name for vi in g.output]
        producer: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    producer[name] = i
        self.producer = producer
        self.uses: list[tuple[str, ...]] = []  # per node: values of the main graph it reads (subgraphs included)
        self.node_inits: list[tuple[str, ...]] = []
        last_use: dict[str, int] = {}
        first_use: dict[str, int] = {}  # of the model's inputs: live from where they are first read
        for i, node in enumerate(self.nodes):
            names = dict.fromkeys([*(x for x in node.input if x), *_subgraph_uses(node)])
            known = tuple(x for x in names if x in producer or x in self.inits or x in self.graph_inputs)
            self.uses.append(known)
            self.node_inits.append(tuple(x for x in known if x in self.inits))
            for x in known:
                if x in producer or x not in self.inits:
                    last_use[x] = i
                    if x not in producer:
                        first_use.setdefault(x, i)
        for name in self.graph_outputs:
            if name in self.inits:
                raise ExportError(
                    f"the model's output {name!r} is an initializer, which no part computes; the model cannot be "
                    f"split (compile it whole, or output a node's value instead)"
                )
        self.last_use = last_use
        types = _value_types(model)
        # cut k falls before node k: a value crosses it when produced (a model input: first read) before k and
        # read at or after k.
        crossing = np.zeros(n + 2, dtype=np.int64)
        unknown = np.zeros(n + 2, dtype=np.int64)
        for name, p in [*producer.items(), *first_use.items()]:
            u = last_use.get(name)
            if u is None or u <= p:
                continue
            elem, shape = types.get(name, (0, None))
            if shape is None:
                unknown[p + 1] += 1
                unknown[u + 1] -= 1
            else:
                size = _tensor_bytes(elem, shape, 4)
                crossing[p + 1] += size
                crossing[u + 1] -= size
        self.crossing = np.cumsum(crossing)[: n + 1]
        # A cut is possible where every value crossing it has a known static type (a part's inputs need one).
        self.cuttable = np.cumsum(unknown)[: n + 1] == 0
        self.types = types

    def part(self, start: int, stop: int, later_reads: set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        inside: set[str] = set()
        for node in self.nodes[start:stop]:
            inside.update(x for x in node.output if x)
        reads: dict[str, None] = {}
        for i in range(start, stop):
            for x in self.uses[i]:
                if x not in inside and x not in self.inits:
                    reads[x] = None
        inputs = tuple(x for x in self.graph_inputs if x in reads) + tuple(
            x for x in reads if x not in self.graph_inputs
        )
        outputs = tuple(
            dict.fromkeys([*(x for x in self.graph_outputs if x in inside), *(x for x in inside if x in later_reads)])
        )
        return inputs, outputs


def plan_parts(model: onnx.ModelProto, max_bytes: int, *, float32_bytes: float = 4) -> PartsPlan:
    """Choose where to cut ``model`` so that each part's weights stay within ``max_bytes``.

    The plan has as few parts as the budget allows; among plans with that many, it passes the fewest activation
    bytes between parts, and it cuts only where every crossing value has a static type. A part can exceed the
    budget only when one stretch between two possible cuts does by itself (see :attr:`PartsPlan.over_budget`).

    Args:
        model: A model whose nodes are in topological order (as ONNX requires). Initializers with external data
            are measured from their types and shapes; their bytes are not read.
        max_bytes: The most weight bytes a part may hold.
        float32_bytes: What the target holds per float32 weight (2 on QNN HTP, which computes floats in float16).

    Raises:
        ValueError: ``max_bytes`` is not a positive integer.
        ExportError: The model cannot be split (an output that is an initializer).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(
            f"max_bytes={max_bytes!r} is not accepted: pass a positive number of bytes, e.g. 1 << 30 for 1 GiB"
        )
    g = _Graph(model, float32_bytes)
    n = len(g.nodes)
    total = sum(g.inits.values())
    if n == 0 or total <= max_bytes:
        inputs, outputs = g.part(0, n, set())
        first = _label(g.nodes[0]) if n else ""
        return PartsPlan((Part(0, n, total, inputs, outputs, first),), max_bytes, total, ())
    # best[j]: (bytes above the budget, parts, crossing bytes) of the best split of nodes[:j], and its last cut.
    inf = (float("inf"), float("inf"), float("inf"))
    best: list[tuple[float, float, float]] = [inf] * (n + 1)
    back = [-1] * (n + 1)
    best[0] = (0, 0, 0)
    for i in range(n):
        if best[i] == inf:
            continue
        seen: set[str] = set()
        size = 0
        over = False
        for j in range(i + 1, n + 1):
            for name in g.node_inits[j - 1]:
                if name not in seen:
                    seen.add(name)
                    size += g.inits[name]
            if j < n and not g.cuttable[j]:
                continue
            excess = max(0, size - max_bytes)
            if excess and over:
                break  # past the budget and past a possible cut already: a longer part cannot be better
            cost = best[i]
            cand = (cost[0] + excess, cost[1] + 1, cost[2] + (int(g.crossing[j]) if j < n else 0))
            if cand < best[j]:
                best[j], back[j] = cand, i
            over = over or bool(excess)
    bounds = [n]
    while bounds[-1] > 0:
        bounds.append(back[bounds[-1]])
    bounds.reverse()
    parts: list[Part] = []
    for a, b in itertools.pairwise(bounds):
        later: set[str] = set()
        for i in range(b, n):
            later.update(g.uses[i])
        inputs, outputs = g.part(a, b, later)
        size = sum(g.inits[x] for x in dict.fromkeys(x for i in range(a, b) for x in g.node_inits[i]))
        parts.append(Part(a, b, size, inputs, outputs, _label(g.nodes[a])))
    return PartsPlan(tuple(parts), max_bytes, total, tuple(int(g.crossing[b]) for b in bounds[1:-1]))


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.op_type


def extract_parts(model: onnx.ModelProto, plan: PartsPlan) -> list[onnx.ModelProto]:
    """Each part of ``plan`` as a model of its own: its nodes, the initializers they use (external-data references
    are kept as references to the same file, so a part written beside the model's data file reads the same
    bytes), its inputs and outputs typed from the model's value information.

    Raises:
        ExportError: A value crossing a cut has no static type (plans from :func:`plan_parts` never cut there).
    """
    import onnx

    types = _value_types(model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    declared = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output)}
    models = []
    for k, part in enumerate(plan.parts):
        nodes = list(g.node[part.start : part.stop])
        used = dict.fromkeys(x for node in nodes for x in (*node.input, *_subgraph_uses(node)) if x in inits)

        def value(name: str, k: int = k) -> onnx.ValueInfoProto:
            if name in declared:
                return declared[name]
            elem, shape = types.get(name, (0, None))
            if not elem or shape is None:
                raise ExportError(f"part {k}: the value {name!r} crossing a cut has no static type")
            return onnx.helper.make_tensor_value_info(name, elem, shape)

        graph = onnx.helper.make_graph(
            nodes,
            f"{g.name or 'graph'}_part{k}",
            [value(x) for x in part.inputs],
            [value(x) for x in part.outputs],
            initializer=[inits[x] for x in used],
        )
        inner = {x for node in nodes for x in node.output}
        graph.value_info.extend(vi for name, vi in declared.items() if name in inner and name not in part.outputs)
        sub = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
        sub.ir_version = model.ir_version
        sub.functions.extend(model.functions)
        sub.producer_name = model.producer_name
        models.append(sub)
    return models
