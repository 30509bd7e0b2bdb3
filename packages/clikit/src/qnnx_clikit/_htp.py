"""Measured QNN HTP facts that more than one package reads: the graphs qnnx-opcheck refuses are the graphs a
qnnx-export pass rewrites, so both read the one copy kept here (the leaves cannot import each other).

Shapes are static (every dim an int); an unknown shape is for the caller to decide.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RANDOM_OPS", "htp_averages_wrongly", "htp_pads_wrongly", "merges_heads"]

# ONNX ops whose output is not a function of their inputs: never folded into a constant (ONNX Runtime's constant
# folding skips them, and so does qnnx-export's planner).
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def htp_averages_wrongly(
    shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    *,
    ceil: bool,
    count_pad: bool,
) -> bool:
    """Whether QNN HTP averages an AveragePool wrongly (static ``shape`` ``[N, C, *spatial]``, no dilation, explicit
    ``pads`` as ONNX orders them: every begin, then every end): a ceil_mode window hanging over the end,
    count_include_pad with padding or at rank 5, a pad of half the kernel or more, or at rank 5 a begin pad on the
    first spatial axis with no pad on the others (measured on onnxruntime-qnn 2.7.0's HTP simulator, soc_model 60:
    0.21-1.1 of the output's scale off, or a wrong shape; a kernel of [3, 2, 2] with pads [1, 0, 0] averaged 0.33
    off, while pads [1, 0, 1], [1, 1, 0] and an end pad alone on that axis were right)."""
    spatial = len(kernel)
    if count_pad and (any(pads) or spatial >= 3):
        return True
    if spatial >= 3 and pads[0] and not any(pads[a] or pads[a + spatial] for a in range(1, spatial)):
        return True
    for axis in range(spatial):
        before, after = pads[axis], pads[axis + spatial]
        if (before or after) and 2 * max(before, after) >= kernel[axis]:
            return True
        if ceil and (shape[axis + 2] + before + after - kernel[axis]) % strides[axis]:
            return True  # ceil_mode adds a last window that hangs over the end
    return False


def htp_pads_wrongly(begin: Sequence[int], end: Sequence[int], *, half: bool = False) -> bool:
    """Whether QNN HTP may compute a constant-mode Pad wrongly (``begin``/``end``: the elements added before and
    after each axis, all >= 0; ``half``: the data is float16): it pads the end of the last axis, or it is a float16
    Pad of rank 5 or more.

    Measured on onnxruntime-qnn 2.7.0's HTP simulator (soc_model 60) against the CPU EP, pad values 0 and not:
    - Fed to another op, a Pad of the end of the last axis gave that op 0, or memory it never wrote, in place of the
      padding: ``F.pad(x[4, 6], (0, 3), value=2.5)`` then Relu read 0 where 2.5 was due, and a MatMul came out 518
      off (526 with a pad value of 0). 8 of 16 ops tried were wrong (Equal, Less, Not, Relu, Div, Exp, Softmax,
      MatMul), at ranks 2 and 3; the Pad alone, as the graph's output, was right.
    - As the graph's output, a Pad of the end of the last axis and the end of another axis left part of the padding
      unwritten in 192 of 466 patterns (ranks 2-5, float32 and float16; it depends on the last dim).
    - At rank 5 in float16 every pattern that pads the second or third axis was wrong (264 of 286).
    Begin pads and pads of the other axes were right: 1,097 patterns as the graph's output, and into each of the 16
    ops. A begin pad on the last axis beside its end pad was right there too, but is counted in: rank 5 float16 was
    wrong with it, and the rule stays one sentence.
    """
    if half and len(end) >= 5:
        return any(begin) or any(end)
    return bool(end) and end[-1] > 0


def merges_heads(source: Sequence[int] | None, merged: Sequence[int] | None) -> bool:
    """Whether ``merged`` is ``source`` ``[A, A, A, D]`` (A > 1) with its heads merged: ``[A, A, A*D]``, with
    leading 1s or not. A MatMul of such an operand by a rank-2 right operand comes back wrong from QNN HTP with no
    error (0.93 to 9082 of the output's max off, measured on onnxruntime-qnn 2.7.0's HTP simulator)."""
    if source is None or merged is None or len(source) != 4 or not source[0] == source[1] == source[2] > 1:
        return False
    rows = list(merged[:-1])
    while rows and rows[0] == 1:
        rows.pop(0)
    return rows == [source[0], source[1]] and merged[-1] == source[2] * source[3]
