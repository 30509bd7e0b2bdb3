"""The translator's logsumexp, logsigmoid, vector norms and nll_loss: on the HTP simulator against eager, and the rows
PyTorch gives an infinity for on ONNX Runtime's CPU EP."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from export_capture import capture, only
from export_qnn_helpers import Capture, close_on_qnn_fast, compile_and_run, cpu_session, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_testkit.strategies import seeds, shapes

FAST = qe.ExportOptions(exporter="fast")


def _on_cpu_ep(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """The translator's ONNX model of ``fn`` run on ONNX Runtime's CPU EP."""
    cap = only(capture(fn, *inputs)[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=FAST)
    assert exported.exporter == "fast" and exported.fast_path_declined is None
    sig = exported.signature
    feeds = {n: t.numpy() for n, t in zip(sig.input_names, sig.onnx_inputs(list(cap.example_inputs)), strict=True)}
    (out,) = cpu_session(exported.model_bytes()).run(None, feeds)
    return torch.from_numpy(np.asarray(out))


@settings(max_examples=6, deadline=None)
@given(
    shape=shapes(min_rank=1, max_rank=4, max_side=5),
    data=st.data(),
    spread=st.sampled_from([1.0, 300.0]),
    keepdim=st.booleans(),
    seed=seeds(),
)
def test_logsumexp_on_qnn(shape: list[int], data: st.DataObject, spread: float, keepdim: bool, seed: int) -> None:
    """logsumexp over one or several axes (keepdim or not) runs wholly on the HTP simulator within float16 rounding
    of eager, for rows that span 600 (whose exponentials would overflow or underflow without the maximum shift)."""
    rank = len(shape)
    dims = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda d: d % rank))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * spread
    close_on_qnn_fast(lambda t: torch.logsumexp(t, dims, keepdim=keepdim), x)


def test_logsumexp_of_infinite_rows_as_eager() -> None:
    """A row of -inf gives -inf, as in eager, on the CPU EP (the exported model, its QNN rewrites included); on the
    simulator it gives a number beyond float16's range (the backend then computes that call in PyTorch), never a
    finite value, and the other rows stay right."""
    inf = float("inf")
    x = torch.tensor([[-inf, -inf, -inf], [1.0, -inf, 2.0], [-1e4, 0.5, 7.0]])
    ref = torch.logsumexp(x, 1)
    assert torch.equal(_on_cpu_ep(lambda t: torch.logsumexp(t, 1), x), ref)
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(lambda t: torch.logsumexp(t, 1), (x,), backend)
    assert backend.exported[0].fast_path_declined is None
    assert float(out[0]) < -65504
    assert torch.allclose(out[1:], ref[1:], rtol=1e-3, atol=1e-3)


@settings(max_examples=6, deadline=None)
@given(shape=shapes(max_rank=4, max_side=6), spread=st.sampled_from([1.0, 8.0, 1000.0]), seed=seeds())
def test_log_sigmoid_on_qnn(shape: list[int], spread: float, seed: int) -> None:
    """logsigmoid runs wholly on the HTP simulator within float16 rounding of eager, for inputs of magnitude up to
    several thousand (where log(sigmoid(x)) would overflow to -inf) as for small ones. The logarithm of ``1 + e``
    carries float16's absolute error at 1 (about 5e-4), whatever the output's scale."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * spread
    close_on_qnn_fast(torch.nn.functional.logsigmoid, x, atol=1e-3)


