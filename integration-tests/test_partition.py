"""Most of the graph on the NPU by default: nodes qnnx-opcheck does not vouch for run on ONNX Runtime's CPU EP in
the same session, the rest on QNN (the host simulator), and the result stays eager PyTorch's within fp16."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16
from torch import nn

import qnnx_backend
import qnnx_detection
from qnnx_backend.errors import QnnDeviceError
from qnnx_testkit.strategies import seeds

AUTO = {"soc_model": 60}  # the defaults: device='auto', strict=False, partition='auto'


class _AsinhInTheMiddle(nn.Module):
    """Linear -> asinh (the QNN EP declines it) -> Linear -> ReLU -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.asinh(self.a(x)))))


class _TopKInTheMiddle(nn.Module):
    """topk of the graph input (a sort order QNN HTP would compute on fp16-rounded values, where the CPU EP sees
    the caller's float32), added to a Linear's output -> Linear -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 4), nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.topk(x, 4, dim=-1).values + self.a(x))))


class _FloorOfTheInput(nn.Module):
    """floor(x * 4) / 4 of the graph input (fp16 rounding would move it by a whole step), then three Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(torch.floor(x * 4) / 4)))))


class _FloorOfAComputedValue(nn.Module):
    """floor of a Linear's output: the Linear would have to leave QNN too, so most of the graph is on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.floor(self.a(x) * 4) / 4)


def _compile_and_run(model: nn.Module, x: torch.Tensor, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(model, backend="qnn", options=options)(x)
        return got, model(x)


def _placed_by_ort() -> dict[str, tuple[str, ...]]:
    """ONNX Runtime's own record of where each node of the last compiled graph runs."""
    from qnnx_backend import _compiled

    (variant,) = _compiled.live_graphs()[-1]._variants.values()
    return qnnx_detection.node_placement(variant._program.session) or {}


def _split_on_the_npu(model: nn.Module, x: torch.Tensor) -> qnnx_backend.CompileReport:
    """Compile with the default options, check the result against eager and that the graph runs on the NPU."""
    got, ref = _compile_and_run(model, x, AUTO)
    assert_close_fp16(got, ref)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu", report.summary()
    return report


def test_one_unsupported_op_in_the_middle_runs_the_other_nodes_on_qnn_by_default() -> None:
    """Default options: the graph runs on the NPU with only the asinh on the CPU EP, and matches eager."""
    report = _split_on_the_npu(_AsinhInTheMiddle().eval(), torch.randn(4, 16))
    assert report.placement == {"QNNExecutionProvider": 4, "CPUExecutionProvider": 1}
    ((name, reason),) = report.cpu_nodes.items()
    assert "asinh" in name and "Asinh" in reason
    assert "pinned for qnnx-opcheck" in report.summary()
    placed = _placed_by_ort()
    assert name in placed["CPUExecutionProvider"] and name not in placed["QNNExecutionProvider"]


@pytest.mark.parametrize(
    ("model_type", "pinned_ops"),
    [(_TopKInTheMiddle, {"TopK"}), (_FloorOfTheInput, {"Floor", "Mul"})],
    ids=["topk", "floor-of-input"],
)
def test_a_known_wrong_node_runs_on_the_cpu_ep_never_on_qnn(model_type: type[nn.Module], pinned_ops: set[str]) -> None:
    """TopK and a Floor (with the Mul computing its input) are on ORT's CPU EP, which QNN's own capability check
    would have taken; the graph is still on the NPU and matches eager."""
    model, x = model_type().eval(), torch.randn(4, 16)
    report = _split_on_the_npu(model, x)
    placed = _placed_by_ort()
    assert set(report.cpu_nodes) <= set(placed["CPUExecutionProvider"])
    assert not set(report.cpu_nodes) & set(placed["QNNExecutionProvider"])
    assert all(report.cpu_nodes.values())  # each with opcheck's reason
    with torch.no_grad():
        explained = qnnx_backend.explain(model, x, compile=True, soc_model=60)
    on_cpu = {n.op_type for n in explained.graphs[0].nodes if n.placement == "ORT CPU"}
    assert on_cpu == pinned_ops


