"""Graphs whose weights exceed one QNN context (``max_graph_bytes``) run as parts, one context each, on the HTP
simulator: the same outputs as the graph compiled whole, cut between blocks, cached and explained like a graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import qnnx_backend

_NPU = {"device": "npu", "strict": True, "soc_model": 60}


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(channels, channels, 3, padding=1)
        self.b = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(torch.relu(self.a(x))))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        *[_Block(16) for _ in range(3)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()


def _compile(model: nn.Module, x: torch.Tensor, **options: object) -> torch.Tensor:
    torch._dynamo.reset()
    with torch.no_grad():
        out: torch.Tensor = torch.compile(model, backend="qnn", options={**_NPU, **options})(x)
    return out


def test_a_cnn_split_in_parts_equals_the_unsplit_compile() -> None:
    """A budget below the model's weights: the graph runs as parts, every node on QNN, and its outputs are those
    of the graph compiled as one context, bit for bit (the same fp16 numerics on the same nodes)."""
    model, x = _cnn(), torch.randn(2, 3, 12, 12)
    whole = _compile(model, x)
    assert not qnnx_backend.compile_reports()[-1].parts
    budget = 2 * 16 * 16 * 9 * 2 + 256  # about one residual block (two 3x3 convs) in float16
    split = _compile(model, x, max_graph_bytes=budget)
    report = qnnx_backend.compile_reports()[-1]
    assert len(report.parts) >= 2, report.summary()
    assert all(p.weight_bytes <= budget for p in report.parts), report.parts
    assert sum(p.onnx_nodes for p in report.parts) == report.onnx_nodes
    assert set(report.placement) == {"QNNExecutionProvider"}, report.placement
    assert f"in {len(report.parts)} parts" in report.summary()
    assert torch.equal(split, whole)


def test_explain_shows_the_cut_points_before_any_compile() -> None:
    model, x = _cnn(), torch.randn(1, 3, 12, 12)
    budget = 2 * 16 * 16 * 9 * 2 + 256
    with torch.no_grad():
        report = qnnx_backend.explain(model, x, device="npu", soc_model=60, max_graph_bytes=budget)
    (graph,) = report.graphs
    assert len(graph.parts) >= 2
    assert f"{len(graph.parts)} parts (max_graph_bytes={budget})" in str(report)
    with torch.no_grad():
        compiled = qnnx_backend.explain(model, x, device="npu", soc_model=60, max_graph_bytes=budget, compile=True)
    assert compiled.graphs[0].parts == graph.parts
    assert compiled.graphs[0].nodes_on_qnn() == compiled.graphs[0].onnx_nodes


def test_parts_are_cached_and_a_hit_runs_them(tmp_path: Path) -> None:
    model, x = _cnn(), torch.randn(1, 3, 12, 12)
    options = {"max_graph_bytes": 2 * 16 * 16 * 9 * 2 + 256, "cache": True, "cache_dir": str(tmp_path)}
    first = _compile(model, x, **options)
    miss = qnnx_backend.compile_reports()[-1]
    assert miss.cache == "miss" and len(miss.parts) >= 2
    assert len(list(tmp_path.rglob("part*_model_ctx.onnx"))) == len(miss.parts)
    second = _compile(model, x, **options)
    hit = qnnx_backend.compile_reports()[-1]
    assert hit.cache == "hit" and hit.parts == miss.parts
    assert torch.equal(first, second)


def _tiny_llama(layers: int, vocab: int = 128, tied: bool = False) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=tied,
    )  # fmt: skip
    model: nn.Module = transformers.LlamaForCausalLM(config).eval()
    return model


def test_a_tied_embedding_counts_as_the_two_copies_qnn_stores(tmp_path: Path) -> None:
    """QNN stores a tied embedding table twice (the embedding's table, the output head's weight): the report's weight
    bytes say so, as the context's size does (one copy would be about half of it), and as for the untied model."""
    figures = {}
    for tied in (True, False):
        model = _tiny_llama(layers=1, vocab=8192, tied=tied)
        ids = torch.randint(3, 8192, (1, 8), generator=torch.Generator().manual_seed(1))
        _compile(lambda x, m=model: m(input_ids=x, use_cache=False).logits, ids, cache=True, cache_dir=str(tmp_path))
        report = qnnx_backend.compile_reports()[-1]
        assert set(report.placement) == {"QNNExecutionProvider"} and report.context_bytes, report.summary()
        figures[tied] = (report.weight_bytes, report.context_bytes)
    table = 8192 * 32 * 2  # float16 on the NPU
    assert figures[True][0] == figures[False][0] >= 2 * table, figures
    for weights, context in figures.values():  # measured: 1,068,674 weight bytes, contexts of 1,217,386
        assert weights <= context <= weights + 256 * 1024, figures  # the context's own overhead: about 150 KiB
        assert weights - table + 256 * 1024 < context, figures  # one copy of the table would be far too few


