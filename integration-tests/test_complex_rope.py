"""Rotary embeddings written with complex numbers (Llama 4, Meta's reference Llama): the complex values are carried
as real pairs, so the graph runs wholly on QNN under strict=True with eager's outputs."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import assert_close_fp16

import qnnx_backend

NPU_STRICT = {"device": "npu", "soc_model": 60, "verify": False, "strict": True}


class _ComplexRopeAttention(torch.nn.Module):
    """Meta's reference Llama attention: ``freqs_cis`` is a complex buffer made by torch.polar, sliced to the
    sequence, and applied through view_as_complex / view_as_real."""

    def __init__(self, dim: int = 64, heads: int = 4, length: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        freqs_cis = self.freqs_cis[:s].view(1, s, 1, self.head_dim // 2)
        q_ = torch.view_as_complex(q.float().reshape(b, s, self.heads, -1, 2))
        k_ = torch.view_as_complex(k.float().reshape(b, s, self.heads, -1, 2))
        q = torch.view_as_real(q_ * freqs_cis).flatten(3).type_as(x).transpose(1, 2)
        k = torch.view_as_real(k_ * freqs_cis).flatten(3).type_as(x).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        out = torch.softmax(scores, -1) @ v.transpose(1, 2)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def _on_qnn(fn: torch.nn.Module | object, *args: torch.Tensor) -> torch.Tensor:
    """``fn`` compiled for the NPU under strict=True and called once; every graph must be wholly on QNN."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        out = torch.compile(fn, backend="qnn", options=NPU_STRICT)(*args)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    return out


def test_complex_rope_attention_runs_wholly_on_qnn() -> None:
    """An attention block with a complex freqs_cis buffer runs on the NPU (no CPU-EP node) with eager's output."""
    torch.manual_seed(0)
    model = _ComplexRopeAttention().eval()
    x = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
    assert_close_fp16(_on_qnn(model, x), ref, cos=0.999)


def test_llama4_text_runs_wholly_on_qnn() -> None:
    """A tiny Llama 4 text model (rope by torch.polar and complex products; dense MLP layers) runs as one graph
    on the NPU with eager's logits."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Llama4TextConfig(
        hidden_size=64,
        intermediate_size=128,
        intermediate_size_mlp=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=128,
        # Dense layers only: the routed experts' scatter is another matter (QNN HTP reads a runtime
        # ScatterElements index wrongly when it may be negative), not the rope's.
        moe_layers=[],
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    out = _on_qnn(lambda t: model(t, use_cache=False).logits, ids)
    assert_close_fp16(out, ref, cos=0.999)
