"""``linspace`` and ``logspace`` whose start or end is a runtime tensor (``torch.linspace(lo, hi, steps)`` with
0-d tensor endpoints). With both endpoints Python numbers the op is a constant and is folded before it gets here.

Written as eager PyTorch computes them on the CPU: ``step = (end - start) / (steps - 1)``; the first ``steps // 2``
points are ``start + step * i`` and the others ``end - step * (steps - 1 - i)``, so both ends are exact; logspace is
``base ** point`` of the same points. An endpoint tensor of another dtype (an int64 ``tensor(2)``) is converted to
the output's dtype first, as ``Tensor.item()`` followed by the conversion to the output's scalar type does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qnnx_export._fast._nodes import fake
from qnnx_export._fast._registry import handles
from qnnx_export._fast._translator import Declined, Translator

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch.fx import Node

aten = torch.ops.aten


def _endpoint(t: Translator, x: Node | int | float, dtype: torch.dtype) -> ir.Value:
    """An endpoint as a ``[1]`` value of the output's dtype."""
    if isinstance(x, (bool, complex)) or (not isinstance(x, (int, float)) and fake(x).numel() != 1):
        raise Declined(f"linspace/logspace endpoint {x!r} (a real number or a one-element tensor)")
    if not isinstance(x, (int, float)) and (fake(x).is_complex() or fake(x).dtype == torch.bool):
        raise Declined(f"linspace/logspace endpoint of dtype {fake(x).dtype}")
    value = t.operand(x, dtype)
    return t.emit1("Reshape", [value, t.ints([1])], dtype=dtype, shape=(1,))


def points(
    t: Translator, node: Node, start: Node | int | float, end: Node | int | float, steps: int
) -> tuple[ir.Value, torch.dtype]:
    """The ``[steps]`` points of ``linspace(start, end, steps)`` in the node's output dtype."""
    dtype = node.meta["val"].dtype
    if not dtype.is_floating_point:
        # Integer outputs truncate a double-precision computation, which float16 on HTP does not reproduce.
        raise Declined(f"{node.target} with output dtype {dtype} (floating-point outputs are translated)")
    if steps < 1:
        raise Declined(f"{node.target} with {steps} steps: an empty output")
    lo = _endpoint(t, start, dtype)
    if steps == 1:
        return lo, dtype
    hi = _endpoint(t, end, dtype)
    span = t.emit1("Sub", [hi, lo], dtype=dtype, shape=(1,))
    step = t.emit1("Div", [span, t.scalar(steps - 1, dtype)], dtype=dtype, shape=(1,))
    half = steps // 2
    rising = torch.arange(half, dtype=dtype)  # i, from the start
    falling = -torch.arange(steps - half - 1, -1, -1, dtype=dtype)  # -(steps - 1 - i), to the end
    first = t.emit1(
        "Add",
        [lo, t.emit1("Mul", [step, t.initializer(rising, "linspace_rise")], dtype=dtype, shape=(half,))],
        dtype=dtype,
        shape=(half,),
    )
    second = t.emit1(
        "Add",
        [hi, t.emit1("Mul", [step, t.initializer(falling, "linspace_fall")], dtype=dtype, shape=(steps - half,))],
        dtype=dtype,
        shape=(steps - half,),
    )
    return t.emit1("Concat", [first, second], {"axis": 0}, dtype=dtype, shape=(steps,)), dtype


@handles(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def _linspace(
    t: Translator, node: Node, start: Node | int | float, end: Node | int | float, steps: int, **kwargs: object
) -> ir.Value:
    """``linspace`` with a tensor endpoint."""
    value, _ = points(t, node, start, end, steps)
    return value


@handles(aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def _logspace(
    t: Translator,
    node: Node,
    start: Node | int | float,
    end: Node | int | float,
    steps: int,
    base: float = 10.0,
    **kwargs: object,
) -> ir.Value:
    """``logspace`` with a tensor endpoint: ``base ** linspace(start, end, steps)``, written ``exp(ln(base) * point)``.

    Not ONNX's ``Pow``: on the HTP simulator a ``Pow`` of a constant base whose exponent is this concatenation of
    sums returned 0 for an element (``logspace(4.3, 4, 2, base=5)`` gave ``[1014, 0]``), while ``Exp`` of the same
    exponent is right. The cost is precision: float16 rounds ``ln(base) * point`` to a step of up to 1/128 below
    float16's limit (``ln(65504)`` is 11.1), so an output may be off by about half a percent (``10 ** 4.3``: 0.48%
    on the simulator, where ``Pow`` gave 0.16%).
    """
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 0:
        # A negative base gives NaN at fractional points and needs integer powers elsewhere; zero gives 0 or inf.
        raise Declined(f"logspace with base {base!r} (a positive base is translated)")
    exponent, dtype = points(t, node, start, end, steps)
    scaled = t.emit1("Mul", [exponent, t.scalar(math.log(base), dtype)], dtype=dtype, shape=(steps,))
    return t.out("Exp", [scaled])
