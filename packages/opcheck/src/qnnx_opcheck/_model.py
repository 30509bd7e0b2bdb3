"""Reading a model for checking: load without weights, inline local functions, infer dtypes and shapes.

Nothing here reads external data: weights are never needed to decide op support, and skipping them keeps
multi-gigabyte models cheap to check. The ONNX checker and shape inference serialize the whole model they are
given, so they run on a weightless view (see :func:`weightless_view`): their cost does not grow with weight bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import onnx
import onnx.inliner
from google.protobuf.message import Message
from onnx import TensorProto, helper, numpy_helper

from qnnx_clikit import RANDOM_OPS
from qnnx_opcheck.errors import ModelLoadError

__all__ = ["GraphFacts", "ModelInput", "load_model", "read_facts", "weightless_view"]

_log = logging.getLogger(__name__)

ModelInput = onnx.ModelProto | str | os.PathLike[str] | bytes

# Dtype keys used by the tables (TensorProto enum -> key).
DTYPE_KEYS: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT8: "int8",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.UINT8: "uint8",
    TensorProto.UINT16: "uint16",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    TensorProto.BOOL: "bool",
    TensorProto.STRING: "string",
    TensorProto.INT4: "int4",
    TensorProto.UINT4: "uint4",
    TensorProto.FLOAT8E4M3FN: "float8e4m3fn",
}


def dtype_key(elem_type: int) -> str | None:
    """The dtype key of an ONNX element type: the table's spelling, else the type's own name in lower case
    (``float8e5m2``, ``uint2``), so that a type no table lists is known, and refused, rather than unknown."""
    if not elem_type:
        return None
    key = DTYPE_KEYS.get(elem_type)
    if key is None:
        try:
            key = TensorProto.DataType.Name(elem_type).lower()
        except ValueError:  # a number this onnx does not know
            return None
    return key


# Small constant tensors whose values the checker may look at (Slice steps, scalar multipliers).
_MAX_CONST_VALUE_ELEMENTS = 64
# Initializers up to this size keep their data in the weightless view: shape inference reads the values of
# shape-like inputs (Reshape shape, Slice starts, Pad pads, Expand shape), and these are never larger.
_KEEP_INITIALIZER_BYTES = 1024
# 1-D integer initializers are index or shape material; they keep their data up to this size.
_KEEP_INT_VECTOR_BYTES = 64 * 1024
_INTEGER_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


def load_model(model: ModelInput) -> tuple[onnx.ModelProto, str, tuple[str, ...]]:
    """Load ``model`` without external data and validate its structure.

    Args:
        model: A ModelProto, serialized model bytes, or a path to a ``.onnx`` file.

    Returns:
        The model, a description of the source for messages, and notes (e.g. missing external data).

    Raises:
        ModelLoadError: When the input cannot be read or is not a valid ONNX model.
    """
    notes: list[str] = []
    if isinstance(model, onnx.ModelProto):
        source = "the given onnx.ModelProto"
        proto = model
    elif isinstance(model, bytes | bytearray | memoryview):
        source = f"{len(model)} bytes"
        if not model:
            raise ModelLoadError(source, "the data is empty")
        proto = _parse(bytes(model), source)
    elif isinstance(model, str | os.PathLike):
        path = Path(model)
        source = f"'{path}'"
        if not path.exists():
            raise ModelLoadError(source, "no such file")
        if path.is_dir():
            raise ModelLoadError(source, "it is a directory, not a file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(source, f"the file cannot be read ({exc.strerror or exc})") from exc
        if not data:
            raise ModelLoadError(source, "the file is empty")
        proto = _parse(data, source)
        notes.extend(_missing_external_data(proto, path.parent))
    else:
        raise ModelLoadError(
            repr(type(model).__name__), "expected an onnx.ModelProto, bytes, or a path (str / os.PathLike)"
        )
    _validate(proto, source)
    return proto, source, tuple(notes)


def _parse(data: bytes, source: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise ModelLoadError(source, f"not an ONNX protobuf ({type(exc).__name__}: {exc})") from exc
    return proto


_SHAPELESS_TYPE = "Field 'shape' of 'type' is required but missing"


def _validate(proto: onnx.ModelProto, source: str) -> None:
    if not proto.HasField("graph") or proto.ir_version <= 0 or not proto.opset_import:
        missing = [
            what
            for what, ok in (
                ("graph", proto.HasField("graph")),
                ("ir_version", proto.ir_version > 0),
                ("opset_import", bool(proto.opset_import)),
            )
            if not ok
        ]
        raise ModelLoadError(source, f"not an ONNX model (missing {', '.join(missing)})")
    if any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
        # The ONNX checker insists that external data files exist (relative to the working directory
        # for an in-memory model), and weights do not decide support: the structural check above is
        # what big models with external data get.
        return
    try:
        onnx.checker.check_model(weightless_view(proto))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _SHAPELESS_TYPE in first:
            # A value with a dtype but no shape means "rank unknown" to ONNX Runtime, which loads and runs such
            # models; only the checker calls it invalid. Shape inference below still reads the model as it is.
            return
        raise ModelLoadError(source, f"the model is not valid ONNX ({first})") from exc


def weightless_view(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large initializers turned into typed graph inputs of the same name, dtype and shape.

    ``onnx.checker.check_model`` and ``onnx.shape_inference.infer_shapes`` serialize the model they get, weights
    included; on the view they cost the same for a 100 MiB model as for an empty one and report the same
    dtypes, shapes and problems. Small initializers (shape-like values that shape inference reads) keep their
    data, and so does an initializer that is also a graph input (a caller may override it).

    Args:
        proto: A model; never modified, and none of its weight bytes are copied.

    Returns:
        ``proto`` itself when nothing is worth dropping (or for IR version < 4, where every initializer must also
        be a graph input), else a new model that shares no state with ``proto``.
    """
    graph = proto.graph
    inputs = {vi.name for vi in graph.input}
    heavy = {t.name for t in graph.initializer if t.name not in inputs and not _keeps_data(t)}
    if not heavy or proto.ir_version < 4:
        return proto
    view = onnx.ModelProto()
    _copy_fields(proto, view, skip="graph")
    _copy_fields(graph, view.graph, skip="initializer")
    view.graph.initializer.extend(t for t in graph.initializer if t.name not in heavy)
    view.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in graph.initializer if t.name in heavy
    )
    return view


