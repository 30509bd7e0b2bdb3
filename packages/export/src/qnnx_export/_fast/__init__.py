"""The direct translator: ATen graph -> ONNX, without torch.export and torch.onnx.

``torch.onnx.export`` re-traces the graph with torch.export, runs the decompositions, builds its
ATen->ONNX registry (once per process) and optimizes the result: most of a cold first call for the
benchmark models (docs/benchmarks.md has the figures). The graphs Dynamo hands a backend are already traced
and, once specialized, have static shapes. So for graphs made only of the ops in the table we trace the
Dynamo graph to ATen with fake tensors (``make_fx``) and write each ATen node as the
ONNX nodes that compute the same thing, with every shape known. Anything outside the table (an op,
a dtype, an argument value) makes :func:`translate` raise :class:`Declined`, and the caller uses
torch.onnx instead: the fast path never guesses.

Values that depend only on parameters, buffers and constants are computed here with PyTorch on the
real tensors (constant folding), so weight transposes, slices of fused projections and position ids
become initializers, as torch.onnx's optimizer would make them. BatchNorm after a convolution is
folded into the convolution's weights (in float64) for the same reason.

The package: ``_trace`` (make_fx), ``_translator`` (the walk, and the API the handlers write through),
``_registry`` (the op table, built once on first use) and the handlers by op family (``_ops_*``). Importing it
imports neither torch nor onnx.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs

from qnnx_export._fast._registry import REGISTRY, OpTable, import_op_modules
from qnnx_export._fast._trace import trace_aten
from qnnx_export._fast._translator import Declined, Translator, ir_dtype
from qnnx_export._options import DEFAULT_MAX_DENSE_EXPERTS, DEFAULT_MAX_GATHERED_EXPERT_BYTES

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch
    import torch.fx

__all__ = ["Declined", "Write", "supported_ops", "trace_aten", "translate", "translate_aten"]


def _register() -> None:
    """Import the op-family modules, whose ``@handles`` decorators record their handlers in the registry."""
    import_op_modules()


def _op_table() -> OpTable:
    # _register is looked up at each call, not bound once: integration-tests/test_threads.py replaces it to count
    # the builds.
    return REGISTRY.table(_register)


def supported_ops() -> list[str]:
    """The ATen overloads the fast path translates (anything else goes to torch.onnx)."""
    return sorted(str(op) for op in _op_table().handlers)


def translate(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    param_indices: Sequence[int],
    user_inputs: Sequence[tuple[str, int]],
    outputs: Sequence[Any],
    opset: int,
    written: Sequence[int] = (),
    max_dense_experts: int = DEFAULT_MAX_DENSE_EXPERTS,
    max_gathered_expert_bytes: int = DEFAULT_MAX_GATHERED_EXPERT_BYTES,
) -> tuple[ir.Model, dict[str, str], tuple[Write, ...]]:
    """Translate a Dynamo graph to an ONNX model, or raise :class:`Declined`.

    Args:
        gm: Dynamo's graph (not modified).
        example_inputs: Dynamo's real arguments (parameters included).
        param_indices: Positions of the parameters and buffers among the placeholders.
        user_inputs: ``(ONNX input name, placeholder position)`` of the runtime inputs.
        outputs: The nodes of ``gm`` that become ONNX outputs, in order.
        opset: ONNX opset of the model.
        written: Placeholder positions the graph writes in place. What each write needs (see :class:`Write`)
            becomes extra outputs after ``outputs``, in this order; a write the trace does not show, or any other
            in-place write, declines.

    Returns:
        The model (initializers hold the real weights, without copies where they are contiguous), the origin of
        each ONNX node (``"<module path> (<class>): <aten op>"``) and one :class:`Write` per written position.
    """
    import torch

    table = _op_table()
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise Declined(f"argument {i} is a {type(x).__name__}")
        if x.dtype not in table.dtypes:
            raise Declined(f"argument {i} has dtype {x.dtype}")
    try:
        traced = trace_aten(
            gm,
            example_inputs,
            outputs,
            max_dense_experts=max_dense_experts,
            max_gathered_expert_bytes=max_gathered_expert_bytes,
        )
    except Declined:
        raise
    except Exception as exc:  # the graph does not trace to ATen with fake tensors: torch.onnx decides
        raise Declined(
            f"ATen tracing failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    writes = _lift_writes(traced, written, user_positions={i for _, i in user_inputs})
    constants = {i: example_inputs[i].detach() for i in param_indices}
    try:
        model, origins = translate_aten(traced, constants, user_inputs=user_inputs, opset=opset)
    except Declined as exc:
        raise Declined(str(exc), lifted=(traced, writes) if written else None) from exc
    return model, origins, writes


def _computed_from(target: Any) -> set[Any]:
    """Every FX node computed from ``target`` (``target`` included): one walk along the users, linear in the graph.

    (A walk back from each node along its inputs, memoized only after the walk, revisited every shared value and
    grew exponentially with a decoder's depth: a 4-layer decode step took minutes.)"""
    found = {target}
    todo = [target]
    while todo:
        for user in todo.pop().users:
            if user not in found:
                found.add(user)
                todo.append(user)
    return found


@functools.cache
def _partial_writes() -> dict[Any, tuple[int, ...]]:
    """ATen ops that write part of their first argument -> the positions of the arguments that say what is written
    (positions and values)."""
    import torch

    aten = torch.ops.aten
    return {
        aten.index_copy.default: (2, 3),
        aten.slice_scatter.default: (1,),
        aten.select_scatter.default: (1,),
        aten.index_put.default: (1, 2),
    }


@functools.cache
def _moves() -> dict[Any, tuple[int, ...]]:
    """ATen ops whose output elements are copies of their data arguments' elements -> the positions of those
    arguments (a list argument counts as all of its tensors). Other arguments only say which elements go where."""
    import torch

    aten = torch.ops.aten
    first = (0,)
    return {
        **dict.fromkeys(
            (
                aten.roll.default,
                aten.slice.Tensor,
                aten.select.int,
                aten.index_select.default,
                aten.index.Tensor,
                aten.gather.default,
                aten.flip.default,
                aten.clone.default,
                aten.alias.default,
                aten.view.default,
                aten._unsafe_view.default,
                aten.reshape.default,
                aten.permute.default,
                aten.transpose.int,
                aten.expand.default,
                aten.unsqueeze.default,
                aten.squeeze.dim,
                aten.squeeze.dims,
                aten.cat.default,
            ),
            first,
        ),
        aten.where.self: (1, 2),
    }


def _check_no_fp16_accumulation(placeholder: Any, new: Any) -> None:
    """Refuse a float tensor whose new value is arithmetic on its old one (``count += 1``, a running sum).

    HTP computes float in fp16: such state would carry fp16 rounding from call to call, and a float counter stops
    at 2048. Overwrites and moves are fine: a KV cache's ``index_copy_`` of new values, a slice assignment, ``copy_``
    of a value computed without the old one, or a sliding window's ``roll`` and ``cat`` of old rows with new ones.
    Each element is then either a copy of an old one or a new value, rounded to fp16 once (rounding a value that
    fp16 already holds changes nothing, so nothing accumulates). Integer state is exact.
    """
    import torch
    import torch.fx

    if not placeholder.meta["val"].is_floating_point():
        return
    from_old = _computed_from(placeholder)
    partial, moves = _partial_writes(), _moves()

    aten = torch.ops.aten

    decided: dict[Any, bool] = {}  # each node once: values shared along many paths stay linear

    def exact(value: Any) -> bool:
        """Every element of ``value`` is a copy of an element of the old tensor or computed without it."""
        if not isinstance(value, torch.fx.Node) or value not in from_old or value is placeholder:
            return True
        if value not in decided:
            decided[value] = decide(value)
        return decided[value]

    def decide(value: Any) -> bool:
        if value.op != "call_function":
            return False
        if value.target in (aten.copy.default, aten.fill.Tensor, aten.fill.Scalar):
            return exact(value.args[1])
        if value.target is aten.index_put.default:
            accumulate = value.args[3] if len(value.args) > 3 else value.kwargs.get("accumulate", False)
            if accumulate:
                return False  # adds into the old values: the same fp16 drift as a running sum
        written = partial.get(value.target)
        # A partial write: the base keeps its other elements and the written values replace some.
        positions = (0, *written) if written is not None else moves.get(value.target, ())
        if not positions:
            return False
        args = [value.args[k] for k in positions if k < len(value.args)]
        return all(exact(a) for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg]))

    if not exact(new):
        raise Declined(
            f"float state {placeholder.name} is updated from its own value: on HTP it would accumulate fp16 "
            "rounding from call to call"
        )