def test_a_decoder_split_in_four_parts_generates_eager_tokens() -> None:
    """A tiny Llama whose prefill and decode graphs each run as at least 4 parts: the cut keeps every layer's
    cache writes with its own part, and generation gives eager's tokens with logits within fp16 noise."""
    from qnnx_backend.hf import compile_for_generation

    model = _tiny_llama(layers=4)
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    generate = {"max_new_tokens": 4, "do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad():
        eager = model.generate(prompt, **generate)
    layer_bytes = sum(p.numel() for p in model.model.layers[0].parameters()) * 2  # float16 on the NPU
    qnnx_backend.clear_compile_reports()
    compile_for_generation(model, max_cache_len=32, options={"soc_model": 60, "max_graph_bytes": layer_bytes + 1024})
    with torch.no_grad():
        got = model.generate(prompt, **generate)
    reports = qnnx_backend.compile_reports()
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert all(len(r.parts) >= 4 for r in reports), [r.summary() for r in reports]
    assert all(set(r.placement) == {"QNNExecutionProvider"} for r in reports), [r.placement for r in reports]
    assert torch.equal(got.sequences, eager.sequences)
    for step, (a, b) in enumerate(zip(got.logits, eager.logits)):
        a, b = a[0].double(), b[0].double()
        scale = float(b.abs().max())
        assert float((a - b).abs().max()) <= 5e-2 * scale, f"step {step}: logits off"
        assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) >= 0.999, f"step {step}: cosine"


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1GiB", True])
def test_a_bad_budget_names_the_value_and_the_accepted_form(bad: object) -> None:
    with pytest.raises(qnnx_backend.errors.InvalidOptionsError, match=rf"max_graph_bytes={bad!r}.*positive int"):
        qnnx_backend.BackendOptions.from_mapping({"max_graph_bytes": bad})


_LOAD_CHILD = """
import json, sys
import numpy as np
import torch
import qnnx_backend
x = torch.load(sys.argv[2])
model = qnnx_backend.load(sys.argv[1])
out = model(x)
arrays = qnnx_backend.load_arrays(sys.argv[1])(x.numpy())
report = model.reports[0]
print(json.dumps({
    "cache": report.cache, "parts": len(report.parts), "placement": dict(report.placement),
    "same": bool(torch.equal(out, torch.load(sys.argv[3]))),
    "arrays_same": bool(np.array_equal(next(iter(arrays.values())), out.numpy())),
}))
"""


def test_a_split_graph_saves_and_loads_in_a_fresh_process(tmp_path: Path) -> None:
    """qnnx_backend.save of a graph that runs as parts keeps one context per part; a fresh process loads them
    (with torch, and through the torch-free loader) and returns the saving process's outputs bit for bit."""
    import json
    import os
    import subprocess
    import sys

    model, x = _cnn(), torch.randn(1, 3, 12, 12)
    options = {**_NPU, "max_graph_bytes": 2 * 16 * 16 * 9 * 2 + 256}
    report = qnnx_backend.save(model, x, tmp_path / "cnn.qnnx", options=options)
    torch.save(x, tmp_path / "x.pt")
    torch.save(report.outputs, tmp_path / "out.pt")
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, str(tmp_path / "cnn.qnnx"), str(tmp_path / "x.pt"), str(tmp_path / "out.pt")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "QNNX_CACHE": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cache"] == "aot" and result["parts"] >= 2, result
    assert set(result["placement"]) == {"QNNExecutionProvider"}, result
    assert result["same"] and result["arrays_same"], result


