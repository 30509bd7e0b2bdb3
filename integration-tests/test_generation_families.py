"""Decoder families whose generation graphs ran in PyTorch for one op each: with compile_for_generation the prefill
and decode graphs run wholly on QNN (strict placement: a fallback raises) and greedy generation gives eager's
static-cache tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from integration_helpers import generate_wholly_on_qnn
from integration_models import TINY_DECODER

transformers = pytest.importorskip("transformers")

_TINY = {**TINY_DECODER, "head_dim": 8}


def _hunyuan_moe() -> torch.nn.Module:
    """HunYuan-MoE-V1 at its default of one expert: the router counts tokens per expert with histc(bins=1, min=0,
    max=0), whose range comes from the data."""
    return transformers.HunYuanMoEV1ForCausalLM(transformers.HunYuanMoEV1Config(**_TINY))


def _ministral3() -> torch.nn.Module:
    """Ministral 3 scales its queries by 1 + beta * log(1 + floor(position / n)); n = 8 here, so the floor steps
    within the 11 positions generated (at 16384, its default, it would stay 0)."""
    rope = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 16.0,
        "original_max_position_embeddings": 8,
        "llama_4_scaling_beta": 0.5,
    }
    return transformers.Ministral3ForCausalLM(transformers.Ministral3Config(**_TINY, rope_parameters=rope))


def _deepseek_v3() -> torch.nn.Module:
    """DeepSeek-V3 (latent attention; a dense first layer, then 4 routed experts): its router masks the groups it
    keeps with ``zeros.scatter_(1, idx, 1)`` read as ``mask.bool()``, then fills the others with -inf before topk."""
    config = transformers.DeepseekV3Config(
        **{**TINY_DECODER, "num_key_value_heads": 4},  # latent attention has one key/value head per query head
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
    )
    return transformers.DeepseekV3ForCausalLM(config)


def _phimoe() -> torch.nn.Module:
    """Phi-MoE's sparsemixer router picks experts with ``max(scores, -1)`` (values and indices), scatters -inf over
    the first pick and clamps by the maximum of what is left."""
    config = transformers.PhimoeConfig(**TINY_DECODER, num_local_experts=4, num_experts_per_tok=2)
    return transformers.PhimoeForCausalLM(config)


def _diffllama() -> torch.nn.Module:
    """DiffLlama normalizes its differential attention with ``nn.RMSNorm``, whose ATen kernel adds eps in place:
    the graph that also writes the static cache could be exported neither by the translator nor by torch.onnx."""
    return transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**_TINY))


def _gpt_neo() -> torch.nn.Module:
    """GPT-Neo (a global and a local layer) adds the causal mask's float32 minimum to the padding mask's: a prompt
    padded on the left to its bucket has query rows whose every key is masked, where eager sums to -inf and HTP's
    fp16 cannot. Its prefill left the NPU at the first-call check, over cache rows no real token reads."""
    config = transformers.GPTNeoConfig(
        vocab_size=256,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        attention_types=[[["global", "local"], 1]],
        window_size=256,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.GPTNeoForCausalLM(config)


@pytest.mark.parametrize(
    "build",
    [_hunyuan_moe, _ministral3, _deepseek_v3, _phimoe, _diffllama],
    ids=["hunyuan_moe_v1", "ministral3", "deepseek_v3", "phimoe", "diffllama"],
)
def test_family_generates_eagers_tokens_wholly_on_qnn(build: Callable[[], torch.nn.Module]) -> None:
    """compile_for_generation + generate(max_new_tokens=5, greedy): two graphs (prefill, decode), both wholly on
    QNN under strict device='npu' (they ran in PyTorch: histc, a float floor of positions, a scattered group mask,
    max with indices and nn.RMSNorm's in-place add had no QNN form), and the tokens equal eager's greedy static-cache tokens."""
    torch.manual_seed(0)
    model = build().eval()
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False}
    options = {"device": "npu", "strict": True, "soc_model": 60}
    out, reference = generate_wholly_on_qnn(model, prompt, 64, options, eager_cache="static", **kwargs)
    assert torch.equal(out, reference), (out.tolist(), reference.tolist())


def test_a_prompt_padded_to_its_bucket_is_checked_at_its_real_positions_only() -> None:
    """GPT-Neo's prefill, its 6-token prompt padded on the left to the 16-token bucket: layer 1's returned cache
    differs from eager's by 0.2 of its scale at the padding's rows (eager's -inf sums there), which left the NPU
    under the first-call check (strict: raised). The check now compares the real positions, both graphs run wholly
    on QNN and the tokens are eager's."""
    torch.manual_seed(0)
    model = _gpt_neo().eval()
    prompt = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False}
    options = {"device": "npu", "strict": True, "soc_model": 60}
    out, reference = generate_wholly_on_qnn(model, prompt, 32, options, eager_cache="static", **kwargs)
    assert torch.equal(out, reference), (out.tolist(), reference.tolist())


def _roformer() -> torch.nn.Module:
    """RoFormer as a decoder: its sinusoidal positions are ``torch.arange(cache_length, cache_length + n)`` with the
    cache's length read as a number, which Dynamo cannot capture in one graph once the cache holds tokens."""
    config = transformers.RoFormerConfig(
        vocab_size=100,
        hidden_size=32,
        embedding_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        is_decoder=True,
    )
    return transformers.RoFormerForCausalLM(config).eval()


@pytest.mark.parametrize("strict", [False, True])
def test_a_forward_dynamo_cannot_trace_generates_in_pytorch_with_one_warning(strict: bool) -> None:
    """A decode step Dynamo fails to trace (``PendingUnbackedSymbolNotFound``) runs in PyTorch with one warning that
    names Dynamo's error, and generation gives eager's tokens; the prefill, which traces, still runs on QNN. Under
    ``strict`` the error is raised."""
    import qnnx_backend
    from qnnx_backend.errors import QnnFallbackWarning
    from qnnx_backend.hf import compile_for_generation

    torch.manual_seed(0)
    model = _roformer()
    prompt = torch.randint(3, 100, (1, 6))
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=4, do_sample=False)
    qnnx_backend.clear_compile_reports()
    compile_for_generation(model, max_cache_len=32, options={"soc_model": 60, "strict": strict})
    if strict:
        with pytest.raises(torch._dynamo.exc.InternalTorchDynamoError), torch.no_grad():
            model.generate(prompt, max_new_tokens=4, do_sample=False)
        return
    with pytest.warns(QnnFallbackWarning, match="Dynamo cannot trace") as caught, torch.no_grad():
        out = model.generate(prompt, max_new_tokens=4, do_sample=False)
    assert sum("Dynamo cannot trace" in str(w.message) for w in caught) == 1
    assert torch.equal(out, ref)
    (prefill,) = qnnx_backend.compile_reports()
    assert prefill.device == "npu"
