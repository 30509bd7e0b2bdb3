"""A graph whose every output has zero elements (an empty batch, a zero-length sequence) has nothing to compute: it
runs in PyTorch without a fallback warning and under ``strict`` too, and ``explain()`` says the same. A graph with an
empty tensor and a result to compute (a sum over an empty axis), or one that writes an argument holding elements,
stays a fallback, and ``strict`` raises for it with the fix that applies."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend._export import NOTHING_TO_COMPUTE
from qnnx_backend.errors import QnnFallbackWarning, UnsupportedGraphError

STRICT = {"device": "npu", "soc_model": 60, "strict": True}


def _compile_strict(fn, *args):
    """``fn`` compiled afresh with strict=True and called under no_grad, a fallback warning turned into an error."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", QnnFallbackWarning)
        return torch.compile(fn, backend="qnn", options=STRICT)(*args)


def _check_like_eager(out, ref) -> None:
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    assert [(o.shape, o.dtype) for o in outs] == [(r.shape, r.dtype) for r in refs]


@settings(max_examples=12, deadline=None)
@given(
    rows=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    features=st.integers(1, 6),
    classes=st.integers(1, 5),
    empty_at=st.integers(0, 2),
)
def test_empty_outputs_need_no_device_even_under_strict(
    rows: list[int], features: int, classes: int, empty_at: int
) -> None:
    """A linear head, a concatenation and an index over a batch with a zero-size axis: strict accepts the graph,
    nothing warns, and the outputs have eager's shapes and dtypes."""
    torch.manual_seed(0)
    head = nn.Linear(features, classes).eval()
    shape = [*rows, features]
    shape[min(empty_at, len(rows) - 1)] = 0  # a batch or sequence axis, never the features
    x = torch.randn(shape)

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = head(t).relu()
        return logits, torch.cat([t, t], -1), logits.argmax(-1)

    ref = fn(x)
    _check_like_eager(_compile_strict(fn, x), ref)
    (rep,) = qnnx_backend.compile_reports()
    assert rep.device == "eager" and rep.reason == NOTHING_TO_COMPUTE


def test_a_result_computed_from_an_empty_tensor_still_raises_under_strict() -> None:
    """The sum over an empty axis holds an element to compute: strict raises, names the empty value and asks for
    tensors with elements, not for no_grad or eval()."""
    with pytest.raises(UnsupportedGraphError) as info:
        _compile_strict(lambda t: (t * 2).sum(-1), torch.randn(3, 0))
    message = str(info.value)
    assert "zero elements" in message and "at least one element" in message
    assert "no_grad" not in message


def test_a_graph_writing_an_argument_with_elements_is_not_nothing_to_compute() -> None:
    """An empty output beside an in-place write of a buffer that holds elements: the write is work, so the graph is
    no exception (strict raises) and in auto mode the buffer ends as eager leaves it."""

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.add_(1)
            return x * 2

    with pytest.raises(UnsupportedGraphError):
        _compile_strict(Counter(), torch.randn(0, 2))
    model = Counter()
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(model, backend="qnn", options={"device": "npu", "soc_model": 60})(torch.randn(0, 2))
    assert out.shape == (0, 2) and model.seen.tolist() == [1.0, 1.0]


def test_explain_agrees_with_the_compile_on_empty_outputs() -> None:
    """explain() gives an all-empty graph the compile's own reason."""
    report = qnnx_backend.explain(lambda t: t.relu() * 3, torch.randn(2, 0), soc_model=60)
    (graph,) = report.graphs
    assert graph.final_device == "eager" and graph.reason == NOTHING_TO_COMPUTE
