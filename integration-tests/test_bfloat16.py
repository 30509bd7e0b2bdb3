"""A model loaded in bfloat16 (``torch_dtype=torch.bfloat16``, how most LLM checkpoints ship): QNN has no bfloat16,
so the graph is exported in float32 (float16 with ``fp16=True``), the caller's tensors are cast at the boundary and
the outputs come back in bfloat16. It ran wholly in PyTorch before (the direct translator declined bfloat16
arguments and torch.onnx's bfloat16 model did not run on ONNX Runtime's CPU EP for its check)."""

from __future__ import annotations

import warnings

import pytest
import torch
from integration_models import TINY_DECODER

import qnnx_backend
from qnnx_backend import hf


def _llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY_DECODER)
    return transformers.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)


@pytest.mark.parametrize("fp16", [False, True])
def test_a_bfloat16_decoder_runs_wholly_on_the_npu_and_returns_bfloat16(fp16: bool) -> None:
    model = _llama()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.compile(model, backend="qnn", options={"strict": True, "soc_model": 60, "fp16": fp16})(ids).logits
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and not report.cpu_nodes, report.summary()
    assert report.export is not None and report.export.exporter == "fast", report.export
    assert out.dtype == torch.bfloat16
    cosine = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), dim=0).item()
    assert cosine > 0.999, cosine


def test_a_bfloat16_decoder_generates_eagers_tokens_on_the_npu() -> None:
    """Prefill and decode on the NPU, the bfloat16 static cache written back at each step, eager's tokens."""
    model, reference = _llama(), _llama()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        want = reference.generate(ids, **kwargs)
        hf.compile_for_generation(model, max_cache_len=32, options={"strict": True, "soc_model": 60})
        with warnings.catch_warnings():
            warnings.simplefilter("error", qnnx_backend.errors.QnnFallbackWarning)
            got = model.generate(ids, **kwargs)
    reports = qnnx_backend.compile_reports()
    assert len(reports) >= 2 and all(r.device == "npu" for r in reports), [r.summary() for r in reports]
    assert torch.equal(got, want), (got.tolist(), want.tolist())
