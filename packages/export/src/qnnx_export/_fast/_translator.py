"""The translator: walks an ATen graph in order and writes each node as ONNX nodes through the op handlers.

The handlers (``_ops_*.py``) write only through the public methods of :class:`Translator`:

- values: :meth:`~Translator.value` (an FX argument's ONNX value), :meth:`~Translator.operand` (cast to a dtype),
  :meth:`~Translator.constant_of` (the real tensor of a folded constant), :meth:`~Translator.initializer`,
  :meth:`~Translator.scalar`, :meth:`~Translator.ints`;
- nodes: :meth:`~Translator.out` (one node computing the node being translated), :meth:`~Translator.emit1` and
  :meth:`~Translator.emit` (intermediate nodes), :meth:`~Translator.emit_for_node` (a node that stands for a later
  FX node);
- fusion: :meth:`~Translator.folded_batch_norm`, :meth:`~Translator.set_result`, :meth:`~Translator.result_of`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from qnnx_export._fast._nodes import fake, only_first_output_used
from qnnx_export._naming import UniqueNames, module_origin

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch
    import torch.fx
    from torch.fx import Node
    from torch.fx.node import Argument

    from qnnx_export._fast._registry import OpTable

__all__ = ["MAX_FOLD_BYTES", "Attrs", "Declined", "Operand", "Result", "Translator", "ir_dtype"]

# Folded constants bigger than this are refused (the graph then goes to torch.onnx), so that folding
# never materializes a huge tensor (an expand of a parameter, say) that a runtime op would compute.
MAX_FOLD_BYTES = 64 * 1024 * 1024

Operand: TypeAlias = "Node | bool | int | float"
"""An FX argument that is a tensor (a node) or a Python scalar."""

Result: TypeAlias = "ir.Value | torch.Tensor | Sequence[ir.Value | None]"
"""What a handler returns for its node: its ONNX value, the values of a multi-output node (``None`` for outputs
nobody reads), or a real tensor (a constant; it becomes an initializer where it is used)."""

Attrs: TypeAlias = "Mapping[str, bool | int | float | str | Sequence[int]]"
"""ONNX attributes of an emitted node."""


class Declined(Exception):
    """The fast path cannot translate this graph faithfully; the message says why.

    Attributes:
        lifted: When the writes of the graph were lifted before the translation declined: the functional ATen trace
            (its outputs: the graph's results, then what each write returns) and its writes, so that another
            exporter can take the trace without dropping the writes; None otherwise.
    """

    def __init__(self, message: str, *, lifted: tuple[Any, tuple[Any, ...]] | None = None) -> None:
        super().__init__(message)
        self.lifted = lifted


def ir_dtype(dtype: torch.dtype) -> ir.DataType:
    """The ONNX dtype of a torch dtype; declines those without one."""
    from onnx_ir.tensor_adapters import from_torch_dtype

    try:
        return from_torch_dtype(dtype)
    except TypeError as exc:
        raise Declined(f"dtype {dtype} has no ONNX translation here") from exc


def _contiguous(tensor: torch.Tensor, name: str) -> ir.TensorProtocol:
    """The contiguous bytes of a view, made when an initializer's value is read (see ``Translator.initializer``)."""
    from onnx_ir.tensor_adapters import TorchTensor

    return TorchTensor(tensor.contiguous(), name=name)


def _static_int(v: Any) -> int:
    try:
        return int(v)
    except Exception as exc:  # a symbolic size the specialization did not resolve
        raise Declined(f"non-static integer {v!r}") from exc


class Translator:
    """Walks an ATen graph in order, writing ONNX nodes into an onnx_ir graph.

    Args:
        traced: The ATen graph to translate (every node's ``meta["val"]`` is its fake value).
        constants: Placeholder position -> real tensor, for the parameters and buffers.
        opset: ONNX opset of the model.
        table: The handlers, and the dtypes translated.

    Attributes:
        traced: The ATen graph.
        opset: ONNX opset of the model.
        nodes: The ONNX nodes written so far, in order.
        initializers: The initializers made so far, by name.
        origins: For each ONNX node, where it comes from (``"<module path> (<class>): <aten op>"``).
    """

    def __init__(
        self, traced: torch.fx.GraphModule, constants: Mapping[int, torch.Tensor], opset: int, table: OpTable
    ) -> None:
        self.traced = traced
        self.opset = opset
        self.nodes: list[ir.Node] = []
        self.initializers: dict[str, ir.Value] = {}
        self.origins: dict[str, str] = {}
        self._constants = constants
        self._table = table
        # (data_ptr, layout) -> (the tensor, its initializer). The tensor is kept so that its memory is
        # not freed and reused by a later folded tensor of the same layout, which would then be given
        # this initializer (a silently wrong weight).
        self._init_by_tensor: dict[tuple[Any, ...], tuple[torch.Tensor, ir.Value]] = {}
        # FX node -> its translation: an ir.Value, a real tensor (folded constant) or a tuple of them.
        self._env: dict[Node, Any] = {}
        self._names = UniqueNames()
        self._current: Node | None = None
        self._folded_bn: dict[Node, Node] = {}  # conv node -> the batch norm folded into it

    # -- values --

    def _name(self, hint: str) -> str:
        return self._names(hint)

    def initializer(self, tensor: torch.Tensor, hint: str) -> ir.Value:
        """An initializer holding ``tensor`` (the same one again for the same tensor memory and layout).

        Args:
            tensor: A real tensor, kept without a copy. A view that is not contiguous (a Linear's ``t(weight)``
                under ``mm``, an expanded constant) becomes its contiguous bytes only when they are read (the model
                written to disk, a pass reading the value), one tensor at a time and not kept: a decoder's
                transposed weights would otherwise be a second copy of its weights in memory for as long as the
                export lives.
            hint: The base of the initializer's name.
        """
        import onnx_ir as ir
        from onnx_ir.tensor_adapters import TorchTensor

        tensor = tensor.detach()
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())
        if tensor.numel() > 0 and key in self._init_by_tensor:
            return self._init_by_tensor[key][1]
        name = self._name(hint)
        dtype, shape = ir_dtype(tensor.dtype), ir.Shape(tuple(tensor.shape))
        const: ir.TensorProtocol = (
            TorchTensor(tensor, name=name)
            if tensor.is_contiguous()
            else ir.LazyTensor(functools.partial(_contiguous, tensor, name), dtype=dtype, shape=shape, name=name)
        )
        value = ir.Value(name=name, type=ir.TensorType(dtype), shape=shape, const_value=const)
        self.initializers[name] = value
        if tensor.numel() > 0:
            self._init_by_tensor[key] = (tensor, value)
        return value

    def scalar(self, value: float | int | bool, dtype: torch.dtype) -> ir.Value:
        """A 0-d initializer of ``dtype``."""
        import torch

        return self.initializer(torch.tensor(value, dtype=dtype), f"const_{dtype}".replace("torch.", ""))

    def ints(self, values: Sequence[int], hint: str = "shape") -> ir.Value:
        """A 1-d int64 initializer (shapes, axes, pads...)."""
        import torch

        return self.initializer(torch.tensor(list(values), dtype=torch.int64), hint)

    def value(self, x: Argument) -> ir.Value:
        """The ONNX value of an FX argument (a constant becomes an initializer on first use)."""
        import onnx_ir as ir
        import torch
        import torch.fx

        if isinstance(x, torch.fx.Node):
            got = self._env[x]
            if isinstance(got, ir.Value):
                return got
            if isinstance(got, torch.Tensor):
                value = self.initializer(got, x.name)
                self._env[x] = value
                return value
            raise Declined(f"node {x.name} is a {type(got).__name__}, not a tensor")
        raise Declined(f"expected a tensor argument, got {x!r}")

    def operand(self, x: Argument, dtype: torch.dtype) -> ir.Value:
        """``x`` (an FX node or a Python scalar) as an ONNX value of ``dtype``, cast when needed."""
        import torch.fx

        if isinstance(x, torch.fx.Node):
            have = x.meta["val"].dtype
            v = self.value(x)
            if have == dtype:
                return v
            return self.emit1("Cast", [v], {"to": int(ir_dtype(dtype))}, dtype=dtype, shape=tuple(x.meta["val"].shape))
        if isinstance(x, (bool, int, float)):
            return self.scalar(x, dtype)
        raise Declined(f"unsupported operand {x!r}")

    def constant_of(self, x: Node) -> torch.Tensor | None:
        """The real tensor of ``x`` when it is a constant (a parameter, a buffer or a folded value), else None.

        Raises:
            KeyError: ``x`` has no translation yet (an argument of the node being translated always has one).
        """
        import torch

        got = self._env[x]
        return got if isinstance(got, torch.Tensor) else None

    # -- nodes --

    def emit(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        attrs: Attrs | None = None,
        *,
        outputs: Sequence[tuple[torch.dtype, tuple[int, ...]]],
    ) -> list[ir.Value]:
        """Write one ONNX node for the node being translated; its outputs have the given dtypes and shapes."""
        return self._emit(self._current, op, inputs, attrs, outputs)

    def emit1(
        self,
        op: str,
        inputs: Sequence[ir.Value | None],
        attrs: Attrs | None = None,
        *,
        dtype: torch.dtype,
        shape: tuple[int, ...],
    ) -> ir.Value:
        """Write one single-output ONNX node for the node being translated."""
        return self._emit(self._current, op, inputs, attrs, [(dtype, shape)])[0]

    def out(self, op: str, inputs: Sequence[ir.Value | None], attrs: Attrs | None = None) -> ir.Value:
        """Emit one node whose single output is the current FX node's value."""
        assert self._current is not None
        val = self._current.meta["val"]
        return self.emit1(op, inputs, attrs, dtype=val.dtype, shape=tuple(val.shape))

    def emit_for_node(
        self, node: Node, op: str, inputs: Sequence[ir.Value | None], attrs: Attrs | None = None
    ) -> ir.Value:
        """Write one ONNX node that computes ``node`` (its first output, for a multi-output node) in place of the node
        being translated, named after ``node`` and traced back to it: a fused node that stands for a later FX node
        (the batch norm folded into a convolution)."""
        val = node.meta["val"]
        val = val[0] if isinstance(val, (tuple, list)) else val
        return self._emit(node, op, inputs, attrs, [(val.dtype, tuple(val.shape))])[0]

    def _emit(
        self,
        for_node: Node | None,
        op: str,
        inputs: Sequence[ir.Value | None],
        attrs: Attrs | None,
        outputs: Sequence[tuple[torch.dtype, tuple[int, ...]]],
    ) -> list[ir.Value]:
        import onnx_ir as ir

        hint = for_node.name if for_node is not None else op.lower()
        out_values = [
            ir.Value(name=self._name(hint), type=ir.TensorType(ir_dtype(dt)), shape=ir.Shape(shape))
            for dt, shape in outputs
        ]
        attributes: list[ir.Attr] = []
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
        origin = self._origin(for_node)
        if origin:
            self.origins[cast(str, node.name)] = origin  # named just above
        self.nodes.append(node)
        return out_values

    @staticmethod
    def _origin(node: Node | None) -> str | None:
        if node is None:
            return None
        op = str(getattr(node.target, "__name__", node.target)).removesuffix(".default")
        op = f"aten.{op}" if not op.startswith("aten.") and hasattr(node.target, "_schema") else op
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return op
        path, kind = list(stack.values())[-1]
        kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
        return module_origin(str(path), kind_name, op)

    # -- fusion --

    def folded_batch_norm(self, conv: Node) -> Node | None:
        """The batch norm (inference, sole user of ``conv``) that can be folded into convolution ``conv``, if any."""
        return self._folded_bn.get(conv)

    def set_result(self, node: Node, result: Result) -> None:
        """Give a later node its translation ahead of its turn (a batch norm folded into its convolution)."""
        self._env[node] = result

    def result_of(self, node: Node) -> Any:
        """The translation ``node`` was given ahead of its turn by :meth:`set_result` (or already has), else None."""
        return self._env.get(node)

    # -- the walk --

    def run(self, user_positions: Sequence[tuple[str, int]]) -> tuple[list[ir.Value], list[ir.Value]]:
        """Translate the whole graph.

        Args:
            user_positions: ``(ONNX input name, placeholder position)`` of the runtime inputs.

        Returns:
            The ONNX graph's inputs and outputs.
        """
        import onnx_ir as ir
        import torch

        names = dict((i, name) for name, i in user_positions)
        inputs: list[ir.Value] = []
        placeholders = [n for n in self.traced.graph.nodes if n.op == "placeholder"]
        self._plan_batchnorm_folding()
        for pos, node in enumerate(placeholders):
            if pos in self._constants:
                self._env[node] = self._constants[pos]
            elif pos in names:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    raise Declined(f"input {names[pos]} is a {type(val).__name__}, not a tensor")
                value = ir.Value(
                    name=names[pos], type=ir.TensorType(ir_dtype(val.dtype)), shape=ir.Shape(tuple(val.shape))
                )
                self._names.take(names[pos])
                self._env[node] = value
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

    def _translate(self, node: Node) -> None:
        import torch

        if node.op == "get_attr":
            self._env[node] = getattr(self.traced, str(node.target))
            return
        if node.op != "call_function":
            raise Declined(f"FX node {node.name} has op {node.op!r}")
        if node.target is operator.getitem:
            seq, index = cast("tuple[Node, int]", node.args)
            got = self._env[seq]
            if not isinstance(got, tuple | list):
                raise Declined(f"getitem on {seq.name}, which is not a sequence")
            self._env[node] = got[index]
            return
        if self._is_constant(node):
            self._env[node] = self._fold(node)
            return
        handler = self._table.handlers.get(node.target)  # type: ignore[call-overload]  # fx types Node.target loosely; here it is an OpOverload
        if handler is None:
            raise Declined(f"no translation for {node.target}")
        dtypes = self._table.dtypes
        for x in (*node.args, *node.kwargs.values()):
            for leaf in x if isinstance(x, (list, tuple)) else (x,):
                val = fake(leaf)
                if isinstance(val, torch.Tensor) and val.dtype not in dtypes:
                    raise Declined(f"{node.target} on dtype {val.dtype}")
        val = node.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(v, torch.Tensor) and v.dtype not in dtypes:
                raise Declined(f"{node.target} gives dtype {v.dtype}")
        result = handler(self, node, *node.args, **node.kwargs)
        self._check(node, result)
        self._env[node] = result

    @staticmethod
    def _check(node: Node, result: Result) -> None:
        """Every value a handler returns must have exactly the dtype and shape PyTorch computed."""
        import onnx_ir as ir

        vals = node.meta["val"] if isinstance(result, tuple) else (node.meta["val"],)
        results = result if isinstance(result, tuple) else (result,)
        for got, want in zip(results, vals, strict=False):
            if not isinstance(got, ir.Value):
                continue
            # Every value the translator makes has a shape.
            got_shape = cast("ir.Shape", got.shape)
            if got.dtype != ir_dtype(want.dtype) or tuple(got_shape) != tuple(int(s) for s in want.shape):
                raise Declined(
                    f"{node.target} at {node.name} would give {got.dtype}{tuple(got_shape)}, PyTorch gives "
                    f"{want.dtype}{tuple(want.shape)}"
                )

    def _is_constant(self, node: Node) -> bool:
        import torch
        import torch.fx

        # Every random op (randint, normal, multinomial, poisson, rand with a generator...) carries
        # this tag; folding one would freeze one draw into the model (and consume the caller's RNG).
        if node.target in self._table.nondeterministic or torch.Tag.nondeterministic_seeded in getattr(
            node.target, "tags", ()
        ):
            return False
        for x in (*node.args, *node.kwargs.values()):
            for leaf in x if isinstance(x, (list, tuple)) else (x,):
                if isinstance(leaf, torch.fx.Node) and not isinstance(self._env.get(leaf), torch.Tensor):
                    return False
        return True

    def _fold(self, node: Node) -> Any:
        import torch
        import torch.fx

        def real(x: Any) -> Any:
            if isinstance(x, torch.fx.Node):
                return self._env[x]
            if isinstance(x, (list, tuple)):
                return type(x)(real(v) for v in x)
            return x

        schema = getattr(node.target, "_schema", None)
        if schema is None or not _pure_call(schema, node):
            raise Declined(f"cannot fold {node.target}: not a pure ATen op")
        with torch.no_grad():
            result = node.target(*real(node.args), **real(node.kwargs))  # type: ignore[operator]  # fx types Node.target loosely; here it is an OpOverload
        for t in result if isinstance(result, (list, tuple)) else (result,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > MAX_FOLD_BYTES and t._base is None:
                raise Declined(f"folding {node.name} would materialize {t.numel() * t.element_size()} bytes")
        return result

    def _plan_batchnorm_folding(self) -> None:
        """Find convolution -> batch norm (inference) pairs whose BN can be folded into the conv."""
        import torch

        aten = torch.ops.aten
        for node in self.traced.graph.nodes:
            if node.op != "call_function" or node.target is not aten.native_batch_norm.default:
                continue
            conv = node.args[0]
            if (
                getattr(conv, "target", None) is aten.convolution.default
                and len(conv.users) == 1
                and not conv.args[6]  # not transposed
                and node.args[5] is False  # inference
                and only_first_output_used(node)
            ):
                self._folded_bn[conv] = node


def _pure_call(schema: Any, node: Node) -> bool:
    """Whether calling ``node``'s op writes none of its arguments: its schema writes none, or every argument it may
    write is None in this call (``native_batch_norm`` without running statistics updates nothing)."""
    if not schema.is_mutable:
        return True
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.kwargs[arg.name] if arg.name in node.kwargs else node.args[k] if k < len(node.args) else None
        if value is not None:
            return False
    return True
