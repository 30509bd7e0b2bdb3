"""Know where it runs and trust its numbers: explain(), the accuracy guard, run-time recovery, mixed placement."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16
from integration_models import MLP
from torch import nn

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError, QnnFallbackWarning, QnnRuntimeError


class _Embeddings(nn.Module):
    """BERT's embedding sum: x[N,S,H] + position[1,S,H] -> LayerNorm (wrong on QNN HTP for rows >= 1 unless fixed)."""

    def __init__(self, seq: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.randn(1, seq, hidden))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.norm(x + self.position)


class _AsinhHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.asinh(self.a(x)))


def test_explain_shows_every_node_on_qnn_for_a_supported_model():
    """explain() on an MLP: one graph, every ONNX node on QNN HTP, and ORT's own placement agrees."""
    model = MLP().eval()
    with torch.no_grad():
        report = qnnx_backend.explain(model, torch.randn(2, 16), compile=True)
    (graph,) = report.graphs
    assert graph.final_device == "npu" and graph.compiled
    assert graph.nodes and all(n.placement == "QNN" and n.verdict == "supported" for n in graph.nodes)
    assert report.summary().startswith(f"1 graph, {graph.onnx_nodes}/{graph.onnx_nodes} ONNX nodes on QNN (simulator")
    assert '"final_device": "npu"' in report.to_json()
    assert "graph 0" in str(report)


def test_explain_reports_graph_breaks_and_rejections():
    """explain() shows Dynamo's graph breaks and, per graph, why a device rejected it."""

    def f(x):
        y = torch.asinh(x)
        if y.sum().item() > -1e9:  # .item() breaks the graph (the branch is always taken)
            return y * 2
        return y

    with torch.no_grad():
        report = qnnx_backend.explain(f, torch.randn(4, 4))
    assert len(report.graphs) >= 2 and report.graph_breaks
    first = report.graphs[0]
    assert first.final_device == "eager"
    npu = first.devices[0]
    assert npu.device == "npu" and not npu.accepted and any("Asinh" in u for u in npu.unsupported)


def test_mixed_partition_keeps_most_nodes_on_qnn_and_matches_eager():
    """partition='mixed': the one unsupported op runs on ORT's CPU EP, the rest on QNN, and the result is right."""
    model = _AsinhHead().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True, "partition": "mixed"})(x)
        assert_close_fp16(got, model(x))
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu"
    assert report.placement.get("CPUExecutionProvider", 0) >= 1
    assert report.placement.get("QNNExecutionProvider", 0) >= 1
    with torch.no_grad():
        explained = qnnx_backend.explain(model, x, compile=True, partition="mixed")
    placed = {n.op_type: n.placement for n in explained.graphs[0].nodes}
    assert placed["Asinh"] == "ORT CPU" and placed["Gemm"] == "QNN"


@given(position=st.integers(0, 2), op=st.sampled_from(["asinh", "asin", "atanh"]))
def test_mixed_partition_with_a_random_unsupported_node_matches_eager(position, op):
    """Property: an MLP with an unsupported op inserted anywhere runs in mixed mode and always matches eager."""
    torch._dynamo.reset()
    fn = {
        "asinh": torch.asinh,
        "asin": lambda t: torch.asin(t.clamp(-0.9, 0.9)),
        "atanh": lambda t: torch.atanh(t.clamp(-0.9, 0.9)),
    }[op]

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(12, 12) for _ in range(3))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i == position:
                    x = fn(x)
            return x

    model = M().eval()
    x = torch.randn(3, 12)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True, "partition": "mixed"})(x)
        assert_close_fp16(got, model(x))


# With the fixing rewrite disabled, opcheck already refuses the pattern (see below), and a split graph keeps the
# refused node on the CPU EP. The accuracy guard exists for a defect nothing upstream knows about: the `unknown_defect`
# fixture makes opcheck vouch for every node, so QNN takes the node and computes it wrongly.
_UNGUARDED = {"verify": True, "disable_passes": ["tile_layernorm_broadcast"]}


@pytest.fixture
def unknown_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    """opcheck as if its tables did not know the broadcast-LayerNorm defect: every verdict is "supported"."""
    import attrs

    import qnnx_opcheck

    real = qnnx_opcheck.check_model

    def vouch_for_everything(*args, **kwargs):
        report = real(*args, **kwargs)
        verdicts = tuple(attrs.evolve(v, status="supported", kind="supported") for v in report.verdicts)
        return attrs.evolve(report, verdicts=verdicts)

    monkeypatch.setattr(qnnx_opcheck, "check_model", vouch_for_everything)


def test_opcheck_refuses_the_known_broadcast_layernorm_defect_when_the_rewrite_is_off():
    """Defence in depth: without the rewrite, opcheck names the hazard and strict mode refuses the NPU."""
    model = _Embeddings().eval()
    options = {"device": "npu", "strict": True, "disable_passes": ["tile_layernorm_broadcast"]}
    with torch.no_grad(), pytest.raises(QnnDeviceError, match="LayerNormalization"):
        torch.compile(model, backend="qnn", options=options)(torch.randn(2, 16, 64))


