"""Complex values inside a Dynamo graph, carried as (real, imaginary) pairs of real tensors.

Rotary position embeddings are often written with complex numbers (Llama 4, DeepSeek-V2, Meta's reference Llama):
``view_as_complex(x.reshape(..., -1, 2)) * freqs_cis`` then ``view_as_real(...).flatten(3)``, with ``freqs_cis``
made by ``torch.polar`` or kept as a complex buffer. ONNX and QNN have no complex type, but such a graph only
holds complex values between real inputs and real outputs. :func:`as_real_pairs` rewrites it so that every
complex value of shape ``S`` is carried as the real tensor of shape ``S + (2,)`` that ``torch.view_as_real``
would return (its last dimension holds the real and imaginary parts): ``view_as_complex`` and ``view_as_real``
become nothing, a product becomes the four real products it is made of, and views, indexing and concatenations
act on the leading dimensions. PyTorch computes these products the same way, so the rewritten graph gives
eager's values up to float rounding (``polar``'s cosine and sine are libm's; ATen's scalar tail of a complex
product may fuse a multiply-add). A real operand takes part as ``x + 0i``, as PyTorch promotes it, so infinities
and signed zeros come out as PyTorch's.

Fourier transforms (``torch.fft.*``, ``torch.stft``) are MatMuls with constant matrices on the pairs (``_dft.py``).
A complex64 element of the graph's output is returned as its real pair; the rewritten module's ``meta`` lists those
positions (``COMPLEX_OUTPUTS``) and the export's signature rebuilds the complex tensor.

An op on a complex value that is not in the table below (``_TABLE``) keeps the graph in PyTorch (:func:`refusal`
names it): the rewrite never guesses. So do complex graph inputs; a complex parameter, buffer or constant, or a
complex tensor the analysis classes as model state (an attribute or a global), is passed to the rewritten graph as
its real pair.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from qnnx_export._dft import (
    DFT_OPS,
    MAX_DFT_LENGTH,
    DftStep,
    dft_matrix,
    frame_positions,
    parse_dft,
    parts_first,
)

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["COMPLEX_OUTPUTS", "as_real_pairs", "complex_values", "refusal"]

COMPLEX_OUTPUTS = "qnnx_complex_outputs"
"""Key of the rewritten graph module's ``meta``: the positions of its output tuple that are complex values returned
as their real pairs (``[..., 2]``), for the caller to rebuild with ``torch.view_as_complex``."""


class _NoPairRewrite(Exception):
    """A complex value the rewrite cannot carry as a real pair (the message says which and why)."""


def _value(node: Any, placeholders: dict[Any, Any]) -> Any:
    if node in placeholders:
        return placeholders[node]
    return node.meta.get("example_value", node.meta.get("val"))


def _is_complex(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(_is_complex(v) for v in value)
    return False


def complex_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Names of the nodes of ``gm`` whose value is (or holds) a complex tensor, in graph order."""
    placeholders = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs, strict=False))
    return [n.name for n in gm.graph.nodes if n.op != "output" and _is_complex(_value(n, placeholders))]


_REAL_OF = {"torch.complex64": "torch.float32", "torch.complex128": "torch.float64"}


def _name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "") or str(target)