def test_a_split_that_leaves_half_or_less_on_qnn_runs_in_pytorch() -> None:
    """Floor of a Linear's output pins that Linear too: QNN would keep 1 of 5 nodes, so the graph runs in PyTorch
    (exactly eager), and the reason says why; partition='mixed' splits it anyway."""
    model = _FloorOfAComputedValue().eval()
    x = torch.randn(4, 16)
    got, ref = _compile_and_run(model, x, AUTO)
    assert torch.equal(got, ref)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "eager"
    assert "half of the nodes" in report.attempts[0].reason or "half or less" in report.attempts[0].reason
    torch._dynamo.reset()
    got, ref = _compile_and_run(model, x, {**AUTO, "device": "npu", "partition": "mixed"})
    torch.testing.assert_close(got, ref)  # the Floor and everything before it ran on the CPU EP, in float32
    assert qnnx_backend.compile_reports()[-1].device == "npu"


def test_strict_keeps_whole_graph_placement() -> None:
    """strict=True means the whole graph on the chosen device or an error naming the refused node; so does
    partition='whole' without strict, which runs the graph in PyTorch."""
    model = _AsinhInTheMiddle().eval()
    x = torch.randn(4, 16)
    for device in ("npu", "auto"):
        torch._dynamo.reset()
        with pytest.raises(QnnDeviceError, match="Asinh"):
            _compile_and_run(model, x, {**AUTO, "device": device, "strict": True})
    torch._dynamo.reset()
    got, ref = _compile_and_run(model, x, {**AUTO, "partition": "whole"})
    assert torch.equal(got, ref)
    assert qnnx_backend.compile_reports()[-1].device == "eager"


def test_explain_shows_the_split_with_opchecks_reasons() -> None:
    """explain() predicts the split (QNN?/CPU? per node), names the pinned op types and opcheck's reason, and with
    compile=True reads ONNX Runtime's real placement."""
    model = _AsinhInTheMiddle().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        predicted = qnnx_backend.explain(model, x, soc_model=60)
        compiled = qnnx_backend.explain(model, x, soc_model=60, compile=True)
    (graph,) = predicted.graphs
    assert graph.final_device == "npu" and graph.cpu_op_types == ("Asinh",)
    asinh = next(n for n in graph.nodes if n.op_type == "Asinh")
    assert asinh.verdict == "unsupported" and asinh.cpu_reason and "declines" in asinh.cpu_reason
    text = str(predicted)
    assert "split: 4 ONNX nodes on QNN, 1 on the ORT CPU EP (pinned op types: Asinh)" in text
    assert "CPU?" in text and "on the ORT CPU EP, because:" in text
    assert predicted.summary().startswith("1 graph, 4/5 ONNX nodes on QNN")
    placed = {n.op_type: n.placement for n in compiled.graphs[0].nodes}
    assert placed == {"Gemm": "QNN", "Asinh": "ORT CPU", "Relu": "QNN"}
    assert compiled.summary().startswith("1 graph, 4/5 ONNX nodes on QNN")


def test_a_split_graph_loads_from_the_context_cache_with_its_cpu_nodes(tmp_path) -> None:
    """A split graph's compiled context holds its CPU nodes: a cache hit keeps them on the CPU EP and matches."""
    model = _TopKInTheMiddle().eval()
    x = torch.randn(4, 16)
    options = {**AUTO, "cache": True, "cache_dir": str(tmp_path)}
    first, ref = _compile_and_run(model, x, options)
    torch._dynamo.reset()
    again, _ = _compile_and_run(model, x, options)
    miss, hit = qnnx_backend.compile_reports()
    assert (miss.cache, hit.cache) == ("miss", "hit") and hit.device == "npu"
    assert hit.cpu_nodes == miss.cpu_nodes and hit.cpu_nodes
    placed = _placed_by_ort()
    assert all(name.startswith("QNNExecutionProvider_") for name in placed["QNNExecutionProvider"])
    assert set(hit.cpu_nodes) <= set(placed["CPUExecutionProvider"])
    assert_close_fp16(again, ref)
    torch.testing.assert_close(again, first)


