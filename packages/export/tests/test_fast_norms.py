"""Normalization by the input's own statistics: batch norm in training mode without running statistics (BiT's weight
standardization, BatchNorm with ``track_running_stats=False``) and instance norm, which ATen writes the same way.
Nothing is updated and nothing is random, so the graph is a pure function and runs through the direct translator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from export_capture import capture, only
from export_qnn_helpers import Capture, close_on_qnn_fast, compile_and_run, cpu_session, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_testkit.strategies import seeds

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


def _fast_on_cpu(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[qe.ExportedGraph, float]:
    """The direct translator's ONNX model of ``fn`` (it must not decline) and its error on the CPU EP."""
    ref = fn(*inputs)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, inputs, backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and exported.fast_path_declined is None, exported.fast_path_declined
    assert out.shape == ref.shape and out.dtype == ref.dtype
    return exported, rel_err(out, ref)


def _op_types(exported: qe.ExportedGraph) -> list[str]:
    return [n.op_type for n in exported.model.graph.node]


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 5),
    spatial=st.lists(st.integers(1, 6), min_size=0, max_size=3),
    affine=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3]),
    scale=st.sampled_from([1.0, 30.0]),
    seed=seeds(),
)
def test_batch_statistics_norm_of_any_rank_and_batch_matches_eager(
    batch: int, channels: int, spatial: list[int], affine: bool, eps: float, scale: float, seed: int
) -> None:
    """``F.batch_norm(x, None, None, w, b, training=True)`` over ranks 2 to 5 and batches of 1 to 3 (at least two
    values per channel): one InstanceNormalization, the batch moved behind the channels when it is not 1, equal to
    eager on the CPU EP."""
    shape = (batch, channels, *spatial)
    if batch * max(1, torch.Size(spatial).numel()) < 2:
        spatial = [2]
        shape = (batch, channels, 2)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * scale + 3.0
    w, b = (torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)) if affine else (None, None)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, None, None, w, b, training=True, momentum=0.1, eps=eps)

    exported, err = _fast_on_cpu(fn, x)
    assert err <= 1e-4, err
    assert _op_types(exported).count("InstanceNormalization") == 1


@pytest.mark.parametrize("rank", [3, 4, 5])
def test_instance_norm_modules_translate_directly(rank: int) -> None:
    """nn.InstanceNorm1d/2d/3d (affine) go through the direct translator (they went to torch.onnx: the translator
    declined training-mode batch norm) and equal eager; no rank-5 InstanceNormalization is written (the QNN EP
    refuses one)."""
    torch.manual_seed(0)
    module = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)[rank - 3](4, affine=True).eval()
    nn.init.normal_(module.weight)
    nn.init.normal_(module.bias)
    x = torch.randn(2, 4, *([5] * (rank - 2)))
    exported, err = _fast_on_cpu(module, x)
    assert err <= 1e-4, err
    import onnx

    inferred = onnx.shape_inference.infer_shapes(exported.model).graph
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in (*inferred.input, *inferred.value_info)}
    ranks = {rank[n.input[0]] for n in inferred.node if n.op_type == "InstanceNormalization"}
    assert ranks and ranks <= {3, 4}, ranks


class _StandardizedConv(nn.Module):
    """BiT's weight-standardized convolution: its weight normalized per output channel by batch norm in training mode
    without running statistics, on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3, 3, 3) * 0.2 + 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.batch_norm(self.weight.reshape(1, 6, -1), None, None, training=True, momentum=0.0, eps=1e-8)
        return F.conv2d(x, w.reshape_as(self.weight), padding=1)


def test_a_standardized_weight_is_folded_into_a_constant() -> None:
    """The standardized weight depends on the parameter alone: the translator computes it once (a mutable ATen
    schema whose written arguments are all None writes nothing) and the ONNX model holds one Conv, no
    normalization."""
    torch.manual_seed(0)
    exported, err = _fast_on_cpu(_StandardizedConv().eval(), torch.randn(1, 3, 8, 8))
    assert err <= 1e-5, err
    assert _op_types(exported) == ["Conv"], _op_types(exported)


def test_training_mode_batch_norm_is_a_problem_only_with_running_statistics() -> None:
    """Batch norm in training mode with running statistics would update them (a training op); without them it is a
    pure function of its input and exportable."""
    mean, var = torch.zeros(4), torch.ones(4)

    def with_stats(x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, mean, var, training=True)

    def without(x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, None, None, training=True) + torch.batch_norm(
            x, None, None, None, None, True, 0.1, 1e-5, False
        )

    x = torch.randn(3, 4)
    assert "training_op" in {p.kind for p in only(capture(with_stats, x)[0]).analysis.problems}
    assert only(capture(without, x)[0]).analysis.exportable


def test_instance_norm_runs_on_qnn_htp_within_fp16_error() -> None:
    """An InstanceNorm2d over activations of scale 30 runs on the HTP simulator (CPU fallback off) within fp16
    error of eager."""
    torch.manual_seed(0)
    module = nn.InstanceNorm2d(8, affine=True).eval()
    nn.init.normal_(module.weight)
    x = torch.randn(1, 8, 16, 16) * 30 + 5
    close_on_qnn_fast(module, x, tol=5e-3)


_BROADCASTING = st.sampled_from(
    [((5, 5, 5), (5, 5, 5)), ((5, 5, 5), (5,)), ((5, 1, 5), (5, 5)), ((), (5, 5)), ((), ())]
)


@settings(max_examples=40, deadline=None)
@given(shapes=_BROADCASTING, p=st.sampled_from([0.0, 1.0, 2.0, 3.0, 1.5, float("inf"), float("-inf")]), seed=seeds())
def test_dist_of_broadcast_tensors_equals_eager_on_the_cpu_ep(
    shapes: tuple[tuple[int, ...], tuple[int, ...]], p: float, seed: int
) -> None:
    """``torch.dist(a, b, p)`` of tensors that broadcast (0-d ones too), for the orders the vector norm takes: translated
    and eager's value on the CPU EP."""
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(s, generator=g) for s in shapes)
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(lambda x, y: torch.dist(x, y, p), (a, b), backend)  # type: ignore[arg-type]  # two tensors
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    ref = torch.dist(a, b, p)
    assert got.shape == ref.shape and rel_err(got, ref) <= 1e-5


def test_dist_runs_on_qnn_htp_within_fp16_error() -> None:
    """``torch.dist`` of broadcast tensors runs wholly on the HTP simulator within float16's rounding."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 1, 5, generator=g), torch.randn(5, 5, generator=g)
    for p in (2.0, 1.0, 3.0):
        close_on_qnn_fast(lambda x, y, p=p: torch.dist(x, y, p), a, b, tol=3e-3)