class _Rewriter:
    """Copies a graph into a new one, each complex value as its real pair (see the module's docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        import torch
        import torch.fx

        self.gm = gm
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[Any, Any] = {}
        self.pairs: set[Any] = set()  # old nodes whose new node holds a real pair
        self.placeholders = dict(
            zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs, strict=False)
        )
        self.complex_positions: list[int] = []
        self.complex_outputs: list[int] = []
        self._consts = 0

    # -- helpers --------------------------------------------------------------------------------------------

    def value(self, node: Any) -> Any:
        return _value(node, self.placeholders)

    def rank(self, node: Any) -> int:
        value = self.value(node)
        if value is None or not hasattr(value, "dim"):
            raise _NoPairRewrite(f"node {node.name} has no recorded shape")
        return int(value.dim())

    def real_dtype(self, node: Any) -> Any:
        import torch

        value = self.value(node)
        dtype = getattr(value, "dtype", None)
        if str(dtype) not in _REAL_OF:
            raise _NoPairRewrite(f"node {node.name} is {dtype}; only complex64 and complex128 are carried as pairs")
        return getattr(torch, _REAL_OF[str(dtype)].removeprefix("torch."))

    def fn(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.graph.call_function(target, args, kwargs)

    def part(self, pair: Any, index: int) -> Any:
        import torch

        return self.fn(torch.select, pair, -1, index)

    def stack(self, real: Any, imag: Any) -> Any:
        import torch

        return self.fn(torch.stack, [real, imag], -1)

    def new(self, arg: Any) -> Any:
        import torch.fx

        return torch.fx.node.map_arg(arg, lambda n: self.env[n])

    def is_pair(self, arg: Any) -> bool:
        return arg in self.pairs

    def cast(self, new_node: Any, old: Any, dtype: Any) -> Any:
        """``new_node`` (the copy of the real value or pair ``old``) as ``dtype``: PyTorch's type promotion casts
        an operand to the result's dtype before the arithmetic, and so does the rewrite."""
        value = self.value(old)
        if value is not None and _REAL_OF.get(str(value.dtype), str(value.dtype)) == str(dtype):
            return new_node
        return self.graph.call_method("to", (new_node, dtype))

    # -- the walk -------------------------------------------------------------------------------------------

    def run(self) -> torch.fx.GraphModule:
        import torch
        import torch.fx

        position = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                new = self.graph.placeholder(node.name)
                value = self.value(node)
                if _is_complex(value):
                    self.real_dtype(node)
                    self.pairs.add(node)
                    self.complex_positions.append(position)
                else:
                    new.meta = dict(node.meta)
                self.env[node] = new
                position += 1
                continue
            if node.op == "output":
                self._output(node)
                continue
            if node.op == "get_attr":
                self.env[node] = self._attr(node)
                continue
            inputs: list[Any] = []
            torch.fx.node.map_arg((node.args, node.kwargs), inputs.append)
            complex_out = _is_complex(self.value(node))
            if not complex_out and not any(self.is_pair(n) for n in inputs) and not self._makes_complex(node):
                new = self.graph.node_copy(node, lambda n: self.env[n])
                if node.op in ("call_module",):
                    top = str(node.target).split(".")[0]
                    if not hasattr(self.root, top):
                        setattr(self.root, top, getattr(self.gm, top))
                self.env[node] = new
                continue
            new, is_pair = self._rewrite(node)
            if is_pair != complex_out:
                raise _NoPairRewrite(f"node {node.name} ({_name(node)}) changes between complex and real unexpectedly")
            self.env[node] = new
            if is_pair:
                self.pairs.add(node)
        rewritten = torch.fx.GraphModule(self.root, self.graph, class_name=type(self.gm).__name__)
        rewritten.meta[COMPLEX_OUTPUTS] = tuple(self.complex_outputs)
        return rewritten

    def _output(self, node: Any) -> None:
        """The output: a complex element of the returned tuple is returned as its real pair (complex64 only: the
        caller rebuilds it from float32 parts); a complex value anywhere else in the output is refused."""
        import torch
        import torch.fx

        elements = node.args[0]
        flat = list(elements) if isinstance(elements, (tuple, list)) else [elements]
        returned: dict[Any, Any] = {}
        for position, element in enumerate(flat):
            if isinstance(element, torch.fx.Node) and element in self.pairs:
                dtype = getattr(self.value(element), "dtype", None)
                if dtype != torch.complex64:
                    raise _NoPairRewrite(f"the graph returns the {dtype} value {element.name} (complex64 only)")
                self.complex_outputs.append(position)
                pair = self.env[element]
                if pair.op in ("placeholder", "get_attr"):
                    # view_as_complex of an input: its pair is the input itself, which the caller would get back
                    # as it is (real); a copy is an output of the model, rebuilt as complex like any other.
                    returned[element] = self.graph.call_method("clone", (pair,))
                continue
            leaves: list[Any] = []
            torch.fx.node.map_arg(element, leaves.append)
            bad = [n.name for n in leaves if n in self.pairs]
            if bad:
                raise _NoPairRewrite(f"the graph returns the complex value {bad[0]} inside a container")
        self.graph.output(torch.fx.node.map_arg(elements, lambda n: returned.get(n, self.env[n])))

    def _attr(self, node: Any) -> Any:
        import torch

        target = str(node.target)
        value = self.gm
        for part in target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor) and value.is_complex():
            if str(value.dtype) not in _REAL_OF:
                raise _NoPairRewrite(
                    f"constant {node.name} is {value.dtype}; only complex64 and complex128 are carried"
                )
            name = f"_qnnx_real_pair_{self._consts}"
            self._consts += 1
            self.root.register_buffer(name, torch.view_as_real(value.detach().resolve_conj()).clone())
            self.pairs.add(node)
            return self.graph.get_attr(name)
        top = target.split(".")[0]
        if not hasattr(self.root, top):
            setattr(self.root, top, getattr(self.gm, top))
        return self.graph.get_attr(target)

    def _makes_complex(self, node: Any) -> bool:
        return _name(node) in ("view_as_complex", "polar", "complex")

    # -- the table ------------------------------------------------------------------------------------------

    def _rewrite(self, node: Any) -> tuple[Any, bool]:
        name = _name(node)
        if node.op == "call_function" and node.target is operator.getitem:
            name = "__getitem__"
        if node.op == "call_function" and node.target is getattr:
            name = str(node.args[1])
        handler = _TABLE.get(name)
        if handler is None or node.op not in ("call_function", "call_method"):
            raise _NoPairRewrite(f"node {node.name} ({name}) acts on a complex value and has no real-pair rewrite")
        if node.kwargs.get("out") is not None or (name.endswith("_") and not name.endswith("__")):
            raise _NoPairRewrite(f"node {node.name} ({name}) writes a complex value in place")
        return handler(self, node)


