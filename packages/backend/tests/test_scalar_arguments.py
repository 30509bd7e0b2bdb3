"""Python numbers that Dynamo passes as 0-d tensors (``dynamic=True``: a module's eps, a dropout's p, a float
argument) are specialized by value, as sizes are: the graph runs on QNN with each call's own value."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend._trace import scalar_positions, specialize
from qnnx_backend.errors import QnnFallbackWarning, SavedGraphError, UnsupportedGraphError

_OPTIONS = {"soc_model": 60, "device": "npu", "strict": True}


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8, eps=1e-3)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.norm(self.lin(x)) * scale + self.drop(x)


def _capture(model: torch.nn.Module, *args: object) -> tuple[torch.fx.GraphModule, list[object]]:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=True)(*args)
    (graph,) = graphs
    return graph


def test_dynamo_passes_floats_as_tensors_under_dynamic_true():
    """The premise: eps, p and the float argument arrive as 0-d tensors read by .item(), and are found."""
    gm, example = _capture(_Scaled().eval(), torch.randn(4, 8), 0.5)
    found = scalar_positions(gm)
    assert len(found) == 3, gm.code  # LayerNorm's eps, dropout's p, scale
    assert all(isinstance(example[i], torch.Tensor) and example[i].dim() == 0 for i in found)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), scale=st.floats(-8, 8, allow_nan=False, width=32))
def test_the_static_copy_computes_what_the_dynamic_graph_computes(rows, scale):
    """Property: with every size and scalar argument made a constant, the static copy gives the dynamic graph's
    result for the same call, and the original graph keeps its placeholders."""
    model = _Scaled().eval()
    gm, example = _capture(model, torch.randn(3, 8), 0.25)
    scalars = scalar_positions(gm)
    sizes = [i for i, a in enumerate(example) if isinstance(a, torch.SymInt | int)]
    x = torch.randn(rows, 8)
    args = [rows if i in sizes else a for i, a in enumerate(example)]
    args[next(i for i, a in enumerate(example) if isinstance(a, torch.Tensor) and a.shape == (3, 8))] = x
    scale_at = [i for i in scalars if example[i].item() == 0.25]
    assert len(scale_at) == 1
    args[scale_at[0]] = torch.tensor(scale, dtype=example[scale_at[0]].dtype)
    static = specialize(gm, args, sizes, scalars)
    rest = [a for i, a in enumerate(args) if i not in set(sizes) | set(scalars)]
    with torch.no_grad():
        torch.testing.assert_close(static(*rest), gm(*args))
    assert not any(n.op == "call_method" and n.target == "item" for n in static.graph.nodes)
    assert sum(1 for n in gm.graph.nodes if n.op == "placeholder") == len(example)


def test_each_value_runs_on_the_npu_with_its_own_value():
    """dynamic=True: every call is on the NPU under strict and matches eager; a value met again reuses its
    variant (before, the static copy's fake propagation raised into the call)."""
    model = _Scaled().eval()
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(model, backend="qnn", options=_OPTIONS, dynamic=True)
    calls = [(4, 0.5), (4, 2.0), (5, -3.25), (4, 0.5)]
    with torch.no_grad():
        for rows, scale in calls:
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x, scale), model(x, scale), atol=2e-2, rtol=1e-2)
    reports = qnnx_backend.compile_reports()
    assert [r.device for r in reports] == ["npu"] * 3  # (4, 0.5) is compiled once


class _ReadsItsData(torch.nn.Module):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x * t.item() + t


@pytest.mark.parametrize("strict", [False, True])
def test_a_graph_that_reads_a_tensors_data_runs_in_pytorch_with_its_reason(strict):
    """A tensor both computed with and read by .item() is data the graph depends on: no static copy exists. The
    call runs in PyTorch with the reason (or raises under strict) instead of raising from inside the compile."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model = _ReadsItsData()
    options = {**_OPTIONS, "strict": strict}
    compiled = torch.compile(model, backend="qnn", options=options, dynamic=True)
    x, t = torch.randn(4, 8), torch.tensor(0.5)
    with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True):
        if strict:
            with pytest.raises(UnsupportedGraphError, match="reads a value from a tensor's data"):
                compiled(x, t)
            return
        with pytest.warns(QnnFallbackWarning, match="static copy"):
            got = compiled(x, t)
    assert torch.equal(got, model(x, t))
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "eager" and "DataDependent" in (report.reason or "")


def test_saving_a_graph_with_scalar_arguments_names_the_fix(tmp_path):
    model = _Scaled().eval()
    torch._dynamo.reset()
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled = torch.compile(model.forward, backend="qnn", fullgraph=True, options=_OPTIONS, dynamic=True)
        aot = compiled.aot_compile(((x, 0.5), {}))
        with pytest.raises(SavedGraphError, match="dynamic=False"):
            aot.save_compiled_function(str(tmp_path / "saved.bin"))


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x.reshape(x.shape[0] // 2, -1) * 2, x.shape[0] // 2


def test_a_graph_that_returns_size_arithmetic_runs_on_the_npu():
    """Under dynamic=True a graph may return a size it computed (Funnel returns its pooled length): in the static
    copy that size is a constant output, where the translators were handed a number to translate and the graph ran
    in PyTorch."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(_halves, backend="qnn", options=_OPTIONS, dynamic=True)
    with torch.no_grad():
        for rows in (4, 6):
            x = torch.randn(rows, 8)
            got, half = compiled(x)
            torch.testing.assert_close(got, _halves(x)[0], atol=1e-2, rtol=1e-2)
            assert half == rows // 2
    assert [r.device for r in qnnx_backend.compile_reports()] == ["npu", "npu"]
