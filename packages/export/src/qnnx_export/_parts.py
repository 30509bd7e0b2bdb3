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

from qnnx_clikit import RANDOM_OPS
from qnnx_export.errors import ExportError

if TYPE_CHECKING:
    import onnx

__all__ = ["Part", "PartsPlan", "extract_parts", "plan_parts", "stored_weight_bytes", "weight_bytes"]

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


def stored_weight_bytes(model: onnx.ModelProto, *, float32_bytes: float = 4) -> int:
    """The bytes of weights a QNN context built from ``model`` stores: like :func:`weight_bytes`, except that a tensor
    read in two ways is stored twice. On onnxruntime-qnn 2.7.0 HTP a [32768, 64] float table read both by a Gather
    (as its data) and by a Gemm (``transB=1``, as its weight) gave a context of twice the table's float16 bytes, and
    so did the Gather beside a MatMul of its Transpose (how a tied embedding's output head is exported: ONNX Runtime
    folds the Transpose into a tensor of its own); two MatMuls, or two Gathers, reading one tensor stored it once.
    So each value is counted once as a Gather's data and once as anything else, and a value computed from
    initializers alone (which ONNX Runtime folds) is counted as its own tensor, of its initializers' bytes."""
    nodes = list(model.graph.node)
    inits = {t.name: _tensor_bytes(t.data_type, t.dims, float32_bytes) for t in model.graph.initializer}
    const_inits, _, is_const = _constants(nodes, inits)
    stores, _ = _stores(nodes, inits, const_inits, is_const)
    return sum(stores.values())


_Key = tuple[str, bool]
"""A stored tensor: the value a node reads, and whether it is read as a Gather's data (a table)."""


def _stores(
    nodes: Sequence[onnx.NodeProto],
    inits: dict[str, int],
    const_inits: dict[str, tuple[str, ...]],
    is_const: Sequence[bool],
) -> tuple[dict[_Key, int], list[tuple[_Key, ...]]]:
    """(every stored tensor with its bytes, and per node the stored tensors it reads), from the initializers' bytes
    and :func:`_constants`; initializers no node reads are stored as they are."""
    stores: dict[_Key, int] = {}
    per_node: list[tuple[_Key, ...]] = []
    read: set[str] = set()
    for i, node in enumerate(nodes):
        keys: dict[_Key, None] = {}
        if is_const[i]:  # folded: the nodes that read its value store it
            per_node.append(())
            continue
        for x in dict.fromkeys([*node.input, *_subgraph_uses(node)]):
            if x in inits:
                sources: tuple[str, ...] = (x,)
            elif x in const_inits:
                sources = const_inits[x]
            else:
                continue
            key = (x, node.op_type == "Gather" and bool(node.input) and node.input[0] == x)
            stores[key] = sum(inits[y] for y in sources)
            read.update(sources)
            keys[key] = None
        per_node.append(tuple(keys))
    for name, size in inits.items():
        if name not in read:
            stores[(name, False)] = size
    return stores, per_node


def _constants(
    nodes: Sequence[onnx.NodeProto], inits: dict[str, int]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[int, ...]], list[bool]]:
    """The values computed from initializers alone (ONNX Runtime folds them): each with the initializers it is
    computed from and the nodes that compute it, and per node whether it is such a computation."""
    const_inits: dict[str, tuple[str, ...]] = {}
    const_nodes: dict[str, tuple[int, ...]] = {}
    is_const = [False] * len(nodes)
    for i, node in enumerate(nodes):
        inputs = [x for x in node.input if x]
        has_graph = any(a.type in (_GRAPH_ATTRIBUTE, 10) for a in node.attribute)  # GRAPH, GRAPHS
        if has_graph or node.op_type in RANDOM_OPS or node.domain not in ("", "ai.onnx"):
            continue
        if not all(x in inits or x in const_inits for x in inputs):
            continue
        is_const[i] = True
        sources = dict.fromkeys(y for x in inputs for y in ((x,) if x in inits else const_inits[x]))
        computed = sorted({i, *(k for x in inputs if x in const_nodes for k in const_nodes[x])})
        for name in node.output:
            if name:
                const_inits[name] = tuple(sources)
                const_nodes[name] = tuple(computed)
    return const_inits, const_nodes, is_const


