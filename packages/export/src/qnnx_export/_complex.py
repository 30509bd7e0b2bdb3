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
)

if TYPE_CHECKING:
    import torch
    import torch.fx

from qnnx_export._complex_core import (
    COMPLEX_OUTPUTS,
    NoPairRewrite,
    Rewriter,
    complex_values,
    make_pair,
    node_args,
    node_name,
    pair_dim,
    sizes_of,
    source_of,
    two_args,
)
from qnnx_export._complex_fft import dft, stft

__all__ = ["COMPLEX_OUTPUTS", "as_real_pairs", "complex_values", "refusal"]


def _unary_view(method: str) -> Callable[[Rewriter, Any], tuple[Any, bool]]:
    """Ops that act on the leading dims only: the same op on the pair."""

    def handler(r: Rewriter, node: Any) -> tuple[Any, bool]:
        return r.graph.call_method(method, (r.new(source_of(node)),)), True

    return handler


def _view_as_complex(r: Rewriter, node: Any) -> tuple[Any, bool]:
    x = source_of(node)
    value = r.value(x)
    if value is None or str(value.dtype) not in ("torch.float32", "torch.float64"):
        raise NoPairRewrite(f"node {node.name} (view_as_complex) of a {getattr(value, 'dtype', '?')} tensor")
    return r.new(x), True


def _view_as_real(r: Rewriter, node: Any) -> tuple[Any, bool]:
    return r.new(source_of(node)), False


def _real_part(index: int) -> Callable[[Rewriter, Any], tuple[Any, bool]]:
    def handler(r: Rewriter, node: Any) -> tuple[Any, bool]:
        source = source_of(node)
        if not r.is_pair(source):
            raise NoPairRewrite(f"node {node.name} ({node_name(node)}) of a real value")
        return r.part(r.new(source), index), False

    return handler


def _polar(r: Rewriter, node: Any) -> tuple[Any, bool]:
    import torch

    magnitude, angle = two_args(node, "abs", "angle")
    # torch.polar computes abs * cos(angle), abs * sin(angle) (c10::polar; its cosine and sine are libm's, so
    # they may differ from torch.cos and torch.sin in the last bit).
    m, a = r.new(magnitude), r.new(angle)
    return make_pair(r, node, r.fn(torch.mul, m, r.fn(torch.cos, a)), r.fn(torch.mul, m, r.fn(torch.sin, a))), True


def _complex(r: Rewriter, node: Any) -> tuple[Any, bool]:
    real, imag = two_args(node, "real", "imag")
    return make_pair(r, node, r.new(real), r.new(imag)), True


def _operand(r: Rewriter, arg: Any, dtype: Any) -> tuple[Any, Any]:
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
            raise NoPairRewrite(f"operand {arg.name} of complex arithmetic is not a tensor")
        return r.cast(r.new(arg), arg, dtype), 0.0
    if isinstance(arg, complex):
        return arg.real, arg.imag
    if isinstance(arg, (bool, int, float)):
        return float(arg), 0.0
    raise NoPairRewrite(f"operand {arg!r} of complex arithmetic")


def _binary(r: Rewriter, node: Any) -> tuple[Any, Any, Any]:
    a, b = two_args(node, "input", "other")
    dtype = r.real_dtype(node)
    return _operand(r, a, dtype), _operand(r, b, dtype), node.kwargs.get("alpha", 1)


def _arith(r: Rewriter, op: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    """``op(x, y)`` as a node of the new graph, or computed here when both are numbers."""
    import torch.fx

    if isinstance(x, torch.fx.Node) or isinstance(y, torch.fx.Node):
        return r.fn(op, x, y)
    return op(x, y)


def _mul(r: Rewriter, node: Any) -> tuple[Any, bool]:
    (a0, a1), (b0, b1), _ = _binary(r, node)
    # (a0 + a1 i)(b0 + b1 i) = (a0 b0 - a1 b1) + (a0 b1 + a1 b0) i, as c10::complex and ATen's vectorized
    # complex product compute it (a real operand has a1 or b1 = 0.0).
    real = _arith(r, operator.sub, _arith(r, operator.mul, a0, b0), _arith(r, operator.mul, a1, b1))
    imag = _arith(r, operator.add, _arith(r, operator.mul, a0, b1), _arith(r, operator.mul, a1, b0))
    return make_pair(r, node, real, imag), True


def _add_sub(op: Callable[[Any, Any], Any]) -> Callable[[Rewriter, Any], tuple[Any, bool]]:
    def handler(r: Rewriter, node: Any) -> tuple[Any, bool]:
        (a0, a1), (b0, b1), alpha = _binary(r, node)
        if alpha != 1:
            raise NoPairRewrite(f"node {node.name} ({node_name(node)}) with alpha={alpha!r}")
        return make_pair(r, node, _arith(r, op, a0, b0), _arith(r, op, a1, b1)), True

    return handler


def _neg(r: Rewriter, node: Any) -> tuple[Any, bool]:
    return r.fn(operator.neg, r.new(source_of(node))), True


def _conj(r: Rewriter, node: Any) -> tuple[Any, bool]:
    pair = r.new(source_of(node))
    return r.stack(r.part(pair, 0), r.fn(operator.neg, r.part(pair, 1))), True


def _same(r: Rewriter, node: Any) -> tuple[Any, bool]:
    return r.new(source_of(node)), True


def _to(r: Rewriter, node: Any) -> tuple[Any, bool]:
    source = source_of(node)
    before, after = r.value(source), r.value(node)
    if before is None or after is None or before.dtype != after.dtype or before.shape != after.shape:
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) changes a complex value's dtype")
    return r.new(source), True


