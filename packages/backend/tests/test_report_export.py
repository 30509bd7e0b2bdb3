"""The compile report says how each graph was traced and exported: its FX ops, the analysis problem kinds, the
exporter (and why the direct translator declined) and the ONNX op types, on QNN, in a fallback and on a cache hit."""

from __future__ import annotations

import operator

import attrs
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend._build import _export_from
from qnnx_backend._trace import op_counts


def _report(fn, *args, **options):
    """The compile report of ``fn``'s one graph, compiled afresh on the simulator."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        torch.compile(fn, backend="qnn", options={"soc_model": 60, **options})(*args)
    return qnnx_backend.compile_reports()[-1]


def test_a_graph_on_qnn_reports_its_ops_and_the_fast_exporter():
    """A graph on the NPU: FX ops by name and count, the fast exporter, and ONNX op types summing to onnx_nodes."""
    rep = _report(lambda x, y: torch.relu(x @ y) + x.sum(-1, keepdim=True), torch.randn(4, 4), torch.randn(4, 4))
    assert rep.device == "npu"
    assert rep.fx_ops == {".sum": 1, "operator.add": 1, "operator.matmul": 1, "torch.relu": 1}
    assert rep.problem_kinds == ()
    assert rep.export is not None and rep.export.exporter == "fast" and rep.export.fast_path_declined is None
    assert {"MatMul", "Relu", "ReduceSum", "Add"} <= set(rep.export.op_types)
    assert sum(rep.export.op_types.values()) == rep.onnx_nodes
    assert "exported by" not in rep.summary()  # the usual exporter is not named
    assert rep.to_dict()["export"]["op_types"] == dict(rep.export.op_types)


def test_a_fallback_after_the_export_reports_torch_onnx_and_why_the_fast_path_declined():
    """torch.tan has no direct translation: the report names torch.onnx, the decline and the refused model's ops."""
    rep = _report(torch.tan, torch.rand(5, 5))
    assert rep.device == "eager"  # QNN takes no node of the graph here (opcheck)
    assert rep.fx_ops == {"torch.tan": 1}
    assert rep.export is not None and rep.export.exporter == "torch.onnx"
    assert "aten.tan" in rep.export.fast_path_declined
    assert rep.export.op_types == {"Tan": 1}
    assert "exported by torch.onnx (the direct translator declined: no translation for aten.tan" in rep.summary()


def test_explain_names_the_exporter_of_each_graph():
    """explain() shows how each graph was exported: torch.onnx and the decline for tan, the direct translator for a
    matmul."""
    report = qnnx_backend.explain(lambda x: torch.tan(x @ x).sum(-1), torch.rand(4, 4), soc_model=60)
    exports = [g.export for g in report.graphs]
    assert exports and all(e is not None for e in exports)
    assert exports[0].exporter == "torch.onnx" and "aten.tan" in exports[0].fast_path_declined
    assert sum(exports[0].op_types.values()) == report.graphs[0].onnx_nodes
    assert "exported by torch.onnx (the direct translator declined:" in str(report)
    plain = qnnx_backend.explain(lambda x: torch.relu(x @ x), torch.rand(4, 4), soc_model=60)
    assert plain.graphs[0].export.exporter == "fast"
    assert "exported by qnnx-export's direct translator" in str(plain)


def test_an_analysis_refusal_reports_its_problem_kinds_and_no_export():
    """A graph the analysis keeps in PyTorch (an empty tensor) reports the problem kind and was never exported."""
    rep = _report(lambda x: (x * 2.0).sum(-1), torch.randn(0))
    assert rep.device == "eager" and rep.problem_kinds == ("empty_tensor",)
    assert rep.fx_ops == {".sum": 1, "operator.mul": 1}
    assert rep.export is None


def test_a_cache_hit_reports_the_export_it_was_built_from(tmp_path):
    """A context-cache hit exports nothing, yet reports the exporter and op types its entry recorded."""
    x = torch.randn(3, 8)
    miss = _report(torch.nn.functional.gelu, x, cache=True, cache_dir=str(tmp_path))
    hit = _report(torch.nn.functional.gelu, x, cache=True, cache_dir=str(tmp_path))
    assert (miss.cache, hit.cache) == ("miss", "hit")
    assert hit.export is not None and hit.export == miss.export
    assert hit.fx_ops == miss.fx_ops == {"F.gelu": 1}


def test_an_entry_without_a_readable_export_record_reports_none():
    """Cache metadata from before the field (or of another shape) gives no export report rather than an error."""
    assert _export_from(None) is None
    assert _export_from({"exporter": "fast", "unknown_field": 1}) is None
    assert _export_from(["fast"]) is None


_NAMES = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)


@given(
    exporter=st.sampled_from(["fast", "torch.onnx", "none"]),
    declined=st.none() | st.text(max_size=40),
    op_types=st.dictionaries(_NAMES, st.integers(1, 500), max_size=8),
)
def test_an_export_report_survives_the_cache_metadata(exporter, declined, op_types):
    """What a cache entry stores of the export (attrs.asdict, JSON) reads back as the same report."""
    import json

    rep = qnnx_backend.ExportReport(exporter=exporter, fast_path_declined=declined, op_types=op_types)
    assert _export_from(json.loads(json.dumps(attrs.asdict(rep)))) == rep


_UNARY = {"torch.relu": torch.relu, "torch.tanh": torch.tanh, "torch.neg": torch.neg}
_BINARY = {"operator.add": operator.add, "operator.mul": operator.mul, "torch.maximum": torch.maximum}


@given(steps=st.lists(st.sampled_from(sorted(_UNARY) + sorted(_BINARY) + [".exp", ".abs"]), min_size=1, max_size=12))
def test_fx_op_counts_count_every_call_by_its_name(steps):
    """op_counts names each traced call like the report does and counts it once per call: the counts sum to the
    graph's calls and match the calls the function made."""

    def fn(x, y):
        for name in steps:
            if name in _UNARY:
                x = _UNARY[name](x)
            elif name in _BINARY:
                x = _BINARY[name](x, y)
            else:
                x = getattr(x, name[1:])()
        return x

    gm = torch.fx.symbolic_trace(fn)
    counts = op_counts(gm)
    assert sum(counts.values()) == len(steps)
    assert counts == {name: steps.count(name) for name in set(steps)}
    assert list(counts) == sorted(counts)
