"""How a result is compared with eager PyTorch (private): the exact-but-for-rounding check of an ONNX model on the
CPU EP and of padded buckets (:func:`compare_outputs`), the fp16-level accuracy guard of a first QNN call
(:func:`mismatch`, which leaves out the positions of a prompt's left padding while :func:`left_padding` is in force),
the compile's one eager run of a graph (:func:`run_eager`) and its outputs, kept for that guard
(:class:`EagerReference`)."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from qnnx_backend._untrusted import FP16_MAX as FP16_MAX

# float32 CPU EP vs eager PyTorch: reassociation and other kernels give ~1e-6 relative; 1e-3 leaves room for
# long reductions while any wrong lowering seen so far is off by 1e-1 or more. fp16 models get fp16 room.
RTOL_FP32 = 1e-3
RTOL_FP16 = 2e-2


def compare_outputs(got: Any, ref: Any, rtol: float) -> str | None:
    """None when ``got`` matches ``ref`` (float leaves within ``rtol`` of the leaf's scale, identical NaN/inf
    positions, other leaves exactly equal, same shapes and dtypes); else one sentence saying what differs."""
    got_leaves = torch.utils._pytree.tree_leaves(got)
    ref_leaves = torch.utils._pytree.tree_leaves(ref)
    if len(got_leaves) != len(ref_leaves):
        return f"{len(got_leaves)} outputs instead of {len(ref_leaves)}"
    for k, (g, r) in enumerate(zip(got_leaves, ref_leaves, strict=True)):
        if not isinstance(r, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(r.shape):
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            return f"output {k} has shape {shape} instead of {tuple(r.shape)}"
        if g.dtype != r.dtype:
            return f"output {k} has dtype {g.dtype} instead of {r.dtype}"
        if r.is_complex():  # compared part by part
            g, r = torch.view_as_real(g.resolve_conj()), torch.view_as_real(r.resolve_conj())
        if not r.is_floating_point():
            if not torch.equal(g, r):
                return f"output {k} ({r.dtype}) differs in {int((g != r).sum())} of {r.numel()} elements"
            continue
        g64, r64 = g.double(), r.double()
        if not torch.equal(torch.isnan(g64), torch.isnan(r64)):
            return f"output {k} has NaN where PyTorch has none, or the reverse"
        inf_g, inf_r = torch.isinf(g64), torch.isinf(r64)
        if not torch.equal(inf_g, inf_r) or not torch.equal(g64[inf_r], r64[inf_r]):
            return f"output {k} has infinities where PyTorch has none, or the reverse"
        finite = torch.isfinite(r64)
        if not finite.any():
            continue
        scale = r64[finite].abs().max().item()
        err = (g64[finite] - r64[finite]).abs().max().item()
        if not err <= rtol * scale + 1e-6:
            rel = err / scale if scale > 0 else math.inf
            return f"output {k} is off by {err:.3g} ({rel:.3g} of its largest value; limit {rtol:g})"
    return None


# (padding, sizes) while a left-padded prompt is generated: its first ``padding`` positions are padding, and a
# dimension that indexes positions has one of ``sizes`` (the padded prompt's length, the cache's length).
_LEFT_PADDING: contextvars.ContextVar[tuple[int, tuple[int, ...]] | None] = contextvars.ContextVar(
    "qnnx_left_padding", default=None
)


@contextlib.contextmanager
def left_padding(padding: int, sizes: Sequence[int]) -> Iterator[None]:
    """While in force, :func:`mismatch` leaves out the first ``padding`` positions of a tensor whose
    second-to-last dimension has one of ``sizes``: the positions of a prompt's left padding.

    The layout is Hugging Face's: hidden states and logits are ``[batch, position, features]``, a KV cache is
    ``[batch, heads, position, head_dim]``, so positions are the second-to-last dimension. What a model computes at a
    masked padding position is never read by a real token (the attention mask keeps it out), yet it is where fp16
    and eager part ways most: a query row whose every key is masked gets float32's ``min + min = -inf`` in eager
    and a large finite value on HTP. Those values are still checked on every call for being finite and within
    fp16's range; only their agreement with eager is not asked for.
    """
    token = _LEFT_PADDING.set((padding, tuple(sizes)))
    try:
        yield
    finally:
        _LEFT_PADDING.reset(token)


def _without_padding(got: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``got`` and ``ref`` without the positions of the left padding in force, if any (see :func:`left_padding`)."""
    padding = _LEFT_PADDING.get()
    if padding is None or ref.dim() < 3 or got.shape != ref.shape:
        return got, ref
    count, sizes = padding
    length = ref.shape[-2]
    if length not in sizes or not 0 < count < length:
        return got, ref
    return got[..., count:, :], ref[..., count:, :]


