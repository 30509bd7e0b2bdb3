"""Rotary embeddings written with complex numbers (Llama 4, Meta's reference Llama): the complex values are carried
as real pairs, so the graph runs wholly on QNN under strict=True with eager's outputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from integration_helpers import assert_close_fp16, on_qnn_strict
from integration_models import tiny_llama4_text

import qnnx_backend

NPU_STRICT = {"device": "npu", "soc_model": 60, "verify": False, "strict": True}


class _ComplexRopeAttention(torch.nn.Module):
    """Meta's reference Llama attention: ``freqs_cis`` is a complex tensor made by torch.polar and kept as a plain
    attribute, sliced to the sequence, and applied through view_as_complex / view_as_real."""

    def __init__(self, dim: int = 64, heads: int = 4, length: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
        self.freqs_cis = torch.polar(torch.ones_like(angles), angles)

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
    return on_qnn_strict(fn, *args, options=NPU_STRICT)


def test_complex_rope_attention_runs_wholly_on_qnn() -> None:
    """An attention block with a complex freqs_cis attribute runs on the NPU (no CPU-EP node) with eager's output;
    after freqs_cis is replaced, the next call gives the new eager output."""
    torch.manual_seed(0)
    model = _ComplexRopeAttention().eval()
    x = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        assert_close_fp16(compiled(x), ref, cos=0.999)
        model.freqs_cis = model.freqs_cis.conj().resolve_conj()
        changed = model(x)
        assert_close_fp16(compiled(x), changed, cos=0.999)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]


def _llama4_text() -> tuple[Any, torch.Tensor]:
    """Llama 4 text: freqs_cis made by torch.polar in the graph, dense MLP layers (its MoE layers are tested in
    test_moe.py)."""
    model = tiny_llama4_text(moe_layers=[])
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    return lambda t: model(t, use_cache=False).logits, ids


def _llama4_vision() -> tuple[Any, torch.Tensor]:
    """Llama 4's vision encoder: a complex freqs_ci buffer (view_as_complex of cos and sin), 2-D patch rope."""
    import transformers

    cfg = transformers.Llama4VisionConfig(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        vision_output_dim=64,
        projector_input_dim=64,
        projector_output_dim=64,
        attn_implementation="eager",
    )
    model = transformers.Llama4VisionModel(cfg).eval()
    return lambda t: model(t).last_hidden_state, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _deepseek_v2() -> tuple[Any, torch.Tensor]:
    """DeepSeek-V2: latent attention whose rope part is complex arithmetic on freqs_cis from torch.polar (dense
    layers only, for the experts' reason above)."""
    import transformers

    cfg = transformers.DeepseekV2Config(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        first_k_dense_replace=2,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    return lambda t: model(t, use_cache=False).logits, ids


FAMILIES = {"deepseek_v2": _deepseek_v2, "llama4_text": _llama4_text, "llama4_vision": _llama4_vision}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_with_complex_rope_runs_wholly_on_qnn(family: str) -> None:
    """A tiny model of the family (its rope written with complex numbers) runs as one graph wholly on the NPU
    under strict=True with eager's output."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    fn, x = FAMILIES[family]()
    with torch.no_grad():
        ref = fn(x)
    assert_close_fp16(_on_qnn(fn, x), ref, cos=0.999)