def test_the_report_gives_the_weight_bytes_held_on_the_npu_and_the_context_bytes_on_disk(tmp_path: Path) -> None:
    """A graph's report counts its weights as the NPU holds them (float16), exactly, and the bytes of the contexts
    it was written to: one context when whole, every part's context when split, matching the files."""
    model, x = _cnn(), torch.randn(1, 3, 12, 12)
    params = sum(p.numel() for p in model.parameters())  # 14538 float32 parameters
    held = 2 * params + 2 * 2 * 8  # in float16, plus two int64 pairs: the pooling's axes and the flatten's shape
    _compile(model, x, cache=True, cache_dir=str(tmp_path / "whole"))
    whole = qnnx_backend.compile_reports()[-1]
    assert whole.weight_bytes == held and whole.weight_copies == 1, whole.summary()
    on_disk = [f for f in (tmp_path / "whole").rglob("*") if f.is_file() and f.name.endswith(("_ctx.onnx", ".bin"))]
    assert whole.context_bytes == sum(f.stat().st_size for f in on_disk) > whole.weight_bytes
    assert f"{whole.weight_bytes / 1024:.1f} KiB of weights (1 copy)" in whole.summary()

    budget = 2 * 16 * 16 * 9 * 2 + 256
    _compile(model, x, max_graph_bytes=budget)  # no cache: the parts' contexts are written to a folder of its own
    split = qnnx_backend.compile_reports()[-1]
    assert len(split.parts) >= 2 and split.weight_bytes == held and split.weight_copies == 1
    assert sum(p.weight_bytes for p in split.parts) == split.weight_bytes  # no tensor is read by two parts
    assert split.context_bytes is not None and split.context_bytes > split.weight_bytes
    _compile(model, x)
    assert qnnx_backend.compile_reports()[-1].context_bytes is None  # compiled in memory, nothing written
    with torch.no_grad():
        explained = qnnx_backend.explain(model, x, device="npu", soc_model=60)
    assert explained.graphs[0].weight_bytes == held
    assert f"weights: {held / 2**20:.1f} MiB" in str(explained)


def test_generation_memory_counts_one_weight_copy_per_graph_and_says_why(tmp_path: Path) -> None:
    """A decoder's prefill and decode graphs each hold the whole model's weights: the per-model view says 2 copies
    of the same weight bytes, sums the contexts on disk, and gives the weight-sharing probe's verdict here."""
    import qnnx_detection
    from qnnx_backend.hf import compile_for_generation, generation_memory

    model = _tiny_llama(layers=2)
    with pytest.raises(qnnx_backend.errors.InvalidOptionsError, match="compile_for_generation"):
        generation_memory(model)
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    options = {"soc_model": 60, "cache": True, "cache_dir": str(tmp_path)}
    compile_for_generation(model, max_cache_len=32, options=options)
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=3, do_sample=False)
    memory = generation_memory(model)
    assert len(memory.graphs) == 2 and all(g.on_qnn for g in memory.graphs), memory.summary()
    params = sum(p.numel() for p in model.parameters())
    # the float16 parameters, plus each graph's own small constants (rotary tables, mask and shape constants)
    assert all(2 * params <= g.weight_bytes <= 2 * params + 8192 for g in memory.graphs if g.weight_bytes)
    assert memory.weight_bytes == max(g.weight_bytes or 0 for g in memory.graphs)
    assert memory.weight_copies == 2
    files = [f for f in tmp_path.rglob("*") if f.is_file() and f.name.endswith(("_ctx.onnx", ".bin"))]
    assert memory.context_bytes == sum(f.stat().st_size for f in files)
    verdict = qnnx_detection.probe_weight_sharing(soc_model=60)
    assert not verdict.supported  # the x86_64 simulator cannot load a weight-shared context
    assert memory.weight_sharing == f"not supported on this target ({verdict.reason})"
    assert "2 weight copies" in memory.summary() and memory.to_dict()["weight_copies"] == 2


def _calibrated_outputs(model: nn.Module, xs: list[torch.Tensor], **options: object) -> list[torch.Tensor]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="qnn", options={**_NPU, "quantize": "a16w8", **options})
    with torch.no_grad(), qnnx_backend.calibrate(compiled):
        for x in xs:
            compiled(x)
    with torch.no_grad():
        return [compiled(x) for x in xs]