def _reshape(r: Rewriter, node: Any) -> tuple[Any, bool]:
    return r.graph.call_method("reshape", (r.new(source_of(node)), *r.new(sizes_of(node)), 2)), True


def _expand(r: Rewriter, node: Any) -> tuple[Any, bool]:
    return r.graph.call_method("expand", (r.new(source_of(node)), *r.new(sizes_of(node)), 2)), True


def _permute(r: Rewriter, node: Any) -> tuple[Any, bool]:
    dims = [pair_dim(r, node, d) for d in sizes_of(node)]
    return r.graph.call_method("permute", (r.new(source_of(node)), *dims, len(dims))), True


def _transpose(r: Rewriter, node: Any) -> tuple[Any, bool]:
    a, b = node_args(node, "dim0", "dim1")
    return r.graph.call_method("transpose", (r.new(source_of(node)), pair_dim(r, node, a), pair_dim(r, node, b))), True


def _unsqueeze(r: Rewriter, node: Any) -> tuple[Any, bool]:
    (d,) = node_args(node, "dim")
    return r.graph.call_method("unsqueeze", (r.new(source_of(node)), pair_dim(r, node, d, extra=1))), True


def _squeeze(r: Rewriter, node: Any) -> tuple[Any, bool]:
    dims = node_args(node, "dim", defaults=(None,))[0]
    source = r.new(source_of(node))
    if dims is None:
        # The pair's last dim has size 2, so squeezing every size-1 dim leaves it.
        return r.graph.call_method("squeeze", (source,)), True
    if isinstance(dims, (list, tuple)):
        return r.graph.call_method("squeeze", (source, tuple(pair_dim(r, node, d) for d in dims))), True
    return r.graph.call_method("squeeze", (source, pair_dim(r, node, dims))), True


def _flatten(r: Rewriter, node: Any) -> tuple[Any, bool]:
    start, end = node_args(node, "start_dim", "end_dim", defaults=(0, -1))
    rank = r.rank(source_of(node))
    if rank == 0:
        raise NoPairRewrite(f"node {node.name} (flatten) of a complex scalar")
    return r.graph.call_method(
        "flatten", (r.new(source_of(node)), pair_dim(r, node, start), pair_dim(r, node, end))
    ), True


def _select(r: Rewriter, node: Any) -> tuple[Any, bool]:
    d, index = node_args(node, "dim", "index")
    return r.graph.call_method("select", (r.new(source_of(node)), pair_dim(r, node, d), r.new(index))), True


def _narrow(r: Rewriter, node: Any) -> tuple[Any, bool]:
    d, start, length = node_args(node, "dim", "start", "length")
    return r.graph.call_method(
        "narrow", (r.new(source_of(node)), pair_dim(r, node, d), r.new(start), r.new(length))
    ), True


def _getitem(r: Rewriter, node: Any) -> tuple[Any, bool]:
    import torch.fx

    source, index = node.args[0], node.args[1]
    if not r.is_pair(source):
        raise NoPairRewrite(f"node {node.name} takes an item of a sequence of complex values")
    items = list(index) if isinstance(index, tuple) else [index]
    for item in items:
        if isinstance(item, torch.fx.Node):
            value = r.value(item)
            if value is None or getattr(value, "is_complex", lambda: False)():
                raise NoPairRewrite(f"node {node.name} indexes a complex value by {item.name}")
        elif not (item is None or item is Ellipsis or isinstance(item, (int, slice))):
            raise NoPairRewrite(f"node {node.name} indexes a complex value by {item!r}")
    if Ellipsis in items:
        # After '...' the index names the trailing dims: keep the pair's last dim out of its reach.
        items.append(slice(None))
    return r.fn(operator.getitem, r.new(source), tuple(r.new(items))), True


def _cat(r: Rewriter, node: Any, *, stack: bool) -> tuple[Any, bool]:
    import torch

    tensors = node.args[0] if node.args else node.kwargs["tensors"]
    d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not all(r.is_pair(t) for t in tensors):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) joins complex and real values")
    rank = r.rank(tensors[0]) + (1 if stack else 0)
    if not isinstance(d, int):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) takes a dim that is not a constant")
    d = d + rank if d < 0 else d
    return r.fn(torch.stack if stack else torch.cat, [r.new(t) for t in tensors], d), True


def _cfloat(r: Rewriter, node: Any) -> tuple[Any, bool]:
    """``x.cfloat()`` or ``x.to(torch.complex64)`` of a real tensor: the pair ``(x, 0)``."""
    import torch

    source = source_of(node)
    if r.is_pair(source):
        return _to(r, node)
    if str(r.value(node).dtype) != "torch.complex64":
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) makes a {r.value(node).dtype} value")
    real = r.graph.call_method("to", (r.new(source), torch.float32))
    return make_pair(r, node, real, r.fn(torch.zeros_like, real)), True


def _to_any(r: Rewriter, node: Any) -> tuple[Any, bool]:
    """``.to``: a complex value kept as it is, or a real tensor made complex64."""
    if r.is_pair(source_of(node)):
        return _to(r, node)
    return _cfloat(r, node)


_TABLE: dict[str, Callable[[Rewriter, Any], tuple[Any, bool]]] = {
    **dict.fromkeys(DFT_OPS, dft),
    "stft": stft,
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
        Rewriter(gm, example_inputs, _TABLE).run()
    except NoPairRewrite as exc:
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

    rewriter = Rewriter(gm, example_inputs, _TABLE)
    try:
        rewritten = rewriter.run()
    except NoPairRewrite as exc:
        raise ValueError(f"the graph's complex values cannot be carried as real pairs: {exc}") from exc
    inputs = list(example_inputs)
    for i in rewriter.complex_positions:
        inputs[i] = torch.view_as_real(inputs[i].resolve_conj())
    return rewritten, inputs
