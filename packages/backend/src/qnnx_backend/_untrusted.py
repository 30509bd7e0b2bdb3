"""Calls whose QNN results cannot be trusted (private; imports neither torch nor, until a check runs, numpy).

HTP computes float graphs in float16 and holds no NaN or infinity: it reads a NaN input as an ordinary number, misreads
an input beyond float16's range, and returns a number beyond that range where a result is NaN or infinite. It computes
integers in int32 and saturates. The checks here find NaN inputs, integer inputs beyond the bounds qnnx-export proved
for the graph's int32 arithmetic, and such results around one run (and clip out-of-range inputs to float16's range),
before anything is written, for the torch path (which then computes the call in PyTorch, or raises) and for the
torch-free loader (which raises).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "FP16_MAX",
    "BeyondHalfRange",
    "BeyondHalfRangeInput",
    "IntegerBeyondBound",
    "NaNInput",
    "UntrustedRun",
    "check_half_range",
    "check_inputs",
    "check_integer_inputs",
    "integer_bounds",
]

FP16_MAX = 65504.0
"""float16's largest finite value. HTP computes float graphs in float16: it saturates there, and where a result is
NaN or infinite it returns a number beyond it (131008 on the simulator), which no float16 computation gives."""


class UntrustedRun(Exception):
    """A QNN call whose results cannot be trusted, found before any write into the caller's tensors, so the arguments
    are as the caller passed them. :attr:`why` says what HTP does with such values."""

    why = ""


class BeyondHalfRange(UntrustedRun):
    """A QNN run returned a float beyond float16's range."""

    why = (
        "HTP holds no NaN or infinity and returns such a number where eager PyTorch has NaN, an infinity or a value "
        "beyond float16's range"
    )

    def __init__(self, output: str, value: float) -> None:
        self.output = output
        self.value = value
        super().__init__(f"ONNX output {output!r} holds {value:g}, beyond float16's +-{FP16_MAX:g}")


class NaNInput(UntrustedRun):
    """A float input of a QNN call holds NaN: not run on QNN."""

    why = (
        "HTP holds no NaN and reads it as an ordinary number (131008), so the results would be finite where eager "
        "PyTorch propagates NaN"
    )

    def __init__(self, name: str) -> None:
        self.input = name
        super().__init__(f"ONNX input {name!r} holds NaN")


class BeyondHalfRangeInput(UntrustedRun):
    """A float input of a QNN call holds a value beyond float16's range, and this graph is not known to give
    eager's results with such inputs clipped to +-65504."""

    why = (
        "HTP misreads a float beyond float16's range (no comparison with it comes out right), and clipped to "
        "+-65504 it changes every result that depends on its size (x * 0.5, x == -inf, x < -1e6); this graph's "
        "results with such inputs clipped were not found equal to eager PyTorch's"
    )

    def __init__(self, name: str | None, value: float | None, problem: str | None = None) -> None:
        self.input = name
        self.value = value
        if problem is not None:
            message = f"a float input beyond float16's +-{FP16_MAX:g}, clipped to it for HTP, made a result differ ({problem})"
        else:
            message = f"ONNX input {name!r} holds {value:g}, beyond float16's +-{FP16_MAX:g}"
        super().__init__(message)


class IntegerBeyondBound(UntrustedRun):
    """An integer input of a QNN call is larger than the graph's integer arithmetic provably takes."""

    why = (
        "HTP computes integers in int32 and saturates, and with an input this large the graph's integer arithmetic "
        "may leave int32 (where PyTorch's int64 does not overflow)"
    )

    def __init__(self, name: str, value: int, bound: int) -> None:
        self.input = name
        super().__init__(f"ONNX input {name!r} holds {value}, beyond {bound} in magnitude")


def integer_bounds(inputs: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """``(name, max_abs)`` of the signature's inputs that carry a bound (``InputSpec`` objects or their dicts)."""
    pairs = ((i["name"], i.get("max_abs")) if isinstance(i, dict) else (i.name, i.max_abs) for i in inputs)
    return tuple((name, int(bound)) for name, bound in pairs if bound is not None)


def check_integer_inputs(bounds: Sequence[tuple[str, int]], feed: dict[str, Any]) -> None:
    """Raise :class:`IntegerBeyondBound` for the first ``(name, max_abs)`` of ``bounds`` whose array in ``feed``
    holds a magnitude above ``max_abs`` (two passes over each such array; they are ids, positions and masks)."""
    for name, bound in bounds:
        array = feed.get(name)
        if array is None or not array.size:
            continue
        high, low = int(array.max()), int(array.min())
        if high > bound or low < -bound:
            raise IntegerBeyondBound(name, high if high > bound else low, bound)


def check_half_range(names: Sequence[str], outs: Sequence[Any]) -> None:
    """Raise :class:`BeyondHalfRange` for the first float output that holds NaN, an infinity or a value beyond
    float16's range (two passes over each float output; no copy)."""
    import numpy as np

    for name, out in zip(names, outs):
        if not (isinstance(out, np.ndarray) and out.dtype.kind == "f" and out.size):
            continue
        low, high = out.min(), out.max()
        if low >= -FP16_MAX and high <= FP16_MAX:  # False for NaN
            continue
        worst = float(high) if np.isnan(high) or high > FP16_MAX else float(low)
        raise BeyondHalfRange(name, worst)


def check_inputs(names: Sequence[str], feed: dict[str, Any], *, clip: bool = True) -> bool:
    """Raise :class:`NaNInput` for the first of ``names`` whose array in ``feed`` holds a NaN; give HTP every value
    beyond float16's range (an infinity included) as float16's largest magnitude, or with ``clip=False`` raise
    :class:`BeyondHalfRangeInput` for it. Returns whether an input was clipped.

    HTP reads such a value as something no comparison understands: measured on the simulator, ``x < 0`` is False
    for x = -1e5, -3.4e38 and -inf, and ``x > 0`` is False for 1e5 and inf. Clipped to +-65504 first (a copy in
    ``feed``; the caller's tensor is untouched), it is what float16 saturation gives: an additive attention mask of
    float32's minimum or -inf still masks. Clipping is not exact for every graph, though (``x * 0.5`` of -inf gives
    -32752; ``x == -inf`` is False), so a caller that can compare with eager PyTorch checks the first clipped call
    of each graph and passes ``clip=False`` for a graph where it differed. Two passes over each array (NaN
    propagates through the maximum); a copy only when a value is out of range.
    """
    import numpy as np

    clipped = False
    for name in names:
        array = feed.get(name)
        if array is None or not array.size:
            continue
        high = array.max()
        if np.isnan(high):
            raise NaNInput(name)
        low = array.min()
        if high > FP16_MAX or low < -FP16_MAX:
            if not clip:
                raise BeyondHalfRangeInput(name, float(high) if high > FP16_MAX else float(low))
            feed[name] = np.clip(array, -FP16_MAX, FP16_MAX)
            clipped = True
    return clipped