# Each handler takes the rewriter and the old node and returns (new node, whether it holds a pair). Arguments are
# read from the old node; ``r.new`` maps them into the new graph.


def _args(node: Any, *names: str, defaults: Sequence[Any] = ()) -> list[Any]:
    """The node's arguments by position or keyword (``names`` after the tensor), with ``defaults`` for the
    trailing ones left out."""
    args = list(node.args[1:])
    out = []
    for i, key in enumerate(names):
        if i < len(args):
            out.append(args[i])
        elif key in node.kwargs:
            out.append(node.kwargs[key])
        elif i >= len(names) - len(defaults):
            out.append(defaults[i - (len(names) - len(defaults))])
        else:
            raise _NoPairRewrite(f"node {node.name} ({_name(node)}) has no argument {key}")
    return out


def _two(node: Any, first: str, second: str) -> tuple[Any, Any]:
    """The node's first two arguments, by position or keyword."""
    args = [*node.args, None, None]
    return node.kwargs.get(first, args[0]), node.kwargs.get(second, args[1])


def _source(node: Any) -> Any:
    return node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))


def _dim(r: _Rewriter, node: Any, dim: Any, extra: int = 0) -> int:
    """A dim of complex value ``node`` made non-negative, so that it names the same dim of the pair."""
    if not isinstance(dim, int):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) takes a dim that is not a constant: {dim!r}")
    return dim + r.rank(_source(node)) + extra if dim < 0 else dim