def _keeps_data(t: TensorProto) -> bool:
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):  # undefined or unusual dtype: leave the tensor as it is
        return True
    nbytes = itemsize
    for d in t.dims:
        nbytes *= int(d)
    if nbytes <= _KEEP_INITIALIZER_BYTES:
        return True
    return t.data_type in _INTEGER_TYPES and len(t.dims) <= 1 and nbytes <= _KEEP_INT_VECTOR_BYTES


def _copy_fields(src: Message, dst: Message, *, skip: str) -> None:
    """Copy every set field of ``src`` but ``skip`` into the empty message ``dst`` (shallow protobuf walk)."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, Message):
            getattr(dst, field.name).CopyFrom(value)
        elif isinstance(value, str | bytes | int | float):
            setattr(dst, field.name, value)
        else:  # a repeated field
            getattr(dst, field.name).extend(value)


def _check_structure(graph: onnx.GraphProto, nodes: tuple[NodeView, ...], source: str) -> None:
    """Every node input is defined before use and every value is produced once."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    defined.add("")
    problems: list[str] = []
    for i, node in enumerate(nodes):
        for name in node.input:
            if name not in defined:
                problems.append(
                    f"node {node.name or i} ({node.op_type}) reads '{name}', which nothing defines before it"
                )
        for name in node.output:
            if name and name in defined:
                problems.append(f"value '{name}' is produced twice (again by node {node.name or i})")
            defined.add(name)
        if len(problems) >= 5:
            break
    missing = [o.name for o in graph.output if o.name not in defined]
    problems += [f"graph output '{name}' is never produced" for name in missing[:3]]
    if problems:
        raise ModelLoadError(source, "the model is not valid ONNX (" + "; ".join(problems) + ")")


