"""The Einsum equations the QNN EP translates as a MatMul (private helpers of the pattern rules)."""

from __future__ import annotations

__all__ = ["einsum_has_diagonal", "einsum_is_matmul"]


def einsum_has_diagonal(equation: str) -> bool:
    """Whether a term of ``equation`` (before ``->``) repeats a letter."""
    terms = equation.partition("->")[0].split(",")
    return any(len(set(t)) != len(t) for t in terms if "." not in t)


def einsum_is_matmul(a: str, b: str, out: str) -> bool:
    """Whether ``a,b->out`` is one of the MatMul forms of onnxruntime-qnn's Einsum translation (its parser reads
    the last two letters of each term and the batch letters position by position)."""
    n = len(a)
    if len(b) == n and len(out) == n and all(a[i] == b[i] == out[i] for i in range(n - 2)):
        m, k = a[-2], a[-1]
        if out[-2] == m and b[-2] == k and b[-1] == out[-1]:
            return True  # plain MatMul
        if out[-2] == m and b[-1] == k and b[-2] == out[-1]:
            return True  # the right operand transposed
    four = n == 4 and len(out) == 4
    if four and len(b) == 4 and a[0] == b[0] == out[0] and a[3] == out[3] and a[1] == b[3] and b[1] == out[1]:
        return True  # transposed throughout
    # a shared weight over the second axis, transposed
    return four and len(b) == 3 and a[:3] == out[:3] and a[3] == b[2] and b[1] == out[3] and b[0] == out[1]