def test_a_quantized_graph_split_in_parts_equals_the_unsplit_quantized_compile() -> None:
    """A QDQ graph (a16w8, after calibrate) split under a small budget runs as parts with the unsplit quantized
    graph's outputs bit for bit: the QDQ model is made once, before the cut, so each part keeps the same scales,
    and the values crossing a cut are the ones that cross between QNN ops inside one context."""
    model = _cnn()
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 3, 12, 12, generator=generator) for _ in range(8)]
    whole = _calibrated_outputs(model, xs)
    unsplit = qnnx_backend.compile_reports()[-1]
    assert unsplit.quantization is not None and unsplit.quantization.used and not unsplit.parts
    # uint8 weights: about half the float16 bytes (the biases are int32, the scales small)
    float16_bytes = 2 * sum(p.numel() for p in model.parameters())
    assert unsplit.weight_bytes is not None and unsplit.weight_bytes < 0.6 * float16_bytes
    budget = 2 * 16 * 16 * 9 + 1024  # about one residual block's uint8 weights
    split = _calibrated_outputs(model, xs, max_graph_bytes=budget)
    report = qnnx_backend.compile_reports()[-1]
    assert report.quantization is not None and report.quantization.used, report.summary()
    assert len(report.parts) >= 2 and set(report.placement) == {"QNNExecutionProvider"}, report.summary()
    assert report.weight_bytes == unsplit.weight_bytes
    assert all(torch.equal(a, b) for a, b in zip(split, whole))


class _AsinhBlocks(nn.Module):
    """Four blocks of Linear -> asinh (the QNN EP declines it, so it runs on the CPU EP) -> Linear -> ReLU, with a
    residual."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32)]) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for a, b in self.blocks:
            x = x + torch.relu(b(torch.asinh(a(x))))
        return x


def test_cpu_ep_nodes_in_several_parts_run_with_eagers_outputs() -> None:
    """Under partition="auto" the nodes qnnx-opcheck refuses run on ONNX Runtime's CPU EP in every part that holds
    one, the rest on QNN, and the split graph gives eager's outputs within fp16 noise."""
    from integration_helpers import assert_close_fp16

    model = _AsinhBlocks().eval()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    budget = 2 * (32 * 32 + 32) * 2 + 512  # one block's float16 weights
    options = {"soc_model": 60, "max_graph_bytes": budget}
    with torch.no_grad():
        explained = qnnx_backend.explain(model, x, **options)
        expected = model(x)
    (graph,) = explained.graphs
    starts = [next(i for i, n in enumerate(graph.nodes) if n.onnx_node == p.first_node) for p in graph.parts]
    bounds = [*starts[1:], len(graph.nodes)]
    pinned = [any(n.cpu_reason for n in graph.nodes[s:e]) for s, e in zip(starts, bounds)]
    assert sum(pinned) >= 2, (graph.parts, pinned)  # the refused nodes fall in several parts
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options=options)(x)
    report = qnnx_backend.compile_reports()[-1]
    assert report.device == "npu" and len(report.parts) == len(graph.parts), report.summary()
    assert report.placement.get("CPUExecutionProvider", 0) >= 4 and report.placement.get("QNNExecutionProvider")
    assert_close_fp16(got, expected)


def test_a_large_compile_runs_from_its_written_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the reload size a compile, cached or not, drops its compiling session (which holds about twice the
    weights) and runs from the context it wrote: the outputs are those of the compiling session, bit for bit."""
    from qnnx_backend import _build

    model, x = _cnn(), torch.randn(1, 3, 12, 12)
    kept = _compile(model, x, cache=True, cache_dir=str(tmp_path / "kept"))
    assert "load_npu" not in qnnx_backend.compile_reports()[-1].timings  # small: the compiling session runs it
    monkeypatch.setattr(_build, "RELOAD_ABOVE_BYTES", 0)
    reloaded = _compile(model, x, cache=True, cache_dir=str(tmp_path / "reloaded"))
    report = qnnx_backend.compile_reports()[-1]
    assert report.cache == "miss" and "load_npu" in report.timings, report.timings
    assert set(report.placement) == {"QNNExecutionProvider"} and report.context_bytes
    assert torch.equal(reloaded, kept)
    uncached = _compile(model, x)
    report = qnnx_backend.compile_reports()[-1]
    assert report.cache == "off" and "load_npu" in report.timings and report.context_bytes, report.summary()
    assert torch.equal(uncached, kept)