@pytest.mark.usefixtures("unknown_defect")
def test_accuracy_guard_catches_the_broadcast_layernorm_defect_and_falls_back():
    """QNN is wrong for batch rows >= 1 when nothing fixes the graph; verify=True detects it and runs eager."""
    model = _Embeddings().eval()
    x = torch.randn(2, 16, 64)
    options = {"device": "auto", **_UNGUARDED}
    with torch.no_grad(), pytest.warns(QnnFallbackWarning, match="accuracy guard"):
        got = torch.compile(model, backend="qnn", options=options)(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


@pytest.mark.usefixtures("unknown_defect")
def test_accuracy_guard_raises_under_strict_with_the_numbers():
    """Under strict=True the guard raises, giving the relative error and the cosine it measured."""
    model = _Embeddings().eval()
    options = {"device": "npu", "strict": True, **_UNGUARDED}
    with torch.no_grad(), pytest.raises(QnnRuntimeError, match=r"max\|err\|/max\|ref\|"):
        torch.compile(model, backend="qnn", options=options)(torch.randn(2, 16, 64))


def test_the_rewrite_makes_the_defect_disappear():
    """With the default passes the same graph runs on QNN and matches eager (the guard stays quiet)."""
    model = _Embeddings().eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", QnnFallbackWarning)
        got = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True, "verify": True})(x)
        assert_close_fp16(got, model(x))


class _FailingSession:
    """Wraps a real ORT session and raises on run, the way an NPU subsystem restart surfaces (ENGINE_ERROR)."""

    def __init__(self, real, failures: int) -> None:
        self._real = real
        self._failures = failures

    def __getattr__(self, name):
        return getattr(self._real, name)

    def run(self, *args, **kwargs):
        if self._failures > 0:
            self._failures -= 1
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : injected ENGINE_ERROR")
        return self._real.run(*args, **kwargs)


def _compiled_variant(compiled, x):
    with torch.no_grad():
        compiled(x)
    # The variant that ran: reach it through the recorded program of the only compiled graph.
    from qnnx_backend import _compiled

    graph = _compiled.live_graphs()[-1]
    (variant,) = graph._variants.values()
    return variant


def test_runtime_failure_recreates_the_session_once():
    """A run that fails once is retried on a recreated session, and the result is right."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    compiled = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True})
    variant = _compiled_variant(compiled, x)
    variant._program.session = _FailingSession(variant._program.session, failures=1)
    with torch.no_grad():
        assert_close_fp16(compiled(x), model(x))


def test_runtime_failure_twice_falls_back_or_raises():
    """A run that fails again after recreation falls back to eager (auto) or raises QnnRuntimeError (strict)."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    for strict in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="qnn", options={"device": "npu", "strict": strict})
        variant = _compiled_variant(compiled, x)
        real = variant._program.session
        variant._program.session = _FailingSession(real, failures=1)
        variant._program.recreate = lambda real=real, p=variant._program: _with_session(p, _FailingSession(real, 99))
        with torch.no_grad():
            if strict:
                with pytest.raises(QnnRuntimeError, match="failed twice"):
                    compiled(x)
            else:
                with pytest.warns(QnnFallbackWarning):
                    torch.testing.assert_close(compiled(x), model(x))


def _with_session(program, session):
    program.session = session
    return program


def test_explain_names_the_pytorch_module_of_each_node():
    """Each ONNX node in explain() points back to the PyTorch module and ATen op it came from."""
    model = MLP().eval()
    with torch.no_grad():
        report = qnnx_backend.explain(model, torch.randn(2, 16))
    origins = [o for n in report.graphs[0].nodes for o in n.fx_nodes]
    assert any(o.startswith("net.0 (Linear): aten.") for o in origins), origins


class _WritesCache(nn.Module):
    """A KV cache's pattern: the step's keys are written into a buffer with index_copy_, and read back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 8, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(2, position, self.proj(new))
        return self.keys.sum(-1) * 2.0


_EXPLAIN_CASES = {
    "kv_cache_write": (_WritesCache, lambda: (torch.randn(1, 2, 1, 4), torch.tensor([3])), {}),
    "mlp_fp16": (MLP, lambda: (torch.randn(2, 16),), {"fp16": True}),
    "embeddings_pass_disabled": (
        _Embeddings,
        lambda: (torch.randn(2, 16, 64),),
        {"disable_passes": ["tile_layernorm_broadcast"]},
    ),
    "torch_onnx_exporter": (MLP, lambda: (torch.randn(2, 16),), {"exporter": "torch.onnx"}),
    "refused_op": (_AsinhHead, lambda: (torch.randn(4, 16),), {"partition": "whole"}),
}


@pytest.mark.parametrize("name", sorted(_EXPLAIN_CASES))
def test_explain_and_compile_take_the_same_decision(name: str) -> None:
    """explain() is a dry run of the compile's own decision: same device, same ONNX graph size and the same rewrite
    passes as the compile, for a graph that writes a cache, fp16, a disabled pass, the torch.onnx exporter and a
    refused op."""
    cls, make_inputs, options = _EXPLAIN_CASES[name]
    opts = {"soc_model": 60, **options}
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():
        explained = qnnx_backend.explain(model, *make_inputs(), **opts)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model = cls().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(model, backend="qnn", options={**opts, "verify": False})(*make_inputs())
    reports = qnnx_backend.compile_reports()
    assert [g.final_device for g in explained.graphs] == [r.device for r in reports], explained.summary()
    for graph, report in zip(explained.graphs, reports, strict=True):
        if report.on_qnn:
            assert graph.onnx_nodes == report.onnx_nodes
            assert tuple(graph.passes_applied) == tuple(report.passes_applied)
    if name == "kv_cache_write":
        assert explained.graphs[0].final_device == "npu"
