"""The direct translator: ATen graph -> ONNX, without torch.export and torch.onnx.

``torch.onnx.export`` re-traces the graph with torch.export, runs the decompositions, builds its
ATen->ONNX registry (about 1 s, once per process) and optimizes the result: 1.8-2.9 s for the small
benchmark models, most of a cold first call. The graphs Dynamo hands a backend are already traced
and, once specialized, have static shapes. So for graphs made only of the ops below we trace the
Dynamo graph to ATen with fake tensors (``make_fx``, 20-230 ms) and write each ATen node as the
ONNX nodes that compute the same thing, with every shape known. Anything outside the table (an op,
a dtype, an argument value) makes :func:`translate` raise :class:`Declined`, and the caller uses
torch.onnx instead: the fast path never guesses.

Values that depend only on parameters, buffers and constants are computed here with PyTorch on the
real tensors (constant folding), so weight transposes, slices of fused projections and position ids
become initializers, as torch.onnx's optimizer would make them. BatchNorm after a convolution is
folded into the convolution's weights (in float64) for the same reason.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch
    import torch.fx

__all__ = ["Declined", "supported_ops", "trace_aten", "translate"]

log = logging.getLogger(__name__)

# Folded constants bigger than this are refused (the graph then goes to torch.onnx), so that folding
# never materializes a huge tensor (an expand of a parameter, say) that a runtime op would compute.
_MAX_FOLD_BYTES = 64 * 1024 * 1024


class Declined(Exception):
    """The fast path cannot translate this graph faithfully; the message says why."""


def _aten() -> Any:
    import torch

    return torch.ops.aten


def trace_aten(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    """Trace ``gm`` to an ATen graph with fake tensors; its outputs are the nodes ``outputs`` of ``gm``.

    Fused fast-path kernels are swapped for their plain math first (as the torch.onnx path does), and
    scaled-dot-product attention is decomposed to matmuls and a safe softmax.
    """
    import torch
    import torch.fx
    import torch.fx.traceback as fx_traceback
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from qnnx_export._decompose import FUSED_REPLACEMENTS

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if new.op == "call_function" and new.target in FUSED_REPLACEMENTS:
            new.target = FUSED_REPLACEMENTS[new.target]
        env[node] = new
    graph.output(tuple(env[n] for n in outputs))
    lifted = torch.fx.GraphModule(gm, graph)
    decompositions = get_decompositions(
        [
            aten._scaled_dot_product_flash_attention_for_cpu,
            aten._scaled_dot_product_efficient_attention,
            aten._native_batch_norm_legit_no_training,
        ]
    )
    interpreter = torch.fx.Interpreter(lifted)

    def run(*args: Any) -> Any:
        # The interpreter sets each node's meta as the current one, so the ATen nodes keep
        # nn_module_stack (where in the model they come from).
        return interpreter.run(*args)

    # Our own fake mode, outside any Dynamo tracing context: inside a backend call make_fx would
    # otherwise reuse Dynamo's fake mode and add guards to its shape environment.
    # functionalize: in-place ops on intermediates (nn.ReLU(inplace=True)) become their pure forms.
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=False, static_shapes=True)
    with tracing(None), fake_mode, torch.no_grad(), fx_traceback.preserve_node_meta():
        fake_args = [fake_mode.from_tensor(a, static_shapes=True) for a in example_inputs]
        traced = make_fx(
            torch.func.functionalize(run, remove="mutations"),
            decomposition_table=decompositions,
            tracing_mode="real",
        )(*fake_args)
    traced.graph.eliminate_dead_code()
    return traced


# --- dtype helpers -----------------------------------------------------------------------------


def _ir_dtype(dtype: torch.dtype) -> ir.DataType:
    from onnx_ir.tensor_adapters import from_torch_dtype

    try:
        return from_torch_dtype(dtype)
    except TypeError as exc:
        raise Declined(f"dtype {dtype} has no ONNX translation here") from exc


def _val(x: Any) -> Any:
    """The fake tensor (or Python scalar) that stands for an FX argument."""
    import torch.fx

    if isinstance(x, torch.fx.Node):
        return x.meta.get("val")
    return x


class _Translator:
    """Walks an ATen graph in order, writing ONNX nodes into an onnx_ir graph."""

    def __init__(self, traced: torch.fx.GraphModule, constants: dict[int, torch.Tensor], opset: int) -> None:

        self.traced = traced
        self.constants = constants  # placeholder position -> real tensor (parameters, buffers)
        self.opset = opset
        self.nodes: list[ir.Node] = []
        self.initializers: dict[str, ir.Value] = {}
        # (data_ptr, layout) -> (the tensor, its initializer). The tensor is kept so that its memory is
        # not freed and reused by a later folded tensor of the same layout, which would then be given
        # this initializer (a silently wrong weight).
        self._init_by_tensor: dict[tuple[Any, ...], tuple[torch.Tensor, ir.Value]] = {}
        self.env: dict[Any, Any] = {}
        self._names: set[str] = set()
        self.origins: dict[str, str] = {}
        self._current: Any = None
        self._folded_bn: dict[Any, Any] = {}  # batch-norm node -> the conv node it was folded into

    # -- names and values --

    def _name(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        name, k = base, 1
        while name in self._names:
            name = f"{base}_{k}"
            k += 1
        self._names.add(name)
        return name

    def _initializer(self, tensor: torch.Tensor, hint: str) -> ir.Value:
        import onnx_ir as ir
        from onnx_ir.tensor_adapters import TorchTensor

        tensor = tensor.detach()
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())
        if tensor.numel() > 0 and key in self._init_by_tensor:
            return self._init_by_tensor[key][1]
        source = tensor
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        name = self._name(hint)
        value = ir.Value(
            name=name,
            type=ir.TensorType(_ir_dtype(tensor.dtype)),
            shape=ir.Shape(tuple(tensor.shape)),
            const_value=TorchTensor(tensor, name=name),
        )
        self.initializers[name] = value
        if tensor.numel() > 0:
            self._init_by_tensor[key] = (source, value)
        return value

    def scalar(self, value: float | int | bool, dtype: torch.dtype) -> ir.Value:
        import torch

        return self._initializer(torch.tensor(value, dtype=dtype), f"const_{dtype}".replace("torch.", ""))

    def ints(self, values: Sequence[int], hint: str = "shape") -> ir.Value:
        import torch

        return self._initializer(torch.tensor(list(values), dtype=torch.int64), hint)

    def value(self, x: Any) -> ir.Value:
        """The ONNX value of an FX argument (a constant becomes an initializer on first use)."""
        import onnx_ir as ir
        import torch
        import torch.fx

        if isinstance(x, torch.fx.Node):
            got = self.env[x]
            if isinstance(got, ir.Value):
                return got
            if isinstance(got, torch.Tensor):
                value = self._initializer(got, x.name)
                self.env[x] = value
                return value
            raise Declined(f"node {x.name} is a {type(got).__name__}, not a tensor")
        raise Declined(f"expected a tensor argument, got {x!r}")

    def operand(self, x: Any, dtype: torch.dtype) -> ir.Value:
        """``x`` (an FX node or a Python scalar) as an ONNX value of ``dtype``, cast when needed."""
        import torch.fx

        if isinstance(x, torch.fx.Node):
            have = x.meta["val"].dtype
            v = self.value(x)
            if have == dtype:
                return v
            return self.emit1("Cast", [v], {"to": int(_ir_dtype(dtype))}, dtype=dtype, shape=tuple(x.meta["val"].shape))
        if isinstance(x, (bool, int, float)):
            return self.scalar(x, dtype)
        raise Declined(f"unsupported operand {x!r}")

    def emit(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        outputs: Sequence[tuple[torch.dtype, tuple[int, ...]]],
    ) -> list[ir.Value]:
        import onnx_ir as ir

        hint = self._current.name if self._current is not None else op.lower()
        out_values = [
            ir.Value(name=self._name(hint), type=ir.TensorType(_ir_dtype(dt)), shape=ir.Shape(shape))
            for dt, shape in outputs
        ]
        attributes = []
        for key, val in (attrs or {}).items():
            if isinstance(val, (bool, int)):
                attributes.append(ir.AttrInt64(key, int(val)))
            elif isinstance(val, float):
                attributes.append(ir.AttrFloat32(key, val))
            elif isinstance(val, str):
                attributes.append(ir.AttrString(key, val))
            elif isinstance(val, (list, tuple)):
                attributes.append(ir.AttrInt64s(key, [_static_int(v) for v in val]))
            else:  # pragma: no cover - a bug in a handler
                raise TypeError(f"attribute {key}={val!r}")
        node = ir.Node("", op, list(inputs), attributes=attributes, outputs=out_values, name=self._name(f"n_{hint}"))
        origin = self._origin(self._current)
        if origin:
            self.origins[node.name] = origin
        self.nodes.append(node)
        return out_values

    def emit1(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        dtype: Any,
        shape: tuple[int, ...],
    ) -> ir.Value:
        return self.emit(op, inputs, attrs, outputs=[(dtype, shape)])[0]

    def out(self, op: str, inputs: Sequence[ir.Value | None], attrs: dict[str, Any] | None = None) -> ir.Value:
        """Emit one node whose single output is the current FX node's value."""
        val = self._current.meta["val"]
        return self.emit1(op, inputs, attrs, dtype=val.dtype, shape=tuple(val.shape))

    @staticmethod
    def _origin(node: Any) -> str | None:
        if node is None:
            return None
        op = str(getattr(node.target, "__name__", node.target)).removesuffix(".default")
        op = f"aten.{op}" if not op.startswith("aten.") and hasattr(node.target, "_schema") else op
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return op
        path, kind = list(stack.values())[-1]
        kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
        import re

        path = re.sub(r"^L\['[^']*'\]\.?", "", str(path)) or "<root>"
        path = re.sub(r"\._modules\['([^']*)'\]", r".\1", path)
        return f"{path} ({kind_name.rsplit('.', 1)[-1]}): {op}"

    # -- the walk --

    def run(self, user_positions: Sequence[tuple[str, int]]) -> tuple[list[ir.Value], list[ir.Value]]:
        import onnx_ir as ir
        import torch

        names = dict((i, name) for name, i in user_positions)
        inputs: list[ir.Value] = []
        placeholders = [n for n in self.traced.graph.nodes if n.op == "placeholder"]
        self._plan_batchnorm_folding()
        for pos, node in enumerate(placeholders):
            if pos in self.constants:
                self.env[node] = self.constants[pos]
            elif pos in names:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    raise Declined(f"input {names[pos]} is a {type(val).__name__}, not a tensor")
                value = ir.Value(
                    name=names[pos], type=ir.TensorType(_ir_dtype(val.dtype)), shape=ir.Shape(tuple(val.shape))
                )
                self._names.add(names[pos])
                self.env[node] = value
                inputs.append(value)
            else:
                raise Declined(f"placeholder {node.name} is neither an input nor a parameter")
        output_node = None
        for node in self.traced.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                output_node = node
                continue
            self._current = node
            self._translate(node)
        self._current = None
        assert output_node is not None
        outputs: list[ir.Value] = []
        seen: set[int] = set()
        input_ids = {id(v) for v in inputs}
        for arg in output_node.args[0]:
            value = self.value(arg)
            if id(value) in seen or id(value) in input_ids or value.name in self.initializers:
                val = arg.meta["val"]
                value = self.emit1("Identity", [value], dtype=val.dtype, shape=tuple(val.shape))
            seen.add(id(value))
            outputs.append(value)
        return inputs, outputs

    def _translate(self, node: torch.fx.Node) -> None:
        import torch

        if node.op == "get_attr":
            self.env[node] = getattr(self.traced, str(node.target))
            return
        if node.op != "call_function":
            raise Declined(f"FX node {node.name} has op {node.op!r}")
        if node.target is operator.getitem:
            seq, index = node.args
            got = self.env[seq]
            self.env[node] = got[index]
            return
        if self._is_constant(node):
            self.env[node] = self._fold(node)
            return
        handler = _HANDLERS.get(node.target)
        if handler is None:
            raise Declined(f"no translation for {node.target}")
        for x in (*node.args, *node.kwargs.values()):
            for leaf in x if isinstance(x, (list, tuple)) else (x,):
                val = _val(leaf)
                if isinstance(val, torch.Tensor) and val.dtype not in _SUPPORTED_DTYPES:
                    raise Declined(f"{node.target} on dtype {val.dtype}")
        val = node.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, torch.Tensor) and v.dtype not in _SUPPORTED_DTYPES:
                raise Declined(f"{node.target} gives dtype {v.dtype}")
        result = handler(self, node, *node.args, **node.kwargs)
        self._check(node, result)
        self.env[node] = result

    @staticmethod
    def _check(node: torch.fx.Node, result: Any) -> None:
        """Every value a handler returns must have exactly the dtype and shape PyTorch computed."""
        import onnx_ir as ir

        vals = node.meta["val"] if isinstance(result, tuple) else (node.meta["val"],)
        results = result if isinstance(result, tuple) else (result,)
        for got, want in zip(results, vals, strict=False):
            if not isinstance(got, ir.Value):
                continue
            if got.dtype != _ir_dtype(want.dtype) or tuple(got.shape) != tuple(int(s) for s in want.shape):
                raise Declined(
                    f"{node.target} at {node.name} would give {got.dtype}{tuple(got.shape)}, PyTorch gives "
                    f"{want.dtype}{tuple(want.shape)}"
                )

    def _is_constant(self, node: torch.fx.Node) -> bool:
        import torch
        import torch.fx

        # Every random op (randint, normal, multinomial, poisson, rand with a generator...) carries
        # this tag; folding one would freeze one draw into the model (and consume the caller's RNG).
        if node.target in _NONDETERMINISTIC or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            return False
        for x in (*node.args, *node.kwargs.values()):
            for leaf in x if isinstance(x, (list, tuple)) else (x,):
                if isinstance(leaf, torch.fx.Node) and not isinstance(self.env.get(leaf), torch.Tensor):
                    return False
        return True

    def _fold(self, node: torch.fx.Node) -> Any:
        import torch
        import torch.fx

        def real(x: Any) -> Any:
            if isinstance(x, torch.fx.Node):
                return self.env[x]
            if isinstance(x, (list, tuple)):
                return type(x)(real(v) for v in x)
            return x

        schema = getattr(node.target, "_schema", None)
        if schema is None or schema.is_mutable:
            raise Declined(f"cannot fold {node.target}: not a pure ATen op")
        with torch.no_grad():
            result = node.target(*real(node.args), **real(node.kwargs))
        for t in result if isinstance(result, (list, tuple)) else (result,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > _MAX_FOLD_BYTES and t._base is None:
                raise Declined(f"folding {node.name} would materialize {t.numel() * t.element_size()} bytes")
        return result

    def _plan_batchnorm_folding(self) -> None:
        """Find convolution -> batch norm (inference) pairs whose BN can be folded into the conv."""
        aten = _aten()
        for node in self.traced.graph.nodes:
            if node.op != "call_function" or node.target is not aten.native_batch_norm.default:
                continue
            conv = node.args[0]
            if (
                getattr(conv, "target", None) is aten.convolution.default
                and len(conv.users) == 1
                and not conv.args[6]  # not transposed
                and node.args[5] is False  # inference
                and _only_first_output_used(node)
            ):
                self._folded_bn[conv] = node


_SUPPORTED_DTYPES: frozenset[Any] = frozenset()
_NONDETERMINISTIC: frozenset[Any] = frozenset()
_HANDLERS: dict[Any, Callable[..., Any]] = {}
# The tables above are filled once, on first use, by _ensure_registered: under a lock, and published by _REGISTERED
# only when complete, so that no thread sees an empty or half-filled table (it would send its graph to torch.onnx).
_REGISTER_LOCK = threading.Lock()
_REGISTERED = False


def _static_int(v: Any) -> int:
    try:
        return int(v)
    except Exception as exc:  # a symbolic size the specialization did not resolve
        raise Declined(f"non-static integer {v!r}") from exc


def _only_first_output_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in node.meta["val"].shape)


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