@attrs.frozen
class Part:
    """One part: the nodes ``start:stop`` of the model's graph, in order.

    Attributes:
        start: Index of the part's first node in ``model.graph.node``.
        stop: One past its last node.
        nodes: The indices of the nodes it holds: its own (``start:stop``, constants left out) and a copy of the
            constant nodes (computed from initializers alone) it reads, which ONNX Runtime folds.
        weight_bytes: The bytes of the weights its context stores (see :func:`stored_weight_bytes`; a tensor used
            by two parts counts in both).
        inputs: What the part reads from outside itself: the model's inputs and the earlier parts' outputs.
        outputs: What it hands on: the model's outputs it computes and the values later parts read.
        first_node: The name (or op type, for an unnamed node) of its first node, for reports.
    """

    start: int
    stop: int
    nodes: tuple[int, ...]
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
        total_weight_bytes: The model's weight bytes as one context would store them (see
            :func:`stored_weight_bytes`).
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
    """The facts the planner needs about a model, computed once (linear in its size).

    Nodes computed from initializers alone (a Transpose of a weight, a Constant) are constants: their values never
    cross a cut. Each part that reads one gets its own copy of the nodes that compute it, and its weights count for
    that part (ONNX Runtime folds them when it builds the part's session).
    """

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
        # constant values: each with the initializers it is computed from and the nodes that compute it
        self.const_inits, self.const_nodes, self.is_const = _constants(self.nodes, self.inits)
        # what a QNN context stores: per node the stored tensors it reads (see stored_weight_bytes)
        self.stores, self.node_stores = _stores(self.nodes, self.inits, self.const_inits, self.is_const)
        self.uses: list[tuple[str, ...]] = []  # per node: values of the main graph it reads (subgraphs included)
        self.node_consts: list[tuple[str, ...]] = []  # per node: the constant values it reads
        last_use: dict[str, int] = {}
        first_use: dict[str, int] = {}  # of the model's inputs: live from where they are first read
        for i, node in enumerate(self.nodes):
            if self.is_const[i]:
                self.uses.append(())
                self.node_consts.append(())
                continue
            names = dict.fromkeys([*(x for x in node.input if x), *_subgraph_uses(node)])
            known = tuple(x for x in names if x in producer or x in self.inits or x in self.graph_inputs)
            consts = tuple(x for x in known if x in self.const_inits)
            self.uses.append(tuple(x for x in known if x not in self.const_inits))
            self.node_consts.append(consts)
            for x in self.uses[-1]:
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
        self.node_bytes = [sum(self.stores[k] for k in keys) for keys in self.node_stores]
        types = _value_types(model)
        # cut k falls before node k: a value crosses it when produced (a model input: first read) before k and
        # read at or after k.
        crossing = np.zeros(n + 2, dtype=np.int64)
        unknown = np.zeros(n + 2, dtype=np.int64)
        for name, p in [*producer.items(), *first_use.items()]:
            u = last_use.get(name)
            if u is None or u <= p or name in self.const_inits:
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

    def part_nodes(self, start: int, stop: int) -> tuple[int, ...]:
        """The nodes of the part ``start:stop``: its own, and a copy of the constant nodes its nodes read (or that
        compute a model output within it)."""
        own = {i for i in range(start, stop) if not self.is_const[i]}
        consts = {k for i in own for c in self.node_consts[i] for k in self.const_nodes[c]}
        for name in self.graph_outputs:
            p = self.producer.get(name)
            if p is not None and start <= p < stop and name in self.const_nodes:
                consts.update(self.const_nodes[name])
        return tuple(sorted(own | consts))

    def part(self, start: int, stop: int, later_reads: set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        nodes = self.part_nodes(start, stop)
        inside: set[str] = set()
        for i in nodes:
            inside.update(x for x in self.nodes[i].output if x)
        reads: dict[str, None] = {}
        for i in nodes:
            for x in self.uses[i]:
                if x not in inside and x not in self.inits:
                    reads[x] = None
        inputs = tuple(x for x in self.graph_inputs if x in reads) + tuple(
            x for x in reads if x not in self.graph_inputs
        )
        outputs = tuple(
            dict.fromkeys(
                [
                    *(x for x in self.graph_outputs if x in inside),
                    *(x for x in inside if x in later_reads and x not in self.const_inits),
                ]
            )
        )
        return inputs, outputs


def plan_parts(model: onnx.ModelProto, max_bytes: int, *, float32_bytes: float = 4) -> PartsPlan:
    """Choose where to cut ``model`` so that each part's weights stay within ``max_bytes``.

    The plan has as few parts as the budget allows; among plans with that many, it passes the fewest activation
    bytes between parts, and it cuts only where every crossing value has a static type. A part can exceed the
    budget only when one node's weights do (then it holds at most an eighth of the budget more than that node), or
    when one stretch between two possible cuts does by itself (see :attr:`PartsPlan.over_budget`).

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
    total = sum(g.stores.values())
    if n == 0 or total <= max_bytes:
        inputs, outputs = g.part(0, n, set())
        first = _label(g.nodes[0]) if n else ""
        return PartsPlan((Part(0, n, tuple(range(n)), total, inputs, outputs, first),), max_bytes, total, ())
    # best[j]: (bytes above the budget, parts, crossing bytes) of the best split of nodes[:j], and its last cut.
    inf = (float("inf"), float("inf"), float("inf"))
    best: list[tuple[float, float, float]] = [inf] * (n + 1)
    back = [-1] * (n + 1)
    best[0] = (0, 0, 0)
    for i in range(n):
        if best[i] == inf:
            continue
        seen: set[_Key] = set()
        size = heaviest = 0
        first_excess = None  # the excess at the first possible cut past the budget
        for j in range(i + 1, n + 1):
            for key in g.node_stores[j - 1]:
                if key not in seen:
                    seen.add(key)
                    size += g.stores[key]
            heaviest = max(heaviest, g.node_bytes[j - 1])
            if j < n and not g.cuttable[j]:
                continue
            # A node above the budget needs a part above it whatever the cut: that part may also hold an eighth of
            # the budget more (the small nodes around the node), rather than leave them a part of their own.
            excess = max(0, size - (max_bytes if heaviest <= max_bytes else heaviest + max_bytes // 8))
            if first_excess is not None and excess > first_excess:
                break  # more weights past a cut that was already over the budget: a longer part cannot be better
            cost = best[i]
            cand = (cost[0] + excess, cost[1] + 1, cost[2] + (int(g.crossing[j]) if j < n else 0))
            if cand < best[j]:
                best[j], back[j] = cand, i
            if excess and first_excess is None:
                first_excess = excess
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
        size = sum(g.stores[k] for k in dict.fromkeys(k for i in range(a, b) for k in g.node_stores[i]))
        own = [i for i in range(a, b) if not g.is_const[i]] or [a]
        parts.append(Part(a, b, g.part_nodes(a, b), size, inputs, outputs, _label(g.nodes[own[0]])))
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
        nodes = [g.node[i] for i in part.nodes]
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