def mismatch(got: torch.Tensor, ref: torch.Tensor, rtol: float, min_cosine: float) -> str | None:
    """Why ``got`` is not ``ref`` within fp16-level limits, or None. NaN and infinities must sit where eager has
    them (HTP has neither: a NaN in eager that comes back finite is a wrong result); the finite values must be
    within ``rtol`` of the reference's largest magnitude and have a cosine of at least ``min_cosine``. The
    positions of a prompt's left padding are left out while :func:`left_padding` is in force."""
    if got.shape != ref.shape:
        return f"shape {tuple(got.shape)} where eager gives {tuple(ref.shape)}"
    got, ref = _without_padding(got, ref)
    if got.is_complex() and ref.is_complex():  # compared part by part
        got, ref = torch.view_as_real(got.resolve_conj()), torch.view_as_real(ref.resolve_conj())
    if not (got.is_floating_point() and ref.is_floating_point()):
        return None if torch.equal(got, ref.to(got.dtype)) else "a non-float value differs"
    g64, r64 = got.detach().double().flatten(), ref.detach().double().flatten()
    same_special = (torch.isnan(g64) & torch.isnan(r64)) | (torch.isinf(r64) & (g64 == r64))
    finite = torch.isfinite(g64) & torch.isfinite(r64)
    odd = ~(same_special | finite)
    if bool(odd.any()):
        k = int(odd.nonzero()[0])
        return f"element {k} is {g64[k].item()} where eager gives {r64[k].item()}"
    g64, r64 = g64[finite], r64[finite]
    if not g64.numel():
        return None
    scale = r64.abs().max().item()
    err = (g64 - r64).abs().max().item()
    rel = err / scale if scale > 0 else err
    denom = (g64.norm() * r64.norm()).item()
    cos = (g64 @ r64).item() / denom if denom > 0 else (1.0 if err == 0 else 0.0)
    if rel <= rtol and cos >= min_cosine:
        return None
    return f"max|err|/max|ref| = {rel:.3g} (limit {rtol:g}), cosine = {cos:.6f} (limit {min_cosine:g})" + _tiny(scale)


# float16's smallest subnormal and smallest normal magnitudes.
_FP16_TINIEST = 2.0**-24
_FP16_SMALLEST_NORMAL = 2.0**-14


def _tiny(scale: float) -> str:
    """Why the comparison failed when eager's largest magnitude is too small for float16 (which HTP computes in), as
    a clause to append; empty otherwise. Random-initialized deep models shrink their activations this far."""
    if 0 < scale < _FP16_TINIEST:
        return (
            f"; eager's largest magnitude is {scale:.3g}, below float16's smallest value ({_FP16_TINIEST:.3g}), so "
            "HTP's float16 arithmetic cannot hold any of these values (untrained weights often shrink activations "
            "this far)"
        )
    if 0 < scale < _FP16_SMALLEST_NORMAL:
        return (
            f"; eager's largest magnitude is {scale:.3g}, in float16's subnormal range (below "
            f"{_FP16_SMALLEST_NORMAL:.3g}), where HTP's float16 arithmetic keeps few digits"
        )
    return ""


SMALL_GRAPH_ELEMENTS = 4 * 2**20
"""A graph whose tensors (weights, inputs and every intermediate value) hold at most this many elements runs its
eager check on one intra-op thread. Its ops are too small to gain from more, and each parallel op ends at a barrier
where the calling thread spins until the others are done: on 2 cores shared with other jobs, tiny BERT's eager run
took 0.08 s of the calling thread's CPU on PyTorch's 2 threads and 0.005 s on one (ResNet-10: 0.18 s and 0.005 s)."""


def graph_elements(gm: torch.nn.Module, args: Sequence[object]) -> int | None:
    """The elements of ``args``' tensors and of the values ``gm``'s FX nodes compute (Dynamo's example values);
    None when a size is not a plain number."""
    total = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
    graph = getattr(gm, "graph", None)
    for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
        if node.op in ("placeholder", "output"):
            continue
        value = node.meta.get("example_value", node.meta.get("val"))
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                try:
                    total += int(leaf.numel())
                except (TypeError, ValueError, RuntimeError):  # a symbolic size: no plain count
                    return None
    return total


@contextlib.contextmanager
def intra_op_threads_for(elements: int | None) -> Iterator[int]:
    """PyTorch's intra-op threads for an eager run over ``elements`` tensor elements (:func:`graph_elements`): one
    while the run lasts when they are at most :data:`SMALL_GRAPH_ELEMENTS`, else unchanged (also for None); the
    count is restored after. Yields the count in use."""
    before = torch.get_num_threads()
    if before == 1 or elements is None or elements > SMALL_GRAPH_ELEMENTS:
        yield before
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)


def run_eager(gm: torch.nn.Module, args: Sequence[object]) -> Any:
    """``gm``'s outputs on ``args`` in eager PyTorch, under no_grad (the compile's one eager run of a graph), on
    one intra-op thread when the graph is small."""
    with torch.no_grad(), intra_op_threads_for(graph_elements(gm, args)):
        return gm(*args)


class EagerReference:
    """Eager PyTorch's outputs of a graph for one list of arguments, kept so that a later check on the same
    arguments need not run the graph again.

    The compile runs the graph in eager PyTorch once (HTP's float16 range check) on the arguments of the call that
    compiles it; the accuracy guard of that same call compares the first QNN run with eager PyTorch on those
    arguments. It reads the outputs kept here instead of a second eager run when :meth:`matches` says the arguments
    are still what they were: the same tensor objects at the same version counters (no in-place write since), the
    same other values. Anything else runs eager again.
    """

    __slots__ = ("_args", "outputs")

    def __init__(self, args: Sequence[object], outputs: Any) -> None:
        self.outputs = outputs
        self._args = tuple((a, a._version if isinstance(a, torch.Tensor) else None) for a in args)

    def matches(self, args: Sequence[object]) -> bool:
        """Whether ``args`` are the arguments the outputs were computed from, unchanged."""
        if len(args) != len(self._args):
            return False
        for a, (kept, version) in zip(args, self._args, strict=True):
            if isinstance(kept, torch.Tensor):
                if a is not kept or a._version != version:
                    return False
            elif isinstance(a, torch.Tensor) or type(a) is not type(kept) or a != kept:
                return False
        return True