# --- handlers ----------------------------------------------------------------------------------


def _no_bool(node: Any, dtype: Any) -> None:
    # ONNX Add/Sub/Mul/Max/Min, Less/Greater and onnxruntime 1.32's CPU Where have no bool kernel: the model
    # would not load, so let torch.onnx (which writes And/Or/casts for some of them) take the graph.
    if dtype == _bool():
        raise Declined(f"{node.target} on bool tensors")


def _elementwise(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, a: Any, b: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise Declined(f"{node.target} with {kwargs}")
        dtype = node.meta["val"].dtype
        _no_bool(node, dtype)
        return t.out(op, [t.operand(a, dtype), t.operand(b, dtype)])

    return handler


def _add_sub(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, a: Any, b: Any, alpha: Any = 1) -> Any:
        dtype = node.meta["val"].dtype
        _no_bool(node, dtype)
        rhs = t.operand(b, dtype)
        if alpha != 1:
            if not isinstance(b, (int, float)):
                rhs = t.emit1("Mul", [rhs, t.scalar(alpha, dtype)], dtype=dtype, shape=tuple(_val(b).shape))
            else:
                rhs = t.scalar(b * alpha, dtype)
        return t.out(op, [t.operand(a, dtype), rhs])

    return handler


def _compare(op: str, negate: bool = False) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, a: Any, b: Any) -> Any:
        import torch

        dtype = torch.result_type(_val(a), _val(b))
        if op != "Equal":
            _no_bool(node, dtype)
        inputs = [t.operand(a, dtype), t.operand(b, dtype)]
        if not negate:
            return t.out(op, inputs)
        eq = t.emit1(op, inputs, dtype=torch.bool, shape=_shape(node))
        return t.out("Not", [eq])

    return handler