def _missing_external_data(proto: onnx.ModelProto, base: Path) -> list[str]:
    locations: set[str] = set()
    for tensor in _all_initializers(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            for kv in tensor.external_data:
                if kv.key == "location":
                    locations.add(kv.value)
    missing = sorted(loc for loc in locations if not (base / loc).is_file())
    return [
        f"external data file '{loc}' (next to the model) is missing: the op check does not need weights, "
        f"but onnxruntime cannot load this model until the file is there"
        for loc in missing
    ]


def _all_initializers(graph: onnx.GraphProto) -> Iterable[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _all_initializers(g)


class NodeView:
    """A node's fields as plain Python values: protobuf field access is slow on 10k-node graphs."""

    __slots__ = ("attribute", "domain", "input", "name", "op_type", "output")

    def __init__(self, proto: onnx.NodeProto) -> None:
        self.name: str = proto.name
        self.op_type: str = proto.op_type
        self.domain: str = "" if proto.domain == "ai.onnx" else proto.domain
        self.input: tuple[str, ...] = tuple(proto.input)
        self.output: tuple[str, ...] = tuple(proto.output)
        self.attribute = proto.attribute


@attrs.frozen(kw_only=True)
class ValueFacts:
    """What is known about one value: dtype key, shape (ints, names for symbolic dims, None if unknown)."""

    dtype: str | None = None
    shape: tuple[int | str | None, ...] | None = None


@attrs.frozen(kw_only=True)
class GraphFacts:
    """The checked graph (``model``: its weightless view after shape inference) and the facts the checker needs."""

    model: onnx.ModelProto
    nodes: tuple[NodeView, ...]
    values: dict[str, ValueFacts]
    constants: frozenset[str]
    const_values: dict[str, Any]
    producers: dict[str, int]
    consumers: dict[str, tuple[int, ...]]
    opsets: dict[str, int]
    graph_outputs: frozenset[str]
    symbolic_inputs: dict[str, tuple[str, ...]]
    notes: tuple[str, ...] = ()


def _value_facts(vi: onnx.ValueInfoProto) -> ValueFacts:
    t = vi.type
    if not t.HasField("tensor_type"):
        # A sequence, optional or map value: named by its kind, a type no table cell holds (the QNN EP cannot map it
        # to a QNN data type: Identity of a sequence or an optional tensor is refused at session creation).
        kind = t.WhichOneof("value")
        return ValueFacts(dtype=kind.removesuffix("_type") if kind else None)
    tt = t.tensor_type
    dtype = dtype_key(tt.elem_type)
    shape: tuple[int | str | None, ...] | None = None
    if tt.HasField("shape"):
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_value"):  # -1, as some exporters write an unknown dim: not a static size
                dims.append("?")
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return ValueFacts(dtype=dtype, shape=shape)


def _tensor_facts(t: TensorProto) -> ValueFacts:
    return ValueFacts(dtype=dtype_key(t.data_type), shape=tuple(int(d) for d in t.dims))


def _small_value(t: TensorProto) -> Any:
    n = 1
    for d in t.dims:
        n *= int(d)
    if n > _MAX_CONST_VALUE_ELEMENTS or t.data_location == TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:  # an unusual encoding: the value is simply unknown
        return None


# ORT's constant folding (graph optimization level 1, on by default) evaluates a node whose inputs are
# all constant on the CPU before partitioning, so QNN never sees it. Q/DQ are kept (QDQ groups must
# survive for the QNN EP) and random ops are never folded. Shape folds when the input shape is static.
_NEVER_FOLDED = RANDOM_OPS | frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "If",
        "Loop",
        "Scan",
    }
)


