"""Length buckets: serve a dynamic dimension with a few static QNN graphs, padding inputs and slicing outputs (private).

A QNN graph has static shapes, and a QNN compile takes seconds to minutes on a device: compiling one graph per prompt
length stalls every new length. A graph whose dynamic sizes are plain tensor dimensions (a sequence length) is
compiled for a few bucket sizes instead: the inputs are padded along those dimensions to the bucket (zeros; False
for bools; a padded attention mask masks the padding) and the outputs sliced back.

Padding is trusted only once it is proven neutral: for each bucket the graph runs in eager PyTorch at the true size
and at the bucket size, and the sliced outputs must agree. A graph that averages over the sequence, or attends to
the padding (no mask), fails that check and keeps exact sizes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, cast

import attrs
import torch

from qnnx_backend._compare import compare_outputs

logger = logging.getLogger(__name__)

# The smallest bucket of the "auto" ladder: powers of two from here up (16, 32, 64, ...).
AUTO_MIN = 16
# Eager at the true size vs eager at the bucket size, sliced: the same math in another blocking differs by ~1e-6.
NEUTRAL_RTOL = 1e-4


@attrs.frozen
class BucketPlan:
    """How to pad a graph's inputs and slice its outputs.

    Attributes:
        sym_positions: Positions of the size arguments (SymInt placeholders) Dynamo passes.
        padded: ``(argument position, dim, size index)`` for every input dimension that is a dynamic size.
        sliced: ``(output leaf index, dim, size index)`` for every output dimension that is a dynamic size.
        upper: The largest value each size may take (Dynamo's range), or None when unbounded.
    """

    sym_positions: tuple[int, ...]
    padded: tuple[tuple[int, int, int], ...]
    sliced: tuple[tuple[int, int, int], ...]
    upper: tuple[int | None, ...]


def _symbol(value: object) -> Any:
    """The sympy symbol behind a SymInt that is a plain size, else None."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return expr if getattr(expr, "is_Symbol", False) else None
    return None


def _expr(value: object) -> Any:
    return value.node.expr if isinstance(value, torch.SymInt) else None


def _dynamic_dims(value: torch.Tensor, index: dict[Any, int], what: str) -> list[tuple[int, int]] | str:
    """``(dim, size index)`` of each dimension of ``value`` that is a plain dynamic size, or why one is not."""
    dims = []
    for dim, size in enumerate(value.shape):
        expr = _expr(size)
        if expr is None:
            continue
        if expr not in index:
            return f"{what} has size {expr} in dim {dim}"
        dims.append((dim, index[expr]))
    return dims


def make_plan(
    gm: torch.fx.GraphModule, example_inputs: Sequence[object], sym_positions: Sequence[int]
) -> BucketPlan | str:
    """The bucket plan of a graph with dynamic sizes, or the reason it cannot be bucketed."""
    # Dynamo hands the backend real example values; the symbolic sizes are on the placeholders' fake values.
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    example_inputs = [
        node.meta.get("example_value", value) for node, value in zip(placeholders, example_inputs, strict=False)
    ]
    symbols = [_symbol(example_inputs[p]) for p in sym_positions]
    if not symbols or any(s is None for s in symbols):
        return "a dynamic size is an expression, not a plain dimension"
    index = {s: i for i, s in enumerate(symbols)}
    padded: list[tuple[int, int, int]] = []
    for pos, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            continue
        dims = _dynamic_dims(value, index, f"input {pos}")
        if isinstance(dims, str):
            return dims + " (only plain dynamic dimensions can be padded)"
        padded += [(pos, dim, sym) for dim, sym in dims]
    if not padded:
        return "no input dimension carries the dynamic size"
    output = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(output.args[0])
    sliced: list[tuple[int, int, int]] = []
    for k, leaf in enumerate(leaves):
        value = leaf.meta.get("example_value") if isinstance(leaf, torch.fx.Node) else leaf
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return f"output {k} is a symbolic number"
        if not isinstance(value, torch.Tensor):
            continue
        dims = _dynamic_dims(value, index, f"output {k}")
        if isinstance(dims, str):
            return dims
        sliced += [(k, dim, sym) for dim, sym in dims]
    return BucketPlan(tuple(sym_positions), tuple(padded), tuple(sliced), _upper_bounds(symbols))


def _upper_bounds(symbols: Sequence[Any]) -> tuple[int | None, ...]:
    """Dynamo's upper bound of each size (``mark_dynamic(..., max=)``), read from the tracing ShapeEnv."""
    bounds: list[int | None] = []
    context = torch._guards.TracingContext.try_get()
    ranges = getattr(getattr(getattr(context, "fake_mode", None), "shape_env", None), "var_to_range", {})
    for sym in symbols:
        upper = getattr(ranges.get(sym), "upper", None)
        try:
            bounds.append(int(upper) if upper is not None and math.isfinite(float(upper)) else None)
        except (TypeError, ValueError):
            bounds.append(None)
    return tuple(bounds)


def ladder_bucket(size: int, ladder: str | tuple[int, ...], upper: int | None = None) -> int | None:
    """The smallest bucket of ``ladder`` that holds ``size``, or None when ``size`` is past every bucket.

    ``"auto"`` is the powers of two from :data:`AUTO_MIN` up, capped at ``upper`` (Dynamo's maximum) and never below
    ``size``; a tuple is the user's own sizes.
    """
    if ladder == "auto":
        bucket = max(AUTO_MIN, 1 << max(0, size - 1).bit_length())
        return max(min(bucket, upper), size) if upper is not None else bucket
    fitting = [b for b in cast("tuple[int, ...]", ladder) if b >= size]  # any str but "auto" is refused earlier
    return min(fitting) if fitting else None


def choose(sizes: Sequence[int], plan: BucketPlan, ladder: str | tuple[int, ...]) -> tuple[int, ...] | None:
    """The bucket for these sizes (one per dynamic size), or None when a size is past every bucket."""
    chosen = []
    for size, upper in zip(sizes, plan.upper, strict=True):
        bucket = ladder_bucket(size, ladder, upper)
        if bucket is None:
            return None
        chosen.append(bucket)
    return tuple(chosen)


def pad(args: Sequence[object], plan: BucketPlan, bucket: Sequence[int]) -> list[object]:
    """The arguments padded to ``bucket`` along every dynamic dimension (zeros, False for bools)."""
    out = list(args)
    for i, pos in enumerate(plan.sym_positions):
        out[pos] = int(bucket[i])
    by_arg: dict[int, list[tuple[int, int]]] = {}
    for pos, dim, sym in plan.padded:
        by_arg.setdefault(pos, []).append((dim, sym))
    for pos, dims in by_arg.items():
        tensor = out[pos]
        assert isinstance(tensor, torch.Tensor)
        shape = list(tensor.shape)
        for dim, sym in dims:
            shape[dim] = int(bucket[sym])
        if shape == list(tensor.shape):
            continue
        grown = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
        grown[tuple(slice(0, n) for n in tensor.shape)] = tensor
        out[pos] = grown
    return out


def slice_outputs(result: Any, plan: BucketPlan, sizes: Sequence[int]) -> Any:
    """``result`` with every dynamic output dimension cut back to the true size."""
    leaves, spec = torch.utils._pytree.tree_flatten(result)
    for k, dim, sym in plan.sliced:
        leaf = leaves[k]
        if isinstance(leaf, torch.Tensor) and leaf.shape[dim] != sizes[sym]:
            leaves[k] = leaf.narrow(dim, 0, int(sizes[sym]))
    return torch.utils._pytree.tree_unflatten(leaves, spec)


def neutral(gm: torch.fx.GraphModule, args: Sequence[object], plan: BucketPlan, bucket: Sequence[int]) -> str | None:
    """None when padding to ``bucket`` leaves the outputs at the true size unchanged (checked in eager PyTorch),
    else what differs."""
    sizes = [int(args[p]) for p in plan.sym_positions]  # type: ignore[call-overload]
    with torch.no_grad():
        true = gm(*args)
        padded = slice_outputs(gm(*pad(args, plan, bucket)), plan, sizes)
    return compare_outputs(padded, true, NEUTRAL_RTOL)
