"""Hugging Face mixture-of-experts decoders with transformers' default experts implementation (``grouped_mm``: tokens
sorted by expert, groups of data-dependent sizes), and Llama 4's dense experts behind a scattered router, run wholly
on QNN with eager's logits and tokens."""

from __future__ import annotations

import warnings

import pytest
import torch
from integration_helpers import assert_close_fp16, generate_wholly_on_qnn
from integration_models import tiny_llama4_text

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError

transformers = pytest.importorskip("transformers")

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}
VOCAB = 128


def _moe_decoder(family: str, experts: int = 4, **extra: object) -> torch.nn.Module:
    """A tiny random-init MoE decoder (hidden 32, 2 layers, 2 of ``experts`` experts per token), its experts
    implementation left at transformers' default."""
    torch.manual_seed(0)
    common: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "num_experts_per_tok": 2,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **extra,
    }
    if family == "mixtral":
        config = transformers.MixtralConfig(**common, intermediate_size=64, num_local_experts=experts)
        model = transformers.MixtralForCausalLM(config)
    elif family == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            **common,
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=experts,
        )
        model = transformers.Qwen2MoeForCausalLM(config)
    elif family == "olmoe":
        model = transformers.OlmoeForCausalLM(
            transformers.OlmoeConfig(**common, intermediate_size=64, num_experts=experts)
        )
    else:  # gpt_oss: transposed expert weights with biases, a clamped gate, sliding and full attention
        config = transformers.GptOssConfig(
            **common,
            intermediate_size=64,
            num_local_experts=experts,
            head_dim=8,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        )
        model = transformers.GptOssForCausalLM(config)
    model.eval()
    assert model.config._experts_implementation == "grouped_mm"  # the default this file is about
    return model


def _compiled_logits(model: torch.nn.Module, ids: torch.Tensor, **options: object) -> torch.Tensor:
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(lambda t: model(input_ids=t).logits, backend="qnn", options=options)
        return compiled(ids)


@pytest.mark.parametrize(
    ("family", "experts"), [("mixtral", 4), ("qwen2_moe", 4), ("olmoe", 4), ("gpt_oss", 64)], ids=lambda v: str(v)
)
def test_default_experts_decoder_runs_wholly_on_qnn_with_eagers_logits(family: str, experts: int) -> None:
    """With the default grouped_mm experts, the graph (router top-k, sort by expert, integer group ends, the grouped
    product, the inverse permutation) runs wholly on QNN under strict device='npu' and gives eager's logits (cosine
    0.9999995-0.9999996 measured; it ran in PyTorch before); the first-call check is off so that nothing hides a
    wrong result. 32 rows over 4 experts are computed densely; GPT-OSS's 32 rows over 64 experts (biases, its own
    clamped activation) gather their experts."""
    model = _moe_decoder(family, experts=experts, use_cache=False)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    out = _compiled_logits(model, ids, **NPU_STRICT, verify=False)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)


def test_llama4_moe_layers_run_wholly_on_qnn_with_eagers_logits() -> None:
    """Llama 4's router writes its top-k scores into a row of -inf with a scatter of a source
    (``full_like(logits, -inf).scatter_(1, indices, top_values)``), and its experts run densely. The translator now
    writes that scatter densely, so the whole graph runs on QNN under strict device='npu' with eager's logits (it
    raised before: QNN HTP reads a runtime ScatterElements index wrongly when it may be negative)."""
    torch.manual_seed(0)
    model = tiny_llama4_text(VOCAB, moe_layers=[0, 1], num_local_experts=4, num_experts_per_tok=1)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
    out = _compiled_logits(model, ids, **NPU_STRICT, verify=False)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)


def test_a_layer_over_both_expert_limits_runs_in_pytorch_and_says_why() -> None:
    """A layer over max_dense_experts whose gathered weights are over max_gathered_expert_bytes runs in PyTorch
    (eager's logits exactly) and the report names both options; under strict device='npu' the same refusal is an
    error."""
    model = _moe_decoder("mixtral", use_cache=False)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    limits = {"max_dense_experts": 3, "max_gathered_expert_bytes": 0}
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    out = _compiled_logits(model, ids, soc_model=60, **limits)
    (report,) = qnnx_backend.compile_reports()
    reason = report.reason or ""
    assert report.device == "eager" and "max_dense_experts=3" in reason, report.summary()
    assert "max_gathered_expert_bytes=0" in reason, report.summary()
    torch.testing.assert_close(out, ref)
    with pytest.raises(QnnDeviceError, match="4 experts"):
        _compiled_logits(model, ids, **NPU_STRICT, **limits)


def test_compile_for_generation_of_a_default_experts_decoder_gives_eagers_tokens() -> None:
    """compile_for_generation on a default-experts Mixtral: the prefill bucket (dense experts) and the decode step
    (gathered experts: 2 rows over 4 experts; static cache writes lifted) both run wholly on QNN, and greedy
    generation gives eager's 12 tokens."""
    model = _moe_decoder("mixtral")
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}
    out, ref = generate_wholly_on_qnn(model, prompt, 48, NPU_STRICT, **kwargs)
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())


def test_generation_with_more_experts_than_max_dense_experts_runs_wholly_on_qnn() -> None:
    """compile_for_generation on a default-experts OLMoE with 64 experts (over max_dense_experts=32, which ran in
    PyTorch before the gathered form): the prefill bucket and the decode step gather their rows' experts, both run
    wholly on QNN under strict device='npu', greedy generation gives eager's 8 tokens and every step's logits
    keep a cosine >= 0.999 with eager's."""
    model = _moe_decoder("olmoe", experts=64)
    prompt = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    kwargs = {
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "do_sample": False,
        "output_logits": True,
        "return_dict_in_generate": True,
    }
    out, ref = generate_wholly_on_qnn(model, prompt, 32, {**NPU_STRICT, "verify": False}, **kwargs)
    assert torch.equal(out.sequences, ref.sequences), (out.sequences.tolist(), ref.sequences.tolist())
    for got, want in zip(out.logits, ref.logits, strict=True):
        assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.999