@attrs.frozen
class Write:
    """How the new value of one written argument comes back, as the extra outputs :func:`translate` adds.

    Attributes:
        arg: Placeholder position of the written argument.
        dim: For a row write, the dimension ``index_copy_`` writes along; -1 for a whole-tensor write.
        index_arg: For a row write whose positions are themselves a runtime input (a KV cache's
            ``cache_position``), that input's placeholder position; -1 when the positions are an extra output.
    """

    arg: int
    dim: int = -1
    index_arg: int = -1

    @property
    def outputs(self) -> int:
        """How many extra outputs the write adds: the whole tensor (1), or the rows and their positions (1-2)."""
        return 1 if self.dim < 0 or self.index_arg >= 0 else 2


def _row_write(placeholder: Any, new: Any, user_positions: set[int], placeholders: list[Any]) -> Write | None:
    """The :class:`Write` of ``new = placeholder.index_copy(dim, index, rows)``, or None for any other update.

    Only what was written then comes back (the new rows and their positions), so the caller's write-back costs what
    the graph wrote (a few tokens of a KV cache), not the whole tensor. Rows or positions that are constants or the
    caller's own inputs returned as they are keep the whole-tensor write.
    """
    import torch

    if new.op != "call_function" or new.target is not torch.ops.aten.index_copy.default:
        return None
    base, dim, index, rows = new.args[:4]
    if base is not placeholder or not isinstance(index, torch.fx.Node) or not isinstance(rows, torch.fx.Node):
        return None
    if rows.op == "placeholder":
        return None
    position = placeholders.index(placeholder)
    rank = placeholder.meta["val"].dim()
    axis = dim + rank if dim < 0 else dim
    if index.op == "placeholder":
        arg = placeholders.index(index)
        return Write(position, axis, arg) if arg in user_positions else None
    return Write(position, axis)


