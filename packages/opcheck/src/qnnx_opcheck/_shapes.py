"""Static input shapes for checking: parse ``--dim NAME=N`` and ``--shape INPUT=D0,D1,...``, check them against the
model's graph inputs, and write them into the model so that shape inference makes the graph static.

Exported ONNX files name their free dimensions (``batch``, ``height``, ``sequence``); QNN compiles only static
shapes, so ONNX Runtime users fix them at session creation (a free-dimension override by name). Checking with the same
values gives the verdict for the graph QNN will compile. A name stands for one size everywhere in the graph, so a
``--shape`` also fixes the named dims it covers, and the named dims inside intermediate value infos are rewritten too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import onnx

from qnnx_opcheck.errors import InvalidShapeError

__all__ = ["apply_static_shapes", "fix_flags", "parse_dim", "parse_shape", "resolve_sizes", "symbolic_dims"]

_NAME = r"[^=\s][^=]*?"
_DIM_RE = re.compile(rf"\s*({_NAME})\s*=\s*(\S+?)\s*")
# Names some exporters write for "unknown" (one name on several axes that need not be equal): not a free dim.
_UNNAMED = frozenset({"", "?", "-1"})
_DIM_FORM = "NAME=N with N a positive integer, e.g. batch=1"
_SHAPE_FORM = "INPUT=D0,D1,... with positive integers, e.g. images=1,3,320,320"


def _positive(text: str) -> int | None:
    text = text.strip()
    if not (text.isascii() and text.isdecimal()):
        return None
    value = int(text)
    return value if value >= 1 else None


def parse_dim(text: str) -> tuple[str, int]:
    """``"batch=1"`` -> ``("batch", 1)``.

    Raises:
        InvalidShapeError: ``text`` is not ``NAME=N`` with a positive integer N.
    """
    match = _DIM_RE.fullmatch(text)
    value = _positive(match.group(2)) if match else None
    if match is None or value is None:
        raise InvalidShapeError(
            f"--dim {text!r} is not a free-dimension size; accepted: {_DIM_FORM}. "
            f"Fix: write the model's dimension name, '=', and its size, e.g. --dim batch=1."
        )
    return match.group(1), value


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"images=1,3,320,320"`` -> ``("images", (1, 3, 320, 320))``.

    Raises:
        InvalidShapeError: ``text`` is not ``INPUT=D0,D1,...`` with positive integers.
    """
    name, sep, dims_text = text.rpartition("=")
    name = name.strip()
    dims = [_positive(d) for d in dims_text.split(",")] if dims_text.strip() else []
    if not sep or not name or not dims or any(d is None for d in dims):
        raise InvalidShapeError(
            f"--shape {text!r} is not an input shape; accepted: {_SHAPE_FORM}. "
            f"Fix: write the graph input's name, '=', and every dimension separated by commas, "
            f"e.g. --shape images=1,3,320,320."
        )
    return name, tuple(d for d in dims if d is not None)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """A value's dims (int, a symbolic name, or None for an unnamed unknown dim), None when it has no shape."""
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param not in _UNNAMED:
            out.append(d.dim_param)
        else:  # unknown: no value, a negative one (some exporters write -1), or a placeholder name
            out.append(None)
    return out


def _runtime_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in graph.initializer}
    return [vi for vi in graph.input if vi.name not in inits]


def _describe(dims: Sequence[int | str | None] | None) -> str:
    return "unknown rank" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def symbolic_dims(graph: onnx.GraphProto) -> dict[str, list[int | str | None]]:
    """Graph input name -> its dims, for the runtime inputs whose shape is not fully static."""
    out = {}
    for vi in _runtime_inputs(graph):
        dims = _dims(vi)
        if dims is None or not all(isinstance(d, int) for d in dims):
            out[vi.name] = dims if dims is not None else []
    return out


def _check_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidShapeError(
            f"{what} is {value!r}; accepted: a positive integer. Fix: give the size the model will run with, e.g. 1."
        )
    return value