_SUPPORTED = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    # TopK of a Linear's output: QNN computed that value in fp16, so TopK stays on QNN (pinned only when the plan
    # moves its producer to the CPU EP, as a refused op before it can do).
    "topk": lambda t: torch.topk(t, t.shape[-1], dim=-1).values,
}
_REFUSED = {
    "asinh": torch.asinh,  # declined by the QNN EP
    "atanh": lambda t: torch.atanh(torch.tanh(t) * 0.9),  # declined by the QNN EP
}
_OPS = {**_SUPPORTED, **_REFUSED}


@given(
    supported=st.lists(st.sampled_from(sorted(_SUPPORTED)), min_size=1, max_size=3),
    refused=st.lists(st.sampled_from(sorted(_REFUSED)), min_size=1, max_size=2),
    seed=seeds(),
)
def test_random_chains_of_supported_and_refused_ops_match_eager(
    supported: list[str], refused: list[str], seed: int
) -> None:
    """Property: Linear layers with supported and refused ops between them, in a random order, match eager within
    fp16 under the default options, wherever the graph ends up (split on the NPU, or PyTorch when QNN would keep
    half of the nodes or fewer); when it is split, every pinned node is on the CPU EP, none on QNN."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    names = supported + refused
    random.Random(seed).shuffle(names)
    layers = nn.ModuleList(nn.Linear(12, 12) for _ in names)

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = layers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer, name in zip(self.layers, names):
                x = _OPS[name](layer(x))
            return x

    model = Chain().eval()
    x = torch.randn(3, 12)
    got, ref = _compile_and_run(model, x, AUTO)
    # The backend's own accuracy-guard limit (verify_rtol): chained tanh/sigmoid on QNN alone, split or not, reach
    # 2e-2 of an output of scale 0.5 on the simulator.
    assert_close_fp16(got, ref, rel=5e-2)
    (report,) = qnnx_backend.compile_reports()
    assert report.device in ("npu", "eager"), report.summary()
    if report.device == "npu":
        assert report.cpu_nodes, report.summary()  # a refused op is in every chain: the graph must be split
        placed = _placed_by_ort()
        assert set(report.cpu_nodes) <= set(placed["CPUExecutionProvider"])
        assert not set(report.cpu_nodes) & set(placed["QNNExecutionProvider"])


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


@pytest.mark.parametrize("rebuilt", [False, True], ids=["from-context", "rebuilt"])
def test_a_saved_split_graph_keeps_its_cpu_nodes_when_loaded(tmp_path, monkeypatch, rebuilt: bool) -> None:
    """A saved function with a split graph loads with the TopK on the CPU EP, from its compiled context or rebuilt
    from its saved ONNX model (another onnxruntime-qnn), and matches eager."""
    model, x = _TopKInTheMiddle().eval(), torch.randn(4, 16)
    path = tmp_path / "split.qnnx"
    with torch.no_grad():
        compiled = torch.compile(_forward, backend="qnn", fullgraph=True, options=AUTO).aot_compile(((model, x), {}))
        compiled.save_compiled_function(str(path))
        expected = model(x)
    if rebuilt:
        from qnnx_backend import _session

        real = _session.runtime_versions
        monkeypatch.setattr(_session, "runtime_versions", lambda: {**real(), "onnxruntime-qnn": "9.9.9"})
    with open(path, "rb") as fh, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.compiler.load_compiled_function(fh)
    with torch.no_grad():
        got = loaded(model, x)
    report = qnnx_backend.compile_reports()[-1]
    assert report.cache == ("aot-rebuilt" if rebuilt else "aot")
    assert report.placement.get("CPUExecutionProvider") == 1, report.placement
    assert_close_fp16(got, expected)