def _unary(op: str, float_only: bool = False) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, x: Any) -> Any:
        if node.meta["val"].dtype != _val(x).dtype:
            raise Declined(f"{node.target} changes dtype")
        # ONNX Floor/Ceil are float-only, and onnxruntime 1.32's CPU Relu has no int64 kernel.
        if float_only and not _val(x).dtype.is_floating_point:
            raise Declined(f"{node.target} on {_val(x).dtype}")
        return t.out(op, [t.value(x)])

    return handler


def _float_unary(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, x: Any) -> Any:
        return t.out(op, [t.operand(x, node.meta["val"].dtype)])

    return handler


def _alias(t: _Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    if node.meta["val"].dtype != _val(x).dtype or _shape(node) != tuple(_val(x).shape):
        raise Declined(f"{node.target} changes dtype or shape")
    return t.value(x)


def _to_copy(t: _Translator, node: Any, x: Any, **kwargs: Any) -> Any:
    dtype = node.meta["val"].dtype
    if dtype == _val(x).dtype:
        return t.value(x)
    return t.out("Cast", [t.value(x)], {"to": int(_ir_dtype(dtype))})


def _reshape(t: _Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    shape = _shape(node)
    if shape == tuple(_val(x).shape):
        return t.value(x)
    return t.out("Reshape", [t.value(x), t.ints(shape)])


def _permute(t: _Translator, node: Any, x: Any, dims: Sequence[int]) -> Any:
    rank = _val(x).dim()
    perm = [_dim(d, rank) for d in dims]
    if perm == list(range(rank)):
        return t.value(x)
    return t.out("Transpose", [t.value(x)], {"perm": perm})


def _transpose(t: _Translator, node: Any, x: Any, d0: int, d1: int) -> Any:
    rank = _val(x).dim()
    perm = list(range(rank))
    a, b = _dim(d0, rank), _dim(d1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(t, node, x, perm)


def _t(t: _Translator, node: Any, x: Any) -> Any:
    rank = _val(x).dim()
    return _permute(t, node, x, [1, 0] if rank == 2 else list(range(rank)))


def _expand(t: _Translator, node: Any, x: Any, size: Any, **kwargs: Any) -> Any:
    shape = _shape(node)
    if shape == tuple(_val(x).shape):
        return t.value(x)
    return t.out("Expand", [t.value(x), t.ints(shape)])


def _slice(t: _Translator, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    shape = tuple(_val(x).shape)
    d = _dim(dim, len(shape))
    size = shape[d]
    s, e, _ = slice(start, end, step).indices(size)
    if step < 1:
        raise Declined("slice with step < 1")
    if _shape(node) == shape:
        return t.value(x)
    return t.out(
        "Slice",
        [t.value(x), t.ints([s], "starts"), t.ints([max(e, s)], "ends"), t.ints([d], "axes"), t.ints([step], "steps")],
    )


def _select(t: _Translator, node: Any, x: Any, dim: int, index: int) -> Any:
    import torch

    shape = tuple(_val(x).shape)
    d = _dim(dim, len(shape))
    i = index + shape[d] if index < 0 else index
    return t.out("Gather", [t.value(x), t._initializer(torch.tensor(i, dtype=torch.int64), "index")], {"axis": d})


def _cat(t: _Translator, node: Any, tensors: Sequence[Any], dim: int = 0) -> Any:
    dtype = node.meta["val"].dtype
    rank = node.meta["val"].dim()
    # torch.cat skips 1-D empty tensors whatever the other shapes; ONNX Concat would reject them.
    parts = [t.operand(x, dtype) for x in tensors if _val(x).numel() > 0]
    if not parts:
        raise Declined("cat of empty tensors only")
    if len(parts) == 1:
        return parts[0]
    return t.out("Concat", parts, {"axis": _dim(dim, rank)})


def _split(t: _Translator, node: Any, x: Any, sizes: Any, dim: int = 0) -> Any:
    shape = tuple(_val(x).shape)
    d = _dim(dim, len(shape))
    vals = node.meta["val"]
    lengths = [int(v.shape[d]) for v in vals]
    outs = [(v.dtype, tuple(v.shape)) for v in vals]
    return t.emit("Split", [t.value(x), t.ints(lengths, "split")], {"axis": d}, outputs=outs)


def _unbind(t: _Translator, node: Any, x: Any, dim: int = 0) -> Any:
    """Split into slices of size 1 along ``dim``, each reshaped without that axis."""
    shape = tuple(_val(x).shape)
    d = _dim(dim, len(shape))
    kept = (*shape[:d], 1, *shape[d + 1 :])
    dtype = _val(x).dtype
    pieces = t.emit(
        "Split", [t.value(x), t.ints([1] * shape[d], "split")], {"axis": d}, outputs=[(dtype, kept)] * shape[d]
    )
    return tuple(
        t.emit1("Reshape", [p, t.ints(tuple(v.shape))], dtype=v.dtype, shape=tuple(v.shape))
        for p, v in zip(pieces, node.meta["val"], strict=True)
    )


def _reduce(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, x: Any, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("dtype") not in (None, _val(x).dtype):
            raise Declined(f"{node.target} with dtype=")
        rank = _val(x).dim()
        dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
        axes = sorted(_dim(d, rank) for d in dims) or list(range(rank))
        if rank == 0:
            return t.operand(x, node.meta["val"].dtype)
        # sum of bool/int8 gives int64 in PyTorch: reduce in the output dtype.
        xv = t.operand(x, node.meta["val"].dtype)
        return t.out(op, [xv, t.ints(axes, "axes")], {"keepdims": int(bool(keepdim))})

    return handler


def _reduce_all(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, x: Any, **kwargs: Any) -> Any:
        return _reduce(op)(t, node, x, None, False, **kwargs)

    return handler


def _softmax(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, x: Any, dim: int, half_to_float: bool = False) -> Any:
        if half_to_float:
            raise Declined("softmax with half_to_float")
        return t.out(op, [t.value(x)], {"axis": _dim(dim, _val(x).dim())})

    return handler


def _safe_softmax(t: _Translator, node: Any, x: Any, dim: int, dtype: Any = None) -> Any:
    """softmax, but rows whose inputs are all -inf give 0 (not NaN), as PyTorch's attention does."""
    import torch

    val = node.meta["val"]
    if dtype not in (None, _val(x).dtype):
        raise Declined("_safe_softmax with dtype=")
    axis = _dim(dim, val.dim())
    xv = t.value(x)
    shape = tuple(val.shape)
    soft = t.emit1("Softmax", [xv], {"axis": axis}, dtype=val.dtype, shape=shape)
    row_shape = tuple(1 if i == axis else s for i, s in enumerate(shape))
    row_max = t.emit1("ReduceMax", [xv, t.ints([axis], "axes")], {"keepdims": 1}, dtype=val.dtype, shape=row_shape)
    masked = t.emit1("Equal", [row_max, t.scalar(float("-inf"), val.dtype)], dtype=torch.bool, shape=row_shape)
    return t.out("Where", [masked, t.scalar(0.0, val.dtype), soft])


def _mm(t: _Translator, node: Any, a: Any, b: Any) -> Any:
    import torch

    if node.meta["val"].dtype not in (torch.float32, torch.float16, torch.int32, torch.int64):
        raise Declined(f"{node.target} on {node.meta['val'].dtype} (no ONNX MatMul for it)")
    return t.out("MatMul", [t.value(a), t.value(b)])


def _addmm(t: _Translator, node: Any, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    import torch

    rhs = t.env[b]
    trans_b = 0
    if isinstance(rhs, torch.Tensor) and rhs.dim() == 2 and not rhs.is_contiguous() and rhs.t().is_contiguous():
        # The weight of a Linear arrives as t(weight): keep the weight as it is and let Gemm transpose.
        b_value = t._initializer(rhs.t(), f"{b.name}_t")
        trans_b = 1
    else:
        b_value = t.value(b)
    dtype = node.meta["val"].dtype
    attrs = {"transB": trans_b, "alpha": float(alpha), "beta": float(beta)}
    return t.out("Gemm", [t.operand(a, dtype), b_value, t.operand(bias, dtype)], attrs)


def _convolution(
    t: _Translator,
    node: Any,
    x: Any,
    w: Any,
    b: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> Any:
    import torch

    rank = _val(x).dim() - 2
    if rank < 1 or rank > 3:
        raise Declined(f"convolution over {rank} spatial dims")
    if isinstance(padding, str):
        raise Declined("convolution with string padding")
    attrs: dict[str, Any] = {
        "strides": list(stride),
        "pads": list(padding) * 2,
        "dilations": list(dilation),
        "group": int(groups),
        "kernel_shape": list(_val(w).shape[2:]),
    }
    bn = t._folded_bn.get(node)
    if (
        bn is not None
        and isinstance(t.env.get(w), torch.Tensor)
        and (b is None or isinstance(t.env.get(b), torch.Tensor))
    ):
        weight, bias = _fold_batchnorm(t, bn, t.env[w], t.env[b] if b is not None else None)
        inputs = [t.value(x), t._initializer(weight, f"{w.name}_bn"), t._initializer(bias, f"{bn.name}_bias")]
        t._current = bn  # name and origin of the fused node follow the batch norm's output
        val = bn.meta["val"][0]
        out = t.emit1("Conv", inputs, attrs, dtype=val.dtype, shape=tuple(val.shape))
        t.env[bn] = (out, None, None)
        t._current = node
        return out
    inputs = [t.value(x), t.value(w)] + ([t.value(b)] if b is not None else [])
    if transposed:
        attrs["output_padding"] = list(output_padding)
        return t.out("ConvTranspose", inputs, attrs)
    return t.out("Conv", inputs, attrs)


def _fold_batchnorm(t: _Translator, bn: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[Any, Any]:
    import torch

    _, gamma, beta, mean, var, _, _, eps = bn.args
    cout = weight.shape[0]

    def real(x: Any, default: float) -> torch.Tensor:
        if x is None:
            return torch.full((cout,), default, dtype=torch.float64)
        got = t.env[x]
        if not isinstance(got, torch.Tensor):
            raise Declined("batch norm with non-constant statistics")
        return got.double()

    scale = real(gamma, 1.0) / torch.sqrt(real(var, 0.0) + eps)
    shift = real(beta, 0.0) - real(mean, 0.0) * scale
    w = (weight.double() * scale.reshape(-1, *([1] * (weight.dim() - 1)))).to(weight.dtype)
    b0 = bias.double() if bias is not None else torch.zeros(cout, dtype=torch.float64)
    return w, (b0 * scale + shift).to(weight.dtype)


def _batch_norm(
    t: _Translator, node: Any, x: Any, w: Any, b: Any, mean: Any, var: Any, training: bool, momentum: float, eps: float
) -> Any:
    import torch

    if node in t.env:  # folded into the convolution before it
        return t.env[node]
    if training or not _only_first_output_used(node):
        raise Declined("batch norm in training mode or with its statistics used")
    if mean is None or var is None:
        raise Declined("batch norm without running statistics")
    c = _val(x).shape[1]
    dtype = node.meta["val"][0].dtype
    scale = t.value(w) if w is not None else t._initializer(torch.ones(c, dtype=dtype), "bn_scale")
    shift = t.value(b) if b is not None else t._initializer(torch.zeros(c, dtype=dtype), "bn_shift")
    val = node.meta["val"][0]
    out = t.emit1(
        "BatchNormalization",
        [t.value(x), scale, shift, t.value(mean), t.value(var)],
        {"epsilon": float(eps)},
        dtype=val.dtype,
        shape=tuple(val.shape),
    )
    return (out, None, None)


def _layer_norm(t: _Translator, node: Any, x: Any, normalized_shape: Sequence[int], w: Any, b: Any, eps: float) -> Any:
    import torch

    if not _only_first_output_used(node):
        raise Declined("layer norm with its mean/rstd used")
    val = node.meta["val"][0]
    n = len(normalized_shape)
    scale = (
        t.value(w)
        if w is not None
        else t._initializer(torch.ones(tuple(normalized_shape), dtype=val.dtype), "ln_scale")
    )
    inputs = [t.value(x), scale] + ([t.value(b)] if b is not None else [])
    out = t.emit1(
        "LayerNormalization", inputs, {"axis": -n, "epsilon": float(eps)}, dtype=val.dtype, shape=tuple(val.shape)
    )
    return (out, None, None)


def _max_pool(
    t: _Translator,
    node: Any,
    x: Any,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Any:
    if ceil_mode:  # ONNX and PyTorch disagree on the last window's placement with ceil_mode
        raise Declined("max pool with ceil_mode=True")
    attrs = {**_pool_window(x, kernel, stride, padding), "dilations": _ntuple(dilation, _val(x).dim() - 2)}
    if node.target is _aten().max_pool2d_with_indices.default:
        if not _only_first_output_used(node):
            raise Declined("max pool with its indices used")
        val = node.meta["val"][0]
        out = t.emit1("MaxPool", [t.value(x)], attrs, dtype=val.dtype, shape=tuple(val.shape))
        return (out, None)
    return t.out("MaxPool", [t.value(x)], attrs)


def _avg_pool(
    t: _Translator,
    node: Any,
    x: Any,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Any:
    if ceil_mode or divisor_override is not None:
        raise Declined("avg pool with ceil_mode or divisor_override")
    attrs = {**_pool_window(x, kernel, stride, padding), "count_include_pad": int(bool(count_include_pad))}
    return t.out("AveragePool", [t.value(x)], attrs)


def _pool_window(x: Any, kernel: Any, stride: Any, padding: Any) -> dict[str, Any]:
    """ONNX kernel_shape, strides (PyTorch's empty stride means the kernel size) and symmetric pads."""
    rank = _val(x).dim() - 2
    k = _ntuple(kernel, rank)
    return {"kernel_shape": k, "strides": _ntuple(stride, rank) if stride else k, "pads": _ntuple(padding, rank) * 2}


def _adaptive_avg_pool(t: _Translator, node: Any, x: Any, output_size: Sequence[int]) -> Any:
    shape = tuple(_val(x).shape)
    spatial = shape[-len(output_size) :]
    if all(o == 1 for o in output_size):
        axes = list(range(len(shape) - len(output_size), len(shape)))
        return t.out("ReduceMean", [t.value(x), t.ints(axes, "axes")], {"keepdims": 1})
    if all(s % o == 0 for s, o in zip(spatial, output_size, strict=True)):
        k = [s // o for s, o in zip(spatial, output_size, strict=True)]
        return t.out("AveragePool", [t.value(x)], {"kernel_shape": k, "strides": k})
    raise Declined(f"adaptive average pool from {spatial} to {list(output_size)}")


def _ntuple(v: Any, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _embedding(t: _Translator, node: Any, weight: Any, indices: Any, *args: Any) -> Any:
    return t.out("Gather", [t.value(weight), t.value(indices)], {"axis": 0})


def _gather(t: _Translator, node: Any, x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Any:
    return t.out("GatherElements", [t.value(x), t.value(index)], {"axis": _dim(dim, _val(x).dim())})


def _index_select(t: _Translator, node: Any, x: Any, dim: int, index: Any) -> Any:
    axis = _dim(dim, _val(x).dim())
    return t.out("Gather", [t.value(x), _gather_index(t, index, _val(x).shape[axis])], {"axis": axis})


def _gather_index(t: _Translator, index: Any, size: int) -> Any:
    """A Gather index: constant indices are checked (PyTorch raises out of range) and made non-negative, since
    not every backend takes ONNX's negative Gather indices; runtime indices go as they are."""
    import torch

    const = t.env.get(index)
    if not isinstance(const, torch.Tensor):
        return t.value(index)
    return t._initializer(_in_range(const, size).to(const.dtype), "index")


def _in_range(index: torch.Tensor, size: int) -> torch.Tensor:
    """Constant indices made non-negative; PyTorch raises for any outside [-size, size), so the translator declines."""
    import torch

    if bool(((index < -size) | (index >= size)).any()):
        raise Declined(f"constant index out of range for a dimension of size {size}")
    return torch.remainder(index, size)


def _index(t: _Translator, node: Any, x: Any, indices: Sequence[Any]) -> Any:
    """``x[..., i1, i2, ...]`` with adjacent integer index tensors (advanced indexing).

    One index tensor is a Gather on its axis. Several must be constants (masks built from ``arange``, the usual
    case): they are broadcast and flattened at export time into one index over the merged axes, checked against
    the sizes (PyTorch raises for an index out of range), and the data is gathered once.
    """
    import torch

    shape = tuple(_val(x).shape)
    pos = [i for i, v in enumerate(indices) if v is not None]
    if not pos or pos != list(range(pos[0], pos[-1] + 1)):
        raise Declined("index with non-adjacent index tensors")
    p, k = pos[0], len(pos)
    idx_nodes = [indices[i] for i in pos]
    if any(_val(v).dtype not in (torch.int64, torch.int32) for v in idx_nodes):
        raise Declined("index with a bool or non-integer index tensor")
    if k == 1:
        return t.out("Gather", [t.value(x), _gather_index(t, idx_nodes[0], shape[p])], {"axis": p})
    consts = [t.env.get(v) for v in idx_nodes]
    if not all(isinstance(c, torch.Tensor) for c in consts):
        raise Declined("index with several index tensors that are not constants")
    sizes = shape[p : p + k]
    parts = torch.broadcast_tensors(*[c.to(torch.int64) for c in consts])
    flat = torch.zeros(parts[0].shape, dtype=torch.int64)
    for idx, size in zip(parts, sizes, strict=True):
        flat = flat * size + _in_range(idx, size)
    merged = (*shape[:p], math.prod(sizes), *shape[p + k :])
    dtype = _val(x).dtype
    data = t.emit1("Reshape", [t.value(x), t.ints(merged)], dtype=dtype, shape=merged)
    return t.out("Gather", [data, t._initializer(flat, "index")], {"axis": p})


def _where(t: _Translator, node: Any, cond: Any, a: Any, b: Any) -> Any:
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    return t.out("Where", [t.operand(cond, _bool()), t.operand(a, dtype), t.operand(b, dtype)])


def _masked_fill(t: _Translator, node: Any, x: Any, mask: Any, value: Any) -> Any:
    dtype = node.meta["val"].dtype
    _no_bool(node, dtype)
    value_v = t.operand(value, dtype) if not isinstance(value, (int, float, bool)) else t.scalar(value, dtype)
    return t.out("Where", [t.operand(mask, _bool()), value_v, t.operand(x, dtype)])


def _bool() -> Any:
    import torch

    return torch.bool


def _gelu(t: _Translator, node: Any, x: Any, approximate: str = "none") -> Any:
    if approximate not in ("none", "tanh"):
        raise Declined(f"gelu approximate={approximate!r}")
    return t.out("Gelu", [t.value(x)], {"approximate": approximate})


def _silu(t: _Translator, node: Any, x: Any) -> Any:
    val = node.meta["val"]
    sig = t.emit1("Sigmoid", [t.value(x)], dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Mul", [t.value(x), sig])


def _rsqrt(t: _Translator, node: Any, x: Any) -> Any:
    val = node.meta["val"]
    root = t.emit1("Sqrt", [t.operand(x, val.dtype)], dtype=val.dtype, shape=tuple(val.shape))
    return t.out("Reciprocal", [root])


def _clamp(t: _Translator, node: Any, x: Any, lo: Any = None, hi: Any = None) -> Any:
    dtype = node.meta["val"].dtype
    if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        raise Declined("clamp with tensor bounds")
    if lo is not None and hi is not None and lo > hi:
        raise Declined("clamp with min > max")
    return t.out(
        "Clip",
        [
            t.operand(x, dtype),
            t.scalar(lo, dtype) if lo is not None else None,
            t.scalar(hi, dtype) if hi is not None else None,
        ],
    )


def _hardtanh(t: _Translator, node: Any, x: Any, lo: float = -1.0, hi: float = 1.0) -> Any:
    return _clamp(t, node, x, lo, hi)


def _leaky_relu(t: _Translator, node: Any, x: Any, slope: float = 0.01) -> Any:
    return t.out("LeakyRelu", [t.value(x)], {"alpha": float(slope)})


def _hardsigmoid(t: _Translator, node: Any, x: Any) -> Any:
    return t.out("HardSigmoid", [t.value(x)], {"alpha": 1.0 / 6.0, "beta": 0.5})


def _hardswish(t: _Translator, node: Any, x: Any) -> Any:
    return t.out("HardSwish", [t.value(x)])


def _elu(t: _Translator, node: Any, x: Any, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Any:
    if scale != 1 or input_scale != 1:
        raise Declined("elu with scale")
    return t.out("Elu", [t.value(x)], {"alpha": float(alpha)})


def _pow(t: _Translator, node: Any, x: Any, exponent: Any) -> Any:
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        raise Declined("integer pow")
    if isinstance(exponent, (int, float)) and exponent == 2:
        xv = t.operand(x, dtype)
        return t.out("Mul", [xv, xv])
    return t.out("Pow", [t.operand(x, dtype), t.operand(exponent, dtype)])


def _div(t: _Translator, node: Any, a: Any, b: Any, *, rounding_mode: Any = None) -> Any:
    if rounding_mode is not None:
        raise Declined(f"div with rounding_mode={rounding_mode!r}")
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        raise Declined("integer division")
    return t.out("Div", [t.operand(a, dtype), t.operand(b, dtype)])


def _like_constant(t: _Translator, node: Any, *args: Any, **kwargs: Any) -> Any:
    """zeros_like/ones_like/full_like of a runtime tensor: only the (static) shape matters."""
    import torch

    val = node.meta["val"]
    if val.numel() * val.element_size() > _MAX_FOLD_BYTES:
        raise Declined(f"{node.target} would become a constant of {val.numel() * val.element_size()} bytes")
    fill = {"zeros_like": 0, "ones_like": 1}.get(
        node.target.__name__.split(".")[0], args[1] if len(args) > 1 else kwargs.get("fill_value")
    )
    return torch.full(tuple(val.shape), fill, dtype=val.dtype)


def _constant_pad(t: _Translator, node: Any, x: Any, pad: Sequence[int], value: float = 0.0) -> Any:
    rank = _val(x).dim()
    if any(p < 0 for p in pad):
        raise Declined("negative padding")
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        d = rank - 1 - i
        begins[d], ends[d] = pad[2 * i], pad[2 * i + 1]
    dtype = node.meta["val"].dtype
    return t.out("Pad", [t.value(x), t.ints(begins + ends, "pads"), t.scalar(value, dtype)], {"mode": "constant"})


def _logical(op: str) -> Callable[..., Any]:
    def handler(t: _Translator, node: Any, a: Any, b: Any) -> Any:
        return t.out(op, [t.operand(a, _bool()), t.operand(b, _bool())])

    return handler


def _bitwise(op: str) -> Callable[..., Any]:
    """``&``, ``|`` and ``^`` on bool tensors (masks); on integers they are bit operations: declined."""

    def handler(t: _Translator, node: Any, a: Any, b: Any) -> Any:
        if any(_val(v).dtype != _bool() for v in (a, b) if hasattr(v, "meta")) or node.meta["val"].dtype != _bool():
            raise Declined(f"{node.target} on non-bool tensors")
        return _logical(op)(t, node, a, b)

    return handler


def _not(t: _Translator, node: Any, x: Any) -> Any:
    if _val(x).dtype != _bool():
        raise Declined("bitwise/logical not on a non-bool tensor")
    return t.out("Not", [t.value(x)])


def _register() -> None:
    import torch

    global _SUPPORTED_DTYPES, _NONDETERMINISTIC
    aten = torch.ops.aten
    _SUPPORTED_DTYPES = frozenset(
        {torch.float32, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8}
    )
    _NONDETERMINISTIC = frozenset(
        {
            aten.empty.memory_format,
            aten.empty_like.default,
            aten.empty_strided.default,
            aten.rand.default,
            aten.randn.default,
            aten.rand_like.default,
            aten.randn_like.default,
            aten.randint.low,
            aten.bernoulli.default,
            aten.bernoulli.p,
            aten.native_dropout.default,
            aten.normal.Tensor_float,
            aten.uniform.default,
        }
    )
    h: dict[Any, Callable[..., Any]] = {
        aten.add.Tensor: _add_sub("Add"),
        aten.add.Scalar: _add_sub("Add"),
        aten.sub.Tensor: _add_sub("Sub"),
        aten.sub.Scalar: _add_sub("Sub"),
        aten.rsub.Scalar: lambda t, n, a, b, alpha=1: (
            _add_sub("Sub")(t, n, b, a) if alpha == 1 else _declined("rsub alpha")
        ),
        aten.mul.Tensor: _elementwise("Mul"),
        aten.mul.Scalar: _elementwise("Mul"),
        aten.div.Tensor: _div,
        aten.div.Scalar: _div,
        aten.div.Tensor_mode: _div,
        aten.maximum.default: _elementwise("Max"),
        aten.minimum.default: _elementwise("Min"),
        aten.pow.Tensor_Scalar: _pow,
        aten.pow.Tensor_Tensor: _pow,
        aten.eq.Tensor: _compare("Equal"),
        aten.eq.Scalar: _compare("Equal"),
        aten.ne.Tensor: _compare("Equal", negate=True),
        aten.ne.Scalar: _compare("Equal", negate=True),
        aten.lt.Tensor: _compare("Less"),
        aten.lt.Scalar: _compare("Less"),
        aten.le.Tensor: _compare("LessOrEqual"),
        aten.le.Scalar: _compare("LessOrEqual"),
        aten.gt.Tensor: _compare("Greater"),
        aten.gt.Scalar: _compare("Greater"),
        aten.ge.Tensor: _compare("GreaterOrEqual"),
        aten.ge.Scalar: _compare("GreaterOrEqual"),
        aten.logical_and.default: _logical("And"),
        aten.bitwise_and.Tensor: _bitwise("And"),
        aten.bitwise_or.Tensor: _bitwise("Or"),
        aten.bitwise_xor.Tensor: _bitwise("Xor"),
        aten.logical_xor.default: _logical("Xor"),
        aten.logical_or.default: _logical("Or"),
        aten.logical_not.default: _not,
        aten.bitwise_not.default: _not,
        aten.where.self: _where,
        aten.masked_fill.Scalar: _masked_fill,
        aten.masked_fill.Tensor: _masked_fill,
        aten.relu.default: _unary("Relu", float_only=True),
        aten.neg.default: _unary("Neg"),
        aten.abs.default: _unary("Abs"),
        aten.sigmoid.default: _float_unary("Sigmoid"),
        aten.tanh.default: _float_unary("Tanh"),
        aten.exp.default: _float_unary("Exp"),
        aten.log.default: _float_unary("Log"),
        aten.sqrt.default: _float_unary("Sqrt"),
        aten.reciprocal.default: _float_unary("Reciprocal"),
        aten.sin.default: _float_unary("Sin"),
        aten.cos.default: _float_unary("Cos"),
        aten.erf.default: _float_unary("Erf"),
        aten.floor.default: _unary("Floor", float_only=True),
        aten.ceil.default: _unary("Ceil", float_only=True),
        aten.rsqrt.default: _rsqrt,
        aten.gelu.default: _gelu,
        aten.silu.default: _silu,
        aten.hardtanh.default: _hardtanh,
        aten.clamp.default: _clamp,
        aten.clamp_min.default: lambda t, n, x, lo: _clamp(t, n, x, lo, None),
        aten.clamp_max.default: lambda t, n, x, hi: _clamp(t, n, x, None, hi),
        aten.leaky_relu.default: _leaky_relu,
        aten.hardsigmoid.default: _hardsigmoid,
        aten.hardswish.default: _hardswish,
        aten.elu.default: _elu,
        aten.clone.default: _alias,
        aten.alias.default: _alias,
        aten.detach.default: _alias,
        aten.lift_fresh_copy.default: _alias,
        aten._to_copy.default: _to_copy,
        aten.view.default: _reshape,
        aten._unsafe_view.default: _reshape,
        aten.reshape.default: _reshape,
        aten.unsqueeze.default: _reshape,
        aten.squeeze.dim: _reshape,
        aten.squeeze.dims: _reshape,
        aten.squeeze.default: _reshape,
        aten.flatten.using_ints: _reshape,
        aten.t.default: _t,
        aten.transpose.int: _transpose,
        aten.permute.default: _permute,
        aten.expand.default: _expand,
        aten.slice.Tensor: _slice,
        aten.select.int: _select,
        aten.cat.default: _cat,
        aten.split.Tensor: _split,
        aten.split_with_sizes.default: _split,
        aten.unbind.int: _unbind,
        aten.unsafe_split.Tensor: _split,
        aten.unsafe_split_with_sizes.default: _split,
        aten.mean.dim: _reduce("ReduceMean"),
        aten.mean.default: _reduce_all("ReduceMean"),
        aten.sum.dim_IntList: _reduce("ReduceSum"),
        aten.sum.default: _reduce_all("ReduceSum"),
        aten.amax.default: _reduce("ReduceMax"),
        aten.amin.default: _reduce("ReduceMin"),
        aten._softmax.default: _softmax("Softmax"),
        aten._log_softmax.default: _softmax("LogSoftmax"),
        aten._safe_softmax.default: _safe_softmax,
        aten.mm.default: _mm,
        aten.bmm.default: _mm,
        aten.addmm.default: _addmm,
        aten.convolution.default: _convolution,
        aten.native_batch_norm.default: _batch_norm,
        aten.native_layer_norm.default: _layer_norm,
        aten.max_pool2d_with_indices.default: _max_pool,
        aten.max_pool2d.default: _max_pool,
        aten.avg_pool2d.default: _avg_pool,
        aten._adaptive_avg_pool2d.default: _adaptive_avg_pool,
        aten.embedding.default: _embedding,
        aten.gather.default: _gather,
        aten.index_select.default: _index_select,
        aten.index.Tensor: _index,
        aten.constant_pad_nd.default: _constant_pad,
        aten.zeros_like.default: _like_constant,
        aten.ones_like.default: _like_constant,
        aten.full_like.default: _like_constant,
    }
    _HANDLERS.clear()
    _HANDLERS.update(h)


def _ensure_registered() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    with _REGISTER_LOCK:
        if not _REGISTERED:
            _register()
            _REGISTERED = True


def _declined(reason: str) -> Any:
    raise Declined(reason)


def supported_ops() -> list[str]:
    """The ATen overloads the fast path translates (anything else goes to torch.onnx)."""
    _ensure_registered()
    return sorted(str(op) for op in _HANDLERS)


def translate(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    param_indices: Sequence[int],
    user_inputs: Sequence[tuple[str, int]],
    outputs: Sequence[Any],
    opset: int,
) -> tuple[ir.Model, dict[str, str]]:
    """Translate a Dynamo graph to an ONNX model, or raise :class:`Declined`.

    Args:
        gm: Dynamo's graph (not modified).
        example_inputs: Dynamo's real arguments (parameters included).
        param_indices: Positions of the parameters and buffers among the placeholders.
        user_inputs: ``(ONNX input name, placeholder position)`` of the runtime inputs.
        outputs: The nodes of ``gm`` that become ONNX outputs, in order.
        opset: ONNX opset of the model.

    Returns:
        The model (initializers hold the real weights, without copies where they are contiguous) and
        the origin of each ONNX node (``"<module path> (<class>): <aten op>"``).
    """
    import onnx_ir as ir
    import torch

    _ensure_registered()
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise Declined(f"argument {i} is a {type(x).__name__}")
        if x.dtype not in _SUPPORTED_DTYPES:
            raise Declined(f"argument {i} has dtype {x.dtype}")
    try:
        traced = trace_aten(gm, example_inputs, outputs)
    except Declined:
        raise
    except Exception as exc:  # the graph does not trace to ATen with fake tensors: torch.onnx decides
        raise Declined(
            f"ATen tracing failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    constants = {i: example_inputs[i].detach() for i in param_indices}
    translator = _Translator(traced, constants, opset)
    inputs, outs = translator.run(user_inputs)
    for value, node in zip(outs, next(n for n in traced.graph.nodes if n.op == "output").args[0], strict=True):
        val = node.meta["val"]
        if value.dtype != _ir_dtype(val.dtype) or tuple(value.shape) != tuple(val.shape):
            raise Declined(f"output {node.name} came out as {value.dtype}{tuple(value.shape)}")
    graph = ir.Graph(
        inputs,
        outs,
        nodes=translator.nodes,
        initializers=list(translator.initializers.values()),
        opset_imports={"": opset},
        name="main_graph",
    )
    return ir.Model(graph, ir_version=10), translator.origins
