"""``F.linear_cross_entropy`` with chunking options: PyTorch records a batch-chunked custom op (``torch_nn::``) that no
exporter knows; the export writes it as the math it chunks, a linear layer and a cross entropy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from export_qnn_helpers import Capture, close_on_qnn_fast, compile_and_run, cpu_session
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_testkit.strategies import seeds

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


def _chunked_loss(reduction: str, chunk: int, **kwargs: Any) -> Callable[..., torch.Tensor]:
    options = torch.nn.LinearCrossEntropyOptions(allow_retain_graph=reduction != "none", batch_chunk_size=chunk)

    def fn(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.linear_cross_entropy(x, w, t, reduction=reduction, options=options, **kwargs)

    return fn


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 9),
    features=st.integers(1, 6),
    classes=st.integers(2, 7),
    chunk=st.integers(1, 4),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    bias=st.booleans(),
    class_weight=st.booleans(),
    ignored=st.booleans(),
    seed=seeds(),
)
def test_chunked_linear_cross_entropy_matches_eager(
    batch: int,
    features: int,
    classes: int,
    chunk: int,
    reduction: str,
    bias: bool,
    class_weight: bool,
    ignored: bool,
    seed: int,
) -> None:
    """Any batch, sizes, chunk, reduction, bias, class weights and ignored targets: the exported graph (run on the CPU
    EP) has no custom op left and computes eager's loss."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(batch, features, generator=g), torch.randn(classes, features, generator=g)
    t = torch.randint(0, classes, (batch,), generator=g)
    if ignored:
        t[0] = -100  # cross entropy's default ignore_index
    kwargs: dict[str, Any] = {}
    if bias:
        kwargs["linear_bias"] = torch.randn(classes, generator=g)
    if class_weight:
        kwargs["weight"] = torch.rand(classes, generator=g) + 0.5
    fn = _chunked_loss(reduction, chunk, **kwargs)
    ref = fn(x, w, t)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, (x, w, t), backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and exported.fast_path_declined is None, exported.fast_path_declined
    assert all(n.domain in ("", "ai.onnx") for n in exported.model.graph.node)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_linear_cross_entropy_runs_on_qnn_htp(reduction: str) -> None:
    """The loss of a chunked linear cross entropy on the HTP simulator, CPU fallback off, within fp16 error."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(10, 16, generator=g)
    t = torch.randint(0, 10, (8,), generator=g)
    close_on_qnn_fast(_chunked_loss(reduction, 3), x, w, t, tol=1e-2)
