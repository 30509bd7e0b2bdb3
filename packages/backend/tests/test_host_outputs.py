"""A graph that returns an attention mask beyond float16's range beside its real work: the mask is computed in
PyTorch, everything else on QNN, and the caller gets eager's values (the NPU refused the whole graph before)."""

from __future__ import annotations

import operator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend._host_outputs import plan_split
from qnnx_backend.errors import QnnDeviceError, SavedGraphError


class _Masked(torch.nn.Module):
    """Attention scores with an additive mask, returning the mask too (what a graph break hands the next graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        extended = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        h = self.proj(x)
        scores = (h @ h.transpose(-1, -2))[:, None] + extended
        return scores.softmax(-1), extended


class _HeavyOverflow(torch.nn.Module):
    """An output beyond float16's range that needs a matmul: no mask, and the graph is not split."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.proj(x).relu(), self.proj(x) * 1e6


def _inputs(padded_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, padded_from:] = 0
    return x, mask


def test_a_mask_beyond_half_range_is_computed_in_pytorch_and_the_rest_on_the_npu():
    torch.manual_seed(0)
    model = _Masked().eval()
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60})
    with torch.no_grad():
        for padded_from in (5, 2, 8):  # the first call compiles; later masks differ
            x, mask = _inputs(padded_from)
            got, ref = compiled(x, mask), model(x, mask)
            assert torch.equal(got[1], ref[1])  # eager's own values: float32's minimum, not float16's
            torch.testing.assert_close(got[0], ref[0], atol=3e-3, rtol=3e-3)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and not report.cpu_nodes
    assert report.host_outputs == (1,)
    assert "output(s) 1 computed in PyTorch" in report.summary()
    with torch.no_grad():
        explained = qnnx_backend.explain(model, *_inputs(5), soc_model=60)
    (graph,) = explained.graphs
    assert graph.final_device == "npu" and graph.host_outputs == (1,)


def test_a_graph_with_host_outputs_is_not_saved_as_if_it_had_none(tmp_path):
    model = _Masked().eval()
    torch._dynamo.reset()
    x, mask = _inputs(5)
    with torch.no_grad():
        compiled = torch.compile(model.forward, backend="qnn", fullgraph=True, options={"soc_model": 60})
        aot = compiled.aot_compile(((x, mask), {}))
        with pytest.raises(SavedGraphError, match="output\\(s\\) 1 in PyTorch"):
            aot.save_compiled_function(str(tmp_path / "saved.bin"))


def test_an_output_that_needs_a_matmul_keeps_the_graph_off_the_npu():
    """An overflowing output computed by a matmul is work for the accelerator: the graph is not split and the NPU
    refuses it for float16's range, as before."""
    model = _HeavyOverflow().eval()
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={"soc_model": 60, "device": "npu"})(x)
    assert torch.equal(got[1], model(x)[1])
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "eager" and "beyond float16" in (report.reason or "")
    assert report.host_outputs == ()


def test_strict_never_splits():
    model = _Masked().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60, "strict": True, "device": "npu"})
    with torch.no_grad(), pytest.raises(QnnDeviceError, match="beyond float16"):
        compiled(*_inputs(5))


# -- the split itself, on generated graphs (no QNN) -------------------------------------------------------------

_LIGHT = [torch.neg, torch.exp, torch.abs, lambda t: t * 3.0, lambda t: t - 1.0, lambda t: t.clamp(-2, 2)]


def _graph(plan: list[tuple[int, int, int]], outputs: list[int]) -> torch.fx.GraphModule:
    """Values v0, v1 (arguments), then per step (op, a, b): light op of v_a, or ``v_a @ v_b`` (op 6), or v_a + v_b
    (op 7); returns the values ``outputs``."""
    graph = torch.fx.Graph()
    values: list[torch.fx.Node] = [graph.placeholder("a"), graph.placeholder("b")]
    for op, i, j in plan:
        a, b = values[i % len(values)], values[j % len(values)]
        if op == 6:
            values.append(graph.call_function(torch.matmul, (a, b)))
        elif op == 7:
            values.append(graph.call_function(operator.add, (a, b)))
        else:
            values.append(graph.call_function(_LIGHT[op], (a,)))
    graph.output(tuple(values[k % len(values)] for k in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=10),
    outputs=st.lists(st.integers(0, 20), min_size=2, max_size=5),
    picked=st.sets(st.integers(0, 4), min_size=1),
)
def test_the_two_graphs_give_the_whole_graphs_outputs(plan, outputs, picked):
    """Any split made returns exactly the whole graph's outputs in their places; an output that needs a matmul is
    never computed by the host graph."""
    gm = _graph(plan, outputs)
    positions = sorted(k for k in picked if k < len(outputs))
    args = (torch.randn(3, 3, generator=torch.Generator().manual_seed(1)), torch.randn(3, 3))
    split = plan_split(gm, positions)
    if isinstance(split, str):
        return
    assert split.host_positions == tuple(positions)
    assert all(n.target is not torch.matmul for n in split.host_gm.graph.nodes)
    whole = gm(*args)
    merged = split.merge(split.device_gm(*args), split.host_gm(*args))
    assert len(merged) == len(whole)
    for got, want in zip(merged, whole, strict=True):
        assert torch.equal(got, want)