@settings(max_examples=8, deadline=None)
@given(
    shape=shapes(min_rank=1, max_rank=5, max_side=4),
    ord=st.sampled_from([2, 1, float("inf"), float("-inf"), 0, 3, 0.5, 1.5]),
    data=st.data(),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    keepdim=st.booleans(),
    seed=seeds(),
)
def test_vector_norm_on_qnn(
    shape: list[int], ord: float, data: st.DataObject, scale: float, keepdim: bool, seed: int
) -> None:
    """linalg.vector_norm of every order taken (2, 1, +-inf, 0, other positive p) over every axis or a set of
    them, keepdim or not, ranks 1-5, runs wholly on the HTP simulator within float16 rounding of eager's scale, for
    elements of 1e-3 to 300 (whose squares and cubes leave float16's range) and with rows of zeros. A norm beyond
    float16's range comes back beyond it too (the backend then computes the call in PyTorch), never finite."""
    rank = len(shape)
    dims = data.draw(st.none() | st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale
    x[0] = 0  # a zero row for most axis sets

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(t, ord, dims, keepdim)

    if float(fn(x).max()) <= 60000:
        close_on_qnn_fast(fn, x, tol=2e-3)
        return
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(fn, (x,), backend)
    assert backend.exported[0].fast_path_declined is None and float(out.max()) > 65504


@settings(max_examples=8, deadline=None)
@given(
    rows=st.sampled_from([(), (5,), (2, 3, 4)]),
    classes=st.integers(1, 6),
    weighted=st.booleans(),
    reduction=st.sampled_from(["none", "mean", "sum"]),
    ignore=st.sampled_from([-100, 0, 2]),
    seed=seeds(),
)
def test_nll_loss_on_qnn(
    rows: tuple[int, ...], classes: int, weighted: bool, reduction: str, ignore: int, seed: int
) -> None:
    """nll_loss of 1-d, 2-d and image ([N, C, H, W]) inputs, with or without class weights, every reduction and an
    ignore_index inside or outside the classes (targets hitting it included), runs wholly on the HTP simulator
    within float16 rounding of eager."""
    g = torch.Generator().manual_seed(seed)
    shape = (classes,) if not rows else (rows[0], classes, *rows[1:])
    x = torch.randn(shape, generator=g) * 3
    target = torch.randint(0, classes, rows, generator=g)
    if rows:
        target.view(-1)[0] = ignore  # an ignored row (or one of class `ignore`, when that is a class)
    w = torch.rand(classes, generator=g) + 0.5
    if reduction == "mean" and bool((torch.where(target == ignore, 0, 1)).sum() == 0):
        return  # every target ignored: eager's NaN (tested on the CPU EP by the registry)

    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(a, b, c if weighted else None, ignore_index=ignore, reduction=reduction)

    close_on_qnn_fast(fn, x, target, w, atol=1e-3)


def test_nll_loss_mean_of_only_ignored_targets_is_nan() -> None:
    """A mean nll_loss whose every target is ignored is NaN, as in eager, on the CPU EP; on the simulator it is a
    number beyond float16's range (the backend then computes that call in PyTorch), never a finite one."""
    x, target = torch.randn(3, 4), torch.full((3,), -100)
    assert bool(_on_cpu_ep(F.nll_loss, x, target).isnan())
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(F.nll_loss, (x, target), backend)
    assert backend.exported[0].fast_path_declined is None
    assert not -65504 <= float(out) <= 65504


@settings(max_examples=20, deadline=None)
@given(shape=shapes(min_rank=1, max_rank=4, max_side=5), acos=st.booleans(), seed=seeds())
def test_asin_and_acos_from_atan_match_eager_on_the_cpu_ep(shape: list[int], acos: bool, seed: int) -> None:
    """asin and acos, written from Atan (QNN HTP declines Asin and Acos), equal eager within float32 rounding on
    [-1, 1] and give NaN outside it, as eager."""
    fn = torch.acos if acos else torch.asin
    x = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2.4 - 1.2
    out, ref = _on_cpu_ep(fn, x), fn(x)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    inside = ~torch.isnan(ref)
    if bool(inside.any()):
        assert float((out[inside] - ref[inside]).abs().max()) <= 1e-6


def test_asin_acos_and_atan_run_on_qnn_within_float16_rounding_of_their_input() -> None:
    """On the HTP simulator (CPU fallback off), over [-1, 1], asin and acos are within 5e-3 of eager on float16's
    rounding of the input (the input's own rounding moves asin by up to 1.4e-2 near +-1); atan runs as Atan.
    Outside [-1, 1] the result is a number beyond float16's range (HTP's NaN), which the backend's check of every
    call turns into a call in PyTorch."""
    x = torch.linspace(-1, 1, 2001)
    for fn in (torch.asin, torch.acos, torch.atan):
        backend = Capture(qnn_session, FAST)
        out = compile_and_run(fn, (x,), backend)
        assert backend.exported[0].fast_path_declined is None
        assert float((out - fn(x.half().float())).abs().max()) <= 5e-3
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(torch.asin, (torch.tensor([1.5, -2.0, 0.5]),), backend)
    assert bool((out[:2].abs() > 65504).all()) and abs(float(out[2]) - 0.5236) < 2e-3


@settings(max_examples=25, deadline=None)
@given(shape=shapes(min_rank=0, max_rank=5, max_side=6), data=st.data(), keepdim=st.booleans(), seed=seeds())
def test_prod_as_a_tree_of_muls_equals_eager(shape: list[int], data: st.DataObject, keepdim: bool, seed: int) -> None:
    """prod over one axis (keepdim or not) or of every element, at ranks 0-5 and any axis length (padded with ones
    to a power of two), equals eager on the CPU EP up to the order of the multiplications, signs and zeros
    included."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 0.3
    if shape and data.draw(st.booleans()):
        dim = data.draw(st.integers(-len(shape), len(shape) - 1))
        fn: Callable[[torch.Tensor], torch.Tensor] = lambda t: torch.prod(t, dim, keepdim=keepdim)  # noqa: E731
    else:
        fn = torch.prod
    torch.testing.assert_close(_on_cpu_ep(fn, x), fn(x), rtol=1e-5, atol=1e-6)


def test_prod_on_qnn() -> None:
    """prod over an axis of 7 (padded to 8) and of every element of a rank-4 tensor runs wholly on the HTP simulator
    within float16 rounding of eager (QNN HTP has no ReduceProd)."""
    x = torch.rand(2, 7, 3, 2, generator=torch.Generator().manual_seed(4)) + 0.5
    close_on_qnn_fast(lambda t: torch.prod(t, 1), x, tol=2e-3)
    close_on_qnn_fast(torch.prod, x, tol=2e-3)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4)),
    batch=st.sampled_from([(), (2,), (2, 1)]),
    p=st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0, float("inf")]),
    seed=seeds(),
)
def test_cdist_equals_eager(rows: tuple[int, int, int], batch: tuple[int, ...], p: float, seed: int) -> None:
    """cdist of batched (broadcast) rows for p = 0, 1, 1.5, 2, 3 and inf is the norm of every pair's difference,
    equal to eager on the CPU EP (eager's p = 2 may use a matmul expansion: agreement to 1e-4 of the scale)."""
    p_rows, r_rows, m = rows
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(*batch, p_rows, m, generator=g), torch.randn(r_rows, m, generator=g)
    ref = torch.cdist(a, b, p=p)
    got = _on_cpu_ep(lambda x, y: torch.cdist(x, y, p=p), a, b)
    assert got.shape == ref.shape
    assert float((got - ref).abs().max()) <= 1e-4 * max(float(ref.abs().max()), 1.0)


def test_pairwise_distances_on_qnn() -> None:
    """cdist (p = 2 between rows 1e-3 apart, where the matmul expansion cancels to noise in float16, and p = 1.5)
    and pdist run wholly on the HTP simulator within float16 rounding of eager."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(8, 16, generator=g) * 3
    close_on_qnn_fast(lambda x: torch.cdist(x, x + 1e-3), a, tol=2e-3)
    close_on_qnn_fast(lambda x, y: torch.cdist(x, y, p=1.5), a, torch.randn(2, 5, 16, generator=g), tol=5e-3)
    close_on_qnn_fast(lambda x: F.pdist(x), a, tol=2e-3)
