"""The rewriter that carries a Dynamo graph's complex values as (real, imaginary) pairs (private): the graph walk,
the new graph and the helpers the op handlers share. ``_complex`` holds the handlers, their table and the public
entry points; ``_complex_fft`` the Fourier transforms."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = [
    "COMPLEX_OUTPUTS",
    "Handler",
    "NoPairRewrite",
    "Rewriter",
    "complex_values",
    "is_complex",
    "make_pair",
    "meta_value",
    "node_args",
    "node_name",
    "pair_dim",
    "sizes_of",
    "source_of",
    "two_args",
]

COMPLEX_OUTPUTS = "qnnx_complex_outputs"
"""Key of the rewritten graph module's ``meta``: the positions of its output tuple that are complex values returned
as their real pairs (``[..., 2]``), for the caller to rebuild with ``torch.view_as_complex``."""

Handler: TypeAlias = "Callable[[Rewriter, Any], tuple[Any, bool]]"
"""An op's rewrite: takes the rewriter and the old node, returns (the new node, whether it holds a pair)."""


class NoPairRewrite(Exception):
    """A complex value the rewrite cannot carry as a real pair (the message says which and why)."""


def meta_value(node: Any, placeholders: dict[Any, Any]) -> Any:
    if node in placeholders:
        return placeholders[node]
    return node.meta.get("example_value", node.meta.get("val"))


def is_complex(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(is_complex(v) for v in value)
    return False


def complex_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Names of the nodes of ``gm`` whose value is (or holds) a complex tensor, in graph order."""
    placeholders = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs, strict=False))
    return [n.name for n in gm.graph.nodes if n.op != "output" and is_complex(meta_value(n, placeholders))]


_REAL_OF = {"torch.complex64": "torch.float32", "torch.complex128": "torch.float64"}


def node_name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "") or str(target)


class Rewriter:
    """Copies a graph into a new one, each complex value as its real pair (see the module's docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], table: Mapping[str, Handler]) -> None:
        self._table = table
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
        return meta_value(node, self.placeholders)

    def rank(self, node: Any) -> int:
        value = self.value(node)
        if value is None or not hasattr(value, "dim"):
            raise NoPairRewrite(f"node {node.name} has no recorded shape")
        return int(value.dim())

    def real_dtype(self, node: Any) -> Any:
        import torch

        value = self.value(node)
        dtype = getattr(value, "dtype", None)
        if str(dtype) not in _REAL_OF:
            raise NoPairRewrite(f"node {node.name} is {dtype}; only complex64 and complex128 are carried as pairs")
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

    def constant(self, tensor: torch.Tensor, hint: str) -> Any:
        """A constant of the rewritten graph (a buffer of its root module, read by get_attr)."""
        name = f"_qnnx_{hint}_{self._consts}"
        self._consts += 1
        self.root.register_buffer(name, tensor)
        return self.graph.get_attr(name)

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
                if is_complex(value):
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
            complex_out = is_complex(self.value(node))
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
                raise NoPairRewrite(
                    f"node {node.name} ({node_name(node)}) changes between complex and real unexpectedly"
                )
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
                    raise NoPairRewrite(f"the graph returns the {dtype} value {element.name} (complex64 only)")
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
                raise NoPairRewrite(f"the graph returns the complex value {bad[0]} inside a container")
        self.graph.output(torch.fx.node.map_arg(elements, lambda n: returned.get(n, self.env[n])))

    def _attr(self, node: Any) -> Any:
        import torch

        target = str(node.target)
        value = self.gm
        for part in target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor) and value.is_complex():
            if str(value.dtype) not in _REAL_OF:
                raise NoPairRewrite(f"constant {node.name} is {value.dtype}; only complex64 and complex128 are carried")
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
        return node_name(node) in ("view_as_complex", "polar", "complex")

    # -- the table ------------------------------------------------------------------------------------------

    def _rewrite(self, node: Any) -> tuple[Any, bool]:
        name = node_name(node)
        if node.op == "call_function" and node.target is operator.getitem:
            name = "__getitem__"
        if node.op == "call_function" and node.target is getattr:
            name = str(node.args[1])
        handler = self._table.get(name)
        if handler is None or node.op not in ("call_function", "call_method"):
            raise NoPairRewrite(f"node {node.name} ({name}) acts on a complex value and has no real-pair rewrite")
        if node.kwargs.get("out") is not None or (name.endswith("_") and not name.endswith("__")):
            raise NoPairRewrite(f"node {node.name} ({name}) writes a complex value in place")
        return handler(self, node)


# Each handler takes the rewriter and the old node and returns (new node, whether it holds a pair). Arguments are
# read from the old node; ``r.new`` maps them into the new graph.


def node_args(node: Any, *names: str, defaults: Sequence[Any] = ()) -> list[Any]:
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
            raise NoPairRewrite(f"node {node.name} ({node_name(node)}) has no argument {key}")
    return out


def two_args(node: Any, first: str, second: str) -> tuple[Any, Any]:
    """The node's first two arguments, by position or keyword."""
    args = [*node.args, None, None]
    return node.kwargs.get(first, args[0]), node.kwargs.get(second, args[1])


def source_of(node: Any) -> Any:
    return node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))


def pair_dim(r: Rewriter, node: Any, dim: Any, extra: int = 0) -> int:
    """A dim of complex value ``node`` made non-negative, so that it names the same dim of the pair."""
    if not isinstance(dim, int):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) takes a dim that is not a constant: {dim!r}")
    return dim + r.rank(source_of(node)) + extra if dim < 0 else dim


def sizes_of(node: Any) -> list[Any]:
    rest = list(node.args[1:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = list(rest[0])
    if not rest:
        rest = list(node.kwargs.get("shape", node.kwargs.get("size", ())))
    import torch.fx

    if not rest or not all(isinstance(s, (int, torch.fx.Node)) for s in rest):
        # view(dtype) reinterprets the bytes: not a shape.
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) takes {rest!r}, not sizes")
    return rest


def make_pair(r: Rewriter, node: Any, real: Any, imag: Any) -> Any:
    """The pair of two parts, broadcast to each other (a part that is a number has no shape to stack)."""
    import torch
    import torch.fx

    if not (isinstance(real, torch.fx.Node) and isinstance(imag, torch.fx.Node)):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) has a part that is a number")
    return r.fn(torch.stack, r.fn(torch.broadcast_tensors, real, imag), -1)