def _sizes(node: Any) -> list[Any]:
    rest = list(node.args[1:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = list(rest[0])
    if not rest:
        rest = list(node.kwargs.get("shape", node.kwargs.get("size", ())))
    import torch.fx

    if not rest or not all(isinstance(s, (int, torch.fx.Node)) for s in rest):
        # view(dtype) reinterprets the bytes: not a shape.
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) takes {rest!r}, not sizes")
    return rest


def _unary_view(method: str) -> Callable[[_Rewriter, Any], tuple[Any, bool]]:
    """Ops that act on the leading dims only: the same op on the pair."""

    def handler(r: _Rewriter, node: Any) -> tuple[Any, bool]:
        return r.graph.call_method(method, (r.new(_source(node)),)), True

    return handler


def _view_as_complex(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    x = _source(node)
    value = r.value(x)
    if value is None or str(value.dtype) not in ("torch.float32", "torch.float64"):
        raise _NoPairRewrite(f"node {node.name} (view_as_complex) of a {getattr(value, 'dtype', '?')} tensor")
    return r.new(x), True


def _view_as_real(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    return r.new(_source(node)), False


def _real_part(index: int) -> Callable[[_Rewriter, Any], tuple[Any, bool]]:
    def handler(r: _Rewriter, node: Any) -> tuple[Any, bool]:
        source = _source(node)
        if not r.is_pair(source):
            raise _NoPairRewrite(f"node {node.name} ({_name(node)}) of a real value")
        return r.part(r.new(source), index), False

    return handler


def _polar(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    import torch

    magnitude, angle = _two(node, "abs", "angle")
    # torch.polar computes abs * cos(angle), abs * sin(angle) (c10::polar; its cosine and sine are libm's, so
    # they may differ from torch.cos and torch.sin in the last bit).
    m, a = r.new(magnitude), r.new(angle)
    return _pair(r, node, r.fn(torch.mul, m, r.fn(torch.cos, a)), r.fn(torch.mul, m, r.fn(torch.sin, a))), True


def _complex(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    real, imag = _two(node, "real", "imag")
    return _pair(r, node, r.new(real), r.new(imag)), True


def _operand(r: _Rewriter, arg: Any, dtype: Any) -> tuple[Any, Any]:
    """(real part, imaginary part) of an operand of complex arithmetic. A real tensor or number has the imaginary
    part 0.0: PyTorch promotes it to ``x + 0i`` before the arithmetic, and the rewrite computes with that zero too
    (so an infinite part times it gives PyTorch's NaN, and signed zeros come out as PyTorch's)."""
    import torch
    import torch.fx

    if isinstance(arg, torch.fx.Node):
        if r.is_pair(arg):
            pair = r.cast(r.new(arg), arg, dtype)
            return r.part(pair, 0), r.part(pair, 1)
        value = r.value(arg)
        if value is None or not isinstance(value, torch.Tensor):
            raise _NoPairRewrite(f"operand {arg.name} of complex arithmetic is not a tensor")
        return r.cast(r.new(arg), arg, dtype), 0.0
    if isinstance(arg, complex):
        return arg.real, arg.imag
    if isinstance(arg, (bool, int, float)):
        return float(arg), 0.0
    raise _NoPairRewrite(f"operand {arg!r} of complex arithmetic")


def _binary(r: _Rewriter, node: Any) -> tuple[Any, Any, Any]:
    a, b = _two(node, "input", "other")
    dtype = r.real_dtype(node)
    return _operand(r, a, dtype), _operand(r, b, dtype), node.kwargs.get("alpha", 1)


def _arith(r: _Rewriter, op: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    """``op(x, y)`` as a node of the new graph, or computed here when both are numbers."""
    import torch.fx

    if isinstance(x, torch.fx.Node) or isinstance(y, torch.fx.Node):
        return r.fn(op, x, y)
    return op(x, y)


def _mul(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    (a0, a1), (b0, b1), _ = _binary(r, node)
    # (a0 + a1 i)(b0 + b1 i) = (a0 b0 - a1 b1) + (a0 b1 + a1 b0) i, as c10::complex and ATen's vectorized
    # complex product compute it (a real operand has a1 or b1 = 0.0).
    real = _arith(r, operator.sub, _arith(r, operator.mul, a0, b0), _arith(r, operator.mul, a1, b1))
    imag = _arith(r, operator.add, _arith(r, operator.mul, a0, b1), _arith(r, operator.mul, a1, b0))
    return _pair(r, node, real, imag), True


def _pair(r: _Rewriter, node: Any, real: Any, imag: Any) -> Any:
    """The pair of two parts, broadcast to each other (a part that is a number has no shape to stack)."""
    import torch
    import torch.fx

    if not (isinstance(real, torch.fx.Node) and isinstance(imag, torch.fx.Node)):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) has a part that is a number")
    return r.fn(torch.stack, r.fn(torch.broadcast_tensors, real, imag), -1)


def _add_sub(op: Callable[[Any, Any], Any]) -> Callable[[_Rewriter, Any], tuple[Any, bool]]:
    def handler(r: _Rewriter, node: Any) -> tuple[Any, bool]:
        (a0, a1), (b0, b1), alpha = _binary(r, node)
        if alpha != 1:
            raise _NoPairRewrite(f"node {node.name} ({_name(node)}) with alpha={alpha!r}")
        return _pair(r, node, _arith(r, op, a0, b0), _arith(r, op, a1, b1)), True

    return handler


def _neg(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    return r.fn(operator.neg, r.new(_source(node))), True


def _conj(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    pair = r.new(_source(node))
    return r.stack(r.part(pair, 0), r.fn(operator.neg, r.part(pair, 1))), True


def _same(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    return r.new(_source(node)), True


def _to(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    source = _source(node)
    before, after = r.value(source), r.value(node)
    if before is None or after is None or before.dtype != after.dtype or before.shape != after.shape:
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) changes a complex value's dtype")
    return r.new(source), True


def _reshape(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    return r.graph.call_method("reshape", (r.new(_source(node)), *r.new(_sizes(node)), 2)), True


def _expand(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    return r.graph.call_method("expand", (r.new(_source(node)), *r.new(_sizes(node)), 2)), True


def _permute(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    dims = [_dim(r, node, d) for d in _sizes(node)]
    return r.graph.call_method("permute", (r.new(_source(node)), *dims, len(dims))), True


def _transpose(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    a, b = _args(node, "dim0", "dim1")
    return r.graph.call_method("transpose", (r.new(_source(node)), _dim(r, node, a), _dim(r, node, b))), True


def _unsqueeze(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    (d,) = _args(node, "dim")
    return r.graph.call_method("unsqueeze", (r.new(_source(node)), _dim(r, node, d, extra=1))), True


def _squeeze(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    dims = _args(node, "dim", defaults=(None,))[0]
    source = r.new(_source(node))
    if dims is None:
        # The pair's last dim has size 2, so squeezing every size-1 dim leaves it.
        return r.graph.call_method("squeeze", (source,)), True
    if isinstance(dims, (list, tuple)):
        return r.graph.call_method("squeeze", (source, tuple(_dim(r, node, d) for d in dims))), True
    return r.graph.call_method("squeeze", (source, _dim(r, node, dims))), True


def _flatten(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    start, end = _args(node, "start_dim", "end_dim", defaults=(0, -1))
    rank = r.rank(_source(node))
    if rank == 0:
        raise _NoPairRewrite(f"node {node.name} (flatten) of a complex scalar")
    return r.graph.call_method("flatten", (r.new(_source(node)), _dim(r, node, start), _dim(r, node, end))), True


def _select(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    d, index = _args(node, "dim", "index")
    return r.graph.call_method("select", (r.new(_source(node)), _dim(r, node, d), r.new(index))), True


def _narrow(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    d, start, length = _args(node, "dim", "start", "length")
    return r.graph.call_method("narrow", (r.new(_source(node)), _dim(r, node, d), r.new(start), r.new(length))), True


def _getitem(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    import torch.fx

    source, index = node.args[0], node.args[1]
    if not r.is_pair(source):
        raise _NoPairRewrite(f"node {node.name} takes an item of a sequence of complex values")
    items = list(index) if isinstance(index, tuple) else [index]
    for item in items:
        if isinstance(item, torch.fx.Node):
            value = r.value(item)
            if value is None or getattr(value, "is_complex", lambda: False)():
                raise _NoPairRewrite(f"node {node.name} indexes a complex value by {item.name}")
        elif not (item is None or item is Ellipsis or isinstance(item, (int, slice))):
            raise _NoPairRewrite(f"node {node.name} indexes a complex value by {item!r}")
    if Ellipsis in items:
        # After '...' the index names the trailing dims: keep the pair's last dim out of its reach.
        items.append(slice(None))
    return r.fn(operator.getitem, r.new(source), tuple(r.new(items))), True


def _cat(r: _Rewriter, node: Any, *, stack: bool) -> tuple[Any, bool]:
    import torch

    tensors = node.args[0] if node.args else node.kwargs["tensors"]
    d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not all(r.is_pair(t) for t in tensors):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) joins complex and real values")
    rank = r.rank(tensors[0]) + (1 if stack else 0)
    if not isinstance(d, int):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) takes a dim that is not a constant")
    d = d + rank if d < 0 else d
    return r.fn(torch.stack if stack else torch.cat, [r.new(t) for t in tensors], d), True


def _constant(r: _Rewriter, tensor: torch.Tensor, hint: str) -> Any:
    """A constant of the rewritten graph (a buffer of its root module, read by get_attr)."""
    name = f"_qnnx_{hint}_{r._consts}"
    r._consts += 1
    r.root.register_buffer(name, tensor)
    return r.graph.get_attr(name)


def _dft_step(r: _Rewriter, node: Any, x: Any, is_pair: bool, step: DftStep, shape: list[int]) -> Any:
    """One 1-D transform along ``step.dim`` of the new-graph value ``x`` (a real tensor of ``shape``, or the real
    pair of a complex one) as one 2-D MatMul with a constant matrix. Updates ``shape`` to the output's.

    Along the last axis, the rows of the product are every other position and its columns the axis with the
    parts interleaved, as the pair lays them out. Along another axis the value is seen as ``[before, size, after]``
    (the parts merged into ``after``) and transposed to put the axis last; its columns are then the parts, then the
    positions, and the matrix is ordered the same way. Only rank-3 Transposes: with the pair's rank-4+ Transpose
    before the MatMul and a Reshape to ``[..., m, 2]`` after it, QNN HTP failed to finalize the graph
    (QNN_COMMON_ERROR_MEM_ALLOC, fft2 of a [5, 6, 7] tensor, whatever the matrix's values).
    """
    import math

    import torch

    size = shape[step.dim]
    length = step.in_length(size)
    out = step.out_length(size)
    if max(length, out) > MAX_DFT_LENGTH:
        raise _NoPairRewrite(
            f"node {node.name} ({_name(node)}) transforms {length} positions into {out}; lengths up to "
            f"{MAX_DFT_LENGTH} are written as a MatMul with a constant matrix"
        )
    if length < 1 or out < 1:
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) transforms {length} positions into {out}")
    try:
        matrix = dft_matrix(step, length, complex_in=is_pair)
    except (RuntimeError, ValueError) as exc:  # what PyTorch itself refuses (rfft of a complex value...)
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}): {exc}") from exc
    parts_in, parts_out = (2 if is_pair else 1), (2 if step.complex_out else 1)
    before = shape[: step.dim]
    after = math.prod(shape[step.dim + 1 :])
    shape[step.dim] = out
    final = (*shape, *((2,) if step.complex_out else ()))
    if after == 1 and not is_pair:
        # A real value's last axis (or one followed by size-1 axes only): the output's parts interleaved.
        if length != size:
            x = r.graph.call_method("narrow", (x, step.dim, 0, length))
        rows = r.graph.call_method("reshape", (x, -1, length * parts_in))
        product = r.fn(torch.mm, rows, _constant(r, matrix, "dft"))
        return r.graph.call_method("reshape", (product, *final))
    matrix = parts_first(matrix, length, is_pair, step.complex_out)
    lead = math.prod(before)
    x = r.graph.call_method("reshape", (x, lead, size, after * parts_in))
    if length != size:
        x = r.graph.call_method("narrow", (x, 1, 0, length))
    # [lead, length, after * parts] -> [lead * after, parts * length]: rows (before, after), columns (part, position)
    rows = r.graph.call_method("reshape", (r.fn(torch.transpose, x, 1, 2), lead * after, parts_in * length))
    product = r.fn(torch.mm, rows, _constant(r, matrix, "dft"))
    # [lead * after, parts * out] -> [lead, after * parts, out] -> [lead, out, after * parts]
    product = r.graph.call_method("reshape", (product, lead, after * parts_out, out))
    return r.graph.call_method("reshape", (r.fn(torch.transpose, product, 1, 2), *final))


def _dft(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    """A ``torch.fft`` transform as MatMuls with constant matrices (``_dft.py``): one for the whole call when it
    transforms the trailing axes (up to ``MAX_DFT_LENGTH`` positions in and out), else one per axis."""
    import math

    import torch

    source = _source(node)
    value = r.value(source)
    if value is None or not hasattr(value, "shape"):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) has no recorded input shape")
    is_pair = r.is_pair(source)
    if str(value.dtype) != ("torch.complex64" if is_pair else "torch.float32"):
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) of a {value.dtype} tensor (float32, complex64 only)")
    shape = [int(s) for s in value.shape]
    try:
        call = parse_dft(_name(node), len(shape), node.args[1:], dict(node.kwargs))
    except ValueError as exc:
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}): {exc}") from exc
    out_value = r.value(node)
    out_shape = [int(s) for s in out_value.shape]
    first = min(call.axes)
    block_in, block_out = math.prod(shape[first:]), math.prod(out_shape[first:])
    x = r.new(source)
    if sorted(call.axes) == list(range(first, len(shape))) and max(block_in, block_out) <= MAX_DFT_LENGTH:
        # The whole call is one product: no Transpose at all.
        try:
            matrix = call.block_matrix(shape[first:], complex_in=is_pair)
        except (RuntimeError, ValueError) as exc:  # what PyTorch itself refuses (rfft of a complex value...)
            raise _NoPairRewrite(f"node {node.name} ({_name(node)}): {exc}") from exc
        rows = r.graph.call_method("reshape", (x, -1, matrix.shape[0]))
        product = r.fn(torch.mm, rows, _constant(r, matrix, "dft"))
        complex_out = out_value.is_complex()
        return r.graph.call_method("reshape", (product, *out_shape, *((2,) if complex_out else ()))), complex_out
    for step in call.steps():
        x = _dft_step(r, node, x, is_pair, step, shape)
        is_pair = step.complex_out
    return x, is_pair


_STFT_ARGS = (
    "n_fft",
    "hop_length",
    "win_length",
    "window",
    "center",
    "pad_mode",
    "normalized",
    "onesided",
    "return_complex",
)


def _stft(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    """``torch.stft(..., return_complex=True)`` of a real float32 signal: its frames (centre padding folded into
    one Gather of constant positions) times the window, then one MatMul with the (half) spectrum's matrix."""
    import torch
    import torch.fx

    source = _source(node)
    value = r.value(source)
    got: dict[str, Any] = dict(zip(_STFT_ARGS, node.args[1:], strict=False))
    got.update({k: v for k, v in node.kwargs.items() if k in _STFT_ARGS})
    n_fft: Any = got.get("n_fft")
    hop: Any = got.get("hop_length") or (n_fft // 4 if isinstance(n_fft, int) else None)
    win_length: Any = got.get("win_length") or n_fft
    window = got.get("window")
    center, pad_mode = got.get("center", True), got.get("pad_mode", "reflect")
    normalized, onesided = got.get("normalized", False), got.get("onesided")
    if (
        value is None
        or r.is_pair(source)
        or str(value.dtype) != "torch.float32"
        or value.dim() not in (1, 2)
        or not all(isinstance(v, int) and v > 0 for v in (n_fft, hop, win_length))
        or not isinstance(center, bool)
        or not isinstance(normalized, bool)
        or (window is not None and not isinstance(window, torch.fx.Node))
        or got.get("return_complex") is not True
    ):
        raise _NoPairRewrite(f"node {node.name} (stft) with arguments {got!r} of {getattr(value, 'dtype', '?')}")
    window_value = r.value(window) if window is not None else None
    if window_value is not None and (window_value.is_complex() or str(window_value.dtype) != "torch.float32"):
        raise _NoPairRewrite(f"node {node.name} (stft) with a {window_value.dtype} window (float32 only)")
    length = int(value.shape[-1])
    pad = n_fft // 2 if center else 0
    if win_length > n_fft or length + 2 * pad < n_fft:
        raise _NoPairRewrite(f"node {node.name} (stft) with win_length {win_length}, n_fft {n_fft}, signal {length}")
    spectrum = DftStep("rfft" if onesided in (None, True) else "fft", 0, None, "ortho" if normalized else "backward")
    if spectrum.out_length(n_fft) > MAX_DFT_LENGTH or n_fft > MAX_DFT_LENGTH:
        raise _NoPairRewrite(f"node {node.name} (stft) with n_fft {n_fft} (up to {MAX_DFT_LENGTH})")
    try:
        positions = frame_positions(length, n_fft, hop, pad, pad_mode if center else "constant")
    except ValueError as exc:
        raise _NoPairRewrite(f"node {node.name} (stft): {exc}") from exc
    x = r.new(source)
    if positions is None:  # zeros around the signal, then plain frames
        if pad:
            x = r.fn(torch.nn.functional.pad, x, (pad, pad))
        positions = frame_positions(length + 2 * pad, n_fft, hop, 0, "replicate")
    assert positions is not None
    frames = len(positions)
    index = _constant(r, torch.tensor([p for frame in positions for p in frame], dtype=torch.int64), "frames")
    x = r.fn(torch.unflatten, r.fn(torch.index_select, x, -1, index), -1, (frames, n_fft))
    left = (n_fft - win_length) // 2
    if window is not None:
        w = r.new(window)
        if win_length != n_fft:
            w = r.fn(torch.nn.functional.pad, w, (left, n_fft - win_length - left))
        x = r.fn(torch.mul, x, w)
    elif win_length != n_fft:
        ones = torch.zeros(n_fft)
        ones[left : left + win_length] = 1.0
        x = r.fn(torch.mul, x, _constant(r, ones, "window"))
    shape = [*value.shape[:-1], frames, n_fft]
    step = DftStep(spectrum.kind, len(shape) - 1, None, spectrum.norm)
    x = _dft_step(r, node, x, False, step, shape)
    # [..., frames, freqs, 2] -> PyTorch's [..., freqs, frames, 2]
    return r.fn(torch.transpose, x, -3, -2), True


def _cfloat(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    """``x.cfloat()`` or ``x.to(torch.complex64)`` of a real tensor: the pair ``(x, 0)``."""
    import torch

    source = _source(node)
    if r.is_pair(source):
        return _to(r, node)
    if str(r.value(node).dtype) != "torch.complex64":
        raise _NoPairRewrite(f"node {node.name} ({_name(node)}) makes a {r.value(node).dtype} value")
    real = r.graph.call_method("to", (r.new(source), torch.float32))
    return _pair(r, node, real, r.fn(torch.zeros_like, real)), True


def _to_any(r: _Rewriter, node: Any) -> tuple[Any, bool]:
    """``.to``: a complex value kept as it is, or a real tensor made complex64."""
    if r.is_pair(_source(node)):
        return _to(r, node)
    return _cfloat(r, node)


_TABLE: dict[str, Callable[[_Rewriter, Any], tuple[Any, bool]]] = {
    **dict.fromkeys(DFT_OPS, _dft),
    "stft": _stft,
    "cfloat": _cfloat,
    "view_as_complex": _view_as_complex,
    "view_as_real": _view_as_real,
    "real": _real_part(0),
    "imag": _real_part(1),
    "polar": _polar,
    "complex": _complex,
    "mul": _mul,
    "__mul__": _mul,
    "__rmul__": _mul,
    "add": _add_sub(operator.add),
    "__add__": _add_sub(operator.add),
    "sub": _add_sub(operator.sub),
    "__sub__": _add_sub(operator.sub),
    "neg": _neg,
    "__neg__": _neg,
    "conj": _conj,
    "conj_physical": _conj,
    "resolve_conj": _same,
    "resolve_neg": _same,
    "contiguous": _unary_view("contiguous"),
    "clone": _unary_view("clone"),
    "detach": _unary_view("detach"),
    "to": _to_any,
    "reshape": _reshape,
    "view": _reshape,
    "expand": _expand,
    "permute": _permute,
    "transpose": _transpose,
    "swapaxes": _transpose,
    "swapdims": _transpose,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "flatten": _flatten,
    "select": _select,
    "narrow": _narrow,
    "__getitem__": _getitem,
    "getitem": _getitem,
    "cat": lambda r, n: _cat(r, n, stack=False),
    "concat": lambda r, n: _cat(r, n, stack=False),
    "stack": lambda r, n: _cat(r, n, stack=True),
}


def refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why the complex values of ``gm`` cannot be carried as real pairs (a sentence naming the node), or None
    when :func:`as_real_pairs` rewrites them all. Builds the rewritten graph; runs nothing."""
    try:
        _Rewriter(gm, example_inputs).run()
    except _NoPairRewrite as exc:
        return str(exc)
    return None


def as_real_pairs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """A copy of ``gm`` whose complex values are carried as real pairs, and its example inputs.

    The copy takes the same arguments, except that a complex argument (a parameter or buffer) is passed as
    ``torch.view_as_real`` of it: the returned inputs are ``example_inputs`` with those replaced (views, which
    share the originals' storage). ``gm`` is not modified.

    Raises:
        ValueError: An op on a complex value has no real-pair rewrite, or the graph returns a complex value
            (:func:`refusal` says which, without raising).
    """
    import torch

    rewriter = _Rewriter(gm, example_inputs)
    try:
        rewritten = rewriter.run()
    except _NoPairRewrite as exc:
        raise ValueError(f"the graph's complex values cannot be carried as real pairs: {exc}") from exc
    inputs = list(example_inputs)
    for i in rewriter.complex_positions:
        inputs[i] = torch.view_as_real(inputs[i].resolve_conj())
    return rewritten, inputs