def resolve_sizes(
    graph: onnx.GraphProto,
    free_dims: Mapping[str, int] | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Check the requested sizes against the graph inputs.

    Returns:
        Every dimension name the request fixes (from ``free_dims`` and from the named dims ``input_shapes`` covers)
        with its size, and the full shape of each input ``input_shapes`` names.

    Raises:
        InvalidShapeError: an unknown dimension or input name, a size that is not a positive integer, a shape of the
            wrong rank or one that contradicts a fixed dimension, or two sizes for one dimension name.
    """
    inputs = {vi.name: _dims(vi) for vi in _runtime_inputs(graph)}
    names: dict[str, list[str]] = {}
    for input_name, dims in inputs.items():
        for d in dims or []:
            if isinstance(d, str):
                names.setdefault(d, []).append(input_name)
    listing = "; ".join(f"{n} {_describe(d)}" for n, d in inputs.items()) or "none"
    sizes: dict[str, int] = {}
    origin: dict[str, str] = {}
    for name, value in (free_dims or {}).items():
        size = _check_int(f"the size of free dimension {name!r}", value)
        if name not in names:
            known = ", ".join(sorted(names)) or "none (every input dimension is fixed or unnamed)"
            raise InvalidShapeError(
                f"free dimension {name!r} (--dim {name}={size}) is not a dimension name of any graph input; "
                f"accepted names: {known} (inputs: {listing}). Fix: use one of those names, or --shape INPUT=D0,D1,... "
                f"for an input whose dimensions have no name."
            )
        sizes[name] = size
        origin[name] = f"--dim {name}={size}"
    shapes: dict[str, tuple[int, ...]] = {}
    for input_name, shape in (input_shapes or {}).items():
        given = tuple(_check_int(f"a dimension of input {input_name!r}", d) for d in shape)
        spelled = f"--shape {input_name}={','.join(map(str, given))}"
        if input_name not in inputs:
            raise InvalidShapeError(
                f"{spelled}: the model has no graph input {input_name!r}; accepted: {listing}. "
                f"Fix: name one of those inputs."
            )
        dims = inputs[input_name]
        if dims is not None and len(dims) != len(given):
            raise InvalidShapeError(
                f"{spelled}: input {input_name!r} has rank {len(dims)} {_describe(dims)}, the shape has "
                f"{len(given)} dimensions; accepted: exactly {len(dims)} positive integers. "
                f"Fix: give one size per dimension, keeping the fixed ones."
            )
        for axis, (have, want) in enumerate(zip(dims or [], given, strict=False)):
            if isinstance(have, int) and have != want:
                raise InvalidShapeError(
                    f"{spelled}: dimension {axis} of input {input_name!r} is fixed at {have} in the model "
                    f"{_describe(dims)}; accepted: {have} there. Fix: keep {have} at position {axis}."
                )
            if isinstance(have, str):
                if have in sizes and sizes[have] != want:
                    raise InvalidShapeError(
                        f"{spelled}: dimension {axis} of input {input_name!r} is the free dimension {have!r}, which "
                        f"{origin[have]} sets to {sizes[have]}; accepted: {sizes[have]} there. Fix: give one size "
                        f"per dimension name."
                    )
                sizes[have] = want
                origin[have] = spelled
        shapes[input_name] = given
    return sizes, shapes


def _set_dims(vi: onnx.ValueInfoProto, sizes: Mapping[str, int], shape: Sequence[int] | None, clear: bool) -> None:
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        if shape is not None and t.HasField("tensor_type"):
            for d in shape:
                t.tensor_type.shape.dim.add().dim_value = d
        return
    for axis, d in enumerate(t.tensor_type.shape.dim):
        if shape is not None:
            d.dim_value = shape[axis]  # setting dim_value clears dim_param (a oneof)
        elif d.HasField("dim_param") and d.dim_param in sizes:
            d.dim_value = sizes[d.dim_param]
        elif clear and (d.HasField("dim_param") or (d.HasField("dim_value") and d.dim_value < 0)):
            # An expression of the fixed names ('2*height') or an exporter's own symbol: shape inference computes
            # it again from the now static inputs.
            d.Clear()


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def apply_static_shapes(
    proto: onnx.ModelProto,
    free_dims: Mapping[str, int] | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> list[str]:
    """Write the requested sizes into ``proto`` (modified in place) and return notes saying what was fixed.

    Named dims are replaced by their sizes in graph inputs, outputs and value infos (subgraphs included); the other
    symbolic dims of outputs and value infos are cleared, so that shape inference recomputes them.

    Raises:
        InvalidShapeError: see :func:`resolve_sizes`.
    """
    if not free_dims and not input_shapes:
        return []
    sizes, shapes = resolve_sizes(proto.graph, free_dims, input_shapes)
    inputs = {vi.name for vi in _runtime_inputs(proto.graph)}
    for graph in _graphs(proto.graph):
        top = graph is proto.graph
        for vi in graph.input:
            _set_dims(vi, sizes, shapes.get(vi.name) if top and vi.name in inputs else None, clear=False)
        for vi in [*graph.output, *graph.value_info]:
            _set_dims(vi, sizes, None, clear=True)
    notes = []
    if sizes:
        notes.append("fixed free dimensions: " + ", ".join(f"{k}={v}" for k, v in sorted(sizes.items())))
    left = symbolic_dims(proto.graph)
    if left:
        notes.append(
            "still symbolic: "
            + "; ".join(f"{n} {_describe(d)}" for n, d in left.items())
            + " (fix them with --dim NAME=N or --shape INPUT=D0,D1,...)"
        )
    return notes


def fix_flags(inputs: Mapping[str, Sequence[str]]) -> str:
    """The opcheck flags that fix these symbolic input dims (graph input -> its non-static dims, ``?`` unnamed)."""
    named = sorted({d for dims in inputs.values() for d in dims if d != "?"})
    flags = [f"--dim {d}=N" for d in named]
    flags += [f"--shape {name}=D0,D1,..." for name, dims in inputs.items() if "?" in dims]
    return " ".join(flags)