def _lift_writes(traced: torch.fx.GraphModule, written: Sequence[int], user_positions: set[int]) -> tuple[Write, ...]:
    """Turn the functionalized trace's final ``copy_(input, new)`` nodes into extra outputs, in ``written`` order.

    ``functionalize(remove="mutations")`` ends the trace with one ``aten.copy_`` per input it writes. Every write
    must be found exactly once, and no other in-place op may remain: a write that would not come back to the
    caller is never accepted. A row write (``index_copy_``, how a KV cache takes new tokens) returns the rows and
    their positions; any other write returns the whole new tensor.
    """
    import torch

    graph = traced.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    copies: dict[int, Any] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default:
            continue
        target = node.args[0]
        if not isinstance(target, torch.fx.Node) or target.op != "placeholder":
            raise Declined(f"in-place copy into {target} (not a graph input)")
        position = placeholders.index(target)
        if position not in written or position in copies:
            raise Declined(f"an in-place write into argument {position} was not expected")
        copies[position] = node
    missing = [i for i in written if i not in copies]
    if missing:
        raise Declined(f"the trace shows no write into argument(s) {missing}, which the graph updates in place")
    if not written:
        return ()
    for i in written:
        _check_no_fp16_accumulation(placeholders[i], copies[i].args[1])
    output = next(n for n in graph.nodes if n.op == "output")
    writes: list[Write] = []
    values: list[Any] = []
    for i in written:
        new = copies[i].args[1]
        row = _row_write(placeholders[i], new, user_positions, placeholders)
        if row is None:
            writes.append(Write(i))
            values.append(new)
        else:
            writes.append(row)
            values.append(new.args[3])
            if row.index_arg < 0:
                values.append(new.args[2])
    for i in written:
        graph.erase_node(copies[i])
    output.args = ((*output.args[0], *values),)
    traced.recompile()
    return tuple(writes)


def translate_aten(
    traced: torch.fx.GraphModule,
    constants: Mapping[int, torch.Tensor],
    *,
    user_inputs: Sequence[tuple[str, int]],
    opset: int,
) -> tuple[ir.Model, dict[str, str]]:
    """Translate an ATen graph to an ONNX model, or raise :class:`Declined`: the second half of :func:`translate`.

    Args:
        traced: An ATen graph whose nodes' ``meta["val"]`` hold their fake values, as :func:`trace_aten` makes it;
            its output node returns a tuple.
        constants: Placeholder position -> real tensor, for the parameters and buffers.
        user_inputs: ``(ONNX input name, placeholder position)`` of the runtime inputs.
        opset: ONNX opset of the model.

    Returns:
        The model and the origin of each ONNX node, as for :func:`translate`.
    """
    import onnx_ir as ir

    translator = Translator(traced, constants, opset, _op_table())
    inputs, outs = translator.run(user_inputs)
    for value, node in zip(outs, next(n for n in traced.graph.nodes if n.op == "output").args[0], strict=True):
        val = node.meta["val"]
        shape = cast("ir.Shape", value.shape)  # every value the translator makes has a shape
        if value.dtype != ir_dtype(val.dtype) or tuple(shape) != tuple(val.shape):
            raise Declined(f"output {node.name} came out as {value.dtype}{tuple(shape)}")
    graph = ir.Graph(
        inputs,
        outs,
        nodes=translator.nodes,
        initializers=list(translator.initializers.values()),
        opset_imports={"": opset},
        name="main_graph",
    )
    return ir.Model(graph, ir_version=10), translator.origins
