"""Encoder-decoder generation on QNN: tiny Whisper (speech to text), BART and T5 through ``compile_for_generation``.

Each model is random-init with weights scaled up from the default init, so that greedy decoding picks varied tokens
rather than repeating one: then equal tokens say something. The criteria are the decoder tests' teacher forcing:
the same tokens as eager, and every step's logits within fp16 tolerance (cosine >= 0.999) of eager's on the same
prefix.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import qnnx_backend


def _model(kind: str) -> tuple[Any, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    common = {"vocab_size": 128, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
    layers = {"encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2}
    ffn = {"encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_model": 32, "init_std": 0.3}
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(3))
    if kind == "whisper":
        cfg = transformers.WhisperConfig(
            **common, **layers, **ffn, num_mel_bins=16, max_source_positions=16, max_target_positions=32
        )
        model = transformers.WhisperForConditionalGeneration(cfg).eval()
        # No suppressed tokens: the random vocabulary has no special ones to keep out.
        model.generation_config.suppress_tokens = None
        model.generation_config.begin_suppress_tokens = None
        return model, {"input_features": torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(1))}
    if kind == "bart":
        cfg = transformers.BartConfig(**common, **layers, **ffn, max_position_embeddings=64)
        return transformers.BartForConditionalGeneration(cfg).eval(), {"input_ids": ids}
    cfg = transformers.T5Config(
        **common, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, initializer_factor=3.0
    )
    return transformers.T5ForConditionalGeneration(cfg).eval(), {"input_ids": ids}


@pytest.mark.parametrize("kind", ["whisper", "bart", "t5"])
def test_encoder_decoder_generates_eagers_tokens_on_qnn(kind: str) -> None:
    """Encoder, prefill and decode run on QNN (Whisper and BART wholly; T5's decode step keeps its relative-position
    bucket arithmetic, a float computation cast to an integer, on the ORT CPU EP in the same session), with eager's
    tokens and logits within fp16 tolerance at every step."""
    from qnnx_backend.hf import compile_for_generation

    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model, inputs = _model(kind)
    gen = {"max_new_tokens": 6, "do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = model.generate(**inputs, **gen)
        compile_for_generation(model, max_cache_len=16, options={"soc_model": 60})
        got = model.generate(**inputs, **gen)
    assert len(set(eager.sequences[0, 1:].tolist())) >= 3, "degenerate reference: the tokens say nothing"
    assert torch.equal(got.sequences, eager.sequences)
    for step, (want, have) in enumerate(zip(eager.logits, got.logits, strict=True)):
        cos = torch.nn.functional.cosine_similarity(want.flatten(), have.flatten(), dim=0).item()
        assert cos >= 0.999, f"step {step}: logits cosine {cos:.6f}"
    reports = qnnx_backend.compile_reports()
    assert len(reports) >= 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    if kind != "t5":
        assert not any(r.cpu_nodes for r in reports), [r.summary() for r in reports]