def read_facts(proto: onnx.ModelProto, notes: tuple[str, ...] = (), source: str = "the model") -> GraphFacts:
    """Inline local functions, run shape inference (non-strict) and collect per-value facts.

    Args:
        proto: A model loaded without external data (never modified).
        notes: Notes from loading, carried into the facts.
        source: How to name the model in error messages.

    Raises:
        ModelLoadError: When a node reads a value nothing defines (the graph is not valid ONNX).

    Returns:
        The facts the checker needs.
    """
    model = weightless_view(proto)
    out_notes = list(notes)
    nodes = tuple(NodeView(n) for n in proto.graph.node)
    _check_structure(proto.graph, nodes, source)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
            nodes = tuple(NodeView(n) for n in model.graph.node)
        except Exception as exc:
            _log.warning("could not inline local functions (%s); checking function call nodes as they are", exc)
            out_notes.append(f"local functions could not be inlined ({exc}); their call nodes are checked as ops")
    try:
        from qnnx_opcheck._fold import infer_with_folding

        inferred = infer_with_folding(_standard_qdq(model))
    except Exception as exc:  # a partial result is fine; unknown dtypes are handled conservatively
        _log.info("shape inference failed (%s); dtypes of intermediate values are unknown", exc)
        out_notes.append(f"onnx shape inference failed ({exc}); dtypes of intermediate values are unknown")
        inferred = model
    graph = inferred.graph
    values: dict[str, ValueFacts] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        facts = _value_facts(vi)
        old = values.get(vi.name)
        if old is None or (old.dtype is None and facts.dtype is not None):
            values[vi.name] = facts
    constants: set[str] = set()
    const_values: dict[str, Any] = {}
    # The initializers and inputs of the model itself: the view moved its large initializers to graph inputs.
    overridable = {i.name for i in proto.graph.input}  # an initializer that is also a graph input can be fed
    for t in proto.graph.initializer:
        if t.name not in overridable:  # onnxruntime does not fold what a caller may override
            constants.add(t.name)
        values[t.name] = _tensor_facts(t)
        const_values[t.name] = _small_value(t)
    for st in graph.sparse_initializer:
        constants.add(st.values.name)
    producers: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    graph_output_names = {o.name for o in graph.output}
    static_shapes = {
        name for name, f in values.items() if f.shape is not None and all(isinstance(d, int) for d in f.shape)
    }
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(i)
        for name in node.output:
            if name:
                producers[name] = i
        if node.op_type == "Constant" and node.domain == "":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    const_values[node.output[0]] = _small_value(attr.t)
                    values.setdefault(node.output[0], _tensor_facts(attr.t))
        # ORT does not fold a node that produces a graph output, so such a node is checked as an op; Shape is the
        # exception (its own folding step): Shape(x[3, 4, 5]) and Shape(Relu(x), start=2, end=1) as graph outputs
        # left no Shape node for the QNN EP (onnxruntime 1.32, onnxruntime-qnn 2.7.0, measured).
        produces_output = any(o in graph_output_names for o in node.output)
        if _folds(node, constants, static_shapes) and (node.op_type == "Shape" or not produces_output):
            constants.update(o for o in node.output if o)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in inferred.opset_import}
    symbolic: dict[str, tuple[str, ...]] = {}
    init_names = {t.name for t in proto.graph.initializer}
    for vi in graph.input:
        if vi.name in init_names:
            continue
        f = values.get(vi.name)
        if f is not None and f.shape is not None:
            dyn = tuple(d if isinstance(d, str) else "?" for d in f.shape if not isinstance(d, int))
            if dyn:
                symbolic[vi.name] = dyn
    return GraphFacts(
        model=inferred,
        nodes=nodes,
        values=values,
        constants=frozenset(constants),
        const_values=const_values,
        producers=producers,
        consumers={k: tuple(v) for k, v in consumers.items()},
        opsets=opsets,
        graph_outputs=frozenset(o.name for o in graph.output),
        symbolic_inputs=symbolic,
        notes=tuple(out_notes),
    )


# onnxruntime's quantizer writes these in the com.microsoft domain for 16-bit types below opset 21 (and keeps them
# when it upgrades the model to 21 itself). They compute what the ONNX ops compute, and the QNN EP takes them as
# such (onnxruntime-qnn 2.7.0, measured); ONNX has no schema for them, so shape inference would stop there.
_CONTRIB_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


def _standard_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy of it whose com.microsoft QuantizeLinear/DequantizeLinear nodes are in the ONNX domain,
    so that shape inference types the values after them (the float a DequantizeLinear gives back)."""
    if not any(n.domain == "com.microsoft" and n.op_type in _CONTRIB_QDQ for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.domain == "com.microsoft" and node.op_type in _CONTRIB_QDQ:
            node.domain = ""
    return copy


def _folds(node: NodeView, constants: set[str], static_shapes: set[str]) -> bool:
    if node.domain != "" or node.op_type in _NEVER_FOLDED:
        return False
    if node.op_type == "Shape":
        return bool(node.input) and (node.input[0] in constants or node.input[0] in static_shapes)
    return all((not name) or name in constants for name in node.input)
