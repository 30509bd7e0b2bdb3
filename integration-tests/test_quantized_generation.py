"""Quantized generation: ``calibrate()`` around ``generate()`` calibrates every graph of
``compile_for_generation`` (prefill buckets and the decode step) from generation's own tensors, and later
``generate()`` runs them as QDQ graphs on the QNN HTP simulator."""

from __future__ import annotations

import pytest
import torch

import qnnx_backend

transformers = pytest.importorskip("transformers")

EOS = 2
CACHE = 48
OPTIONS = {"soc_model": 60, "strict": True}


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def _teacher_forced(model: torch.nn.Module, eager_forward, prompt: torch.Tensor, new: int):
    """(QNN's logits per step, eager's logits for the same steps on the sequence QNN generated)."""
    out = model.generate(
        prompt,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    reference = eager_forward(input_ids=out.sequences).logits[0, prompt.shape[1] - 1 : -1]
    return torch.stack([step[0] for step in out.logits]).double(), reference.double(), out.sequences


# Measured here (a16w8, this random-init model, 4 calibration prompts, 16 of their 28 decode steps kept): SQNR
# 40.2 dB (prefill) and 41.6 dB (decode) on the calibration samples, max |err| 0.0036 for logits of scale 0.33; on
# held-out prompts each step's logits keep cosine 0.9915-1.0 against eager (values beyond the calibrated ranges
# clip; with 8 decode samples the worst step fell to 0.972). Random weights give near-flat logits, so a step's
# token may differ from eager's argmax only where eager's own top logits are closer than the error: the pick is
# judged against a margin of 5% of the logits' scale, the logits by cosine. tests on trained weights hold the
# tokens themselves (test_quantized_llm.py).
PICK_MARGIN = 5e-2
MIN_COSINE = 0.99


def test_calibrating_generate_quantizes_every_generation_graph_on_qnn() -> None:
    """calibrate(model) around generate() over four prompts records the prefill bucket and the decode step (the
    decode's many calls sampled down to max_samples), gives eager's tokens meanwhile (the static cache is written as
    in eager), and on exit compiles both graphs quantized wholly on QNN; later generate() agrees with float eager
    by teacher forcing."""
    from qnnx_backend.hf import compile_for_generation

    model = _llama()
    eager_forward = model.forward
    prompts = [_prompt(n, seed=n) for n in (3, 5, 9, 12)]
    with torch.no_grad():
        eager_tokens = [model.generate(p, max_new_tokens=8, do_sample=False) for p in prompts]
    compile_for_generation(model, max_cache_len=CACHE, options={**OPTIONS, "quantize": "a16w8"})
    with torch.no_grad():
        with qnnx_backend.calibrate(model, max_samples=16):
            during = [model.generate(p, max_new_tokens=8, do_sample=False) for p in prompts]
        assert all(torch.equal(a, b) for a, b in zip(during, eager_tokens))
        reports = qnnx_backend.compile_reports()
        assert len(reports) == 2, [r.summary() for r in reports]
        for report in reports:
            quant = report.quantization
            assert report.device == "npu" and set(report.placement) == {"QNNExecutionProvider"}, report.summary()
            assert quant is not None and quant.used and quant.sqnr_db is not None and quant.sqnr_db > 30, quant
        by_length = {r.input_shapes[0][1]: r.quantization.samples for r in reports}  # type: ignore[union-attr]
        assert by_length == {16: 4, 1: 16}  # 4 prompts in the 16-token bucket; 28 decode steps sampled to 16
        for n in (4, 7, 11):
            got, ref, sequence = _teacher_forced(model, eager_forward, _prompt(n, seed=100 + n), new=10)
            for step, (g, r) in enumerate(zip(got, ref)):
                token = int(sequence[0, n + step])
                candidates = r.clone()
                candidates[EOS] = -torch.inf  # min_new_tokens keeps generate() from the end token
                scale = float(r.abs().max())
                assert float(candidates.max() - r[token]) <= PICK_MARGIN * scale, f"prompt {n} step {step}"
                assert float(torch.nn.functional.cosine_similarity(g, r, dim=0)) >= MIN_COSINE, f"prompt {n} {step}"
    assert len(qnnx_backend.compile_reports()) == 2  # no graph compiled again after calibration


def test_calibrate_names_what_it_takes() -> None:
    """calibrate() refuses a module whose forward is not compiled (naming compile_for_generation) and a
    max_samples that is not a positive int."""
    from qnnx_backend.errors import InvalidOptionsError

    with pytest.raises(TypeError, match="compile_for_generation"), qnnx_backend.calibrate(_llama()):
        pass
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="qnn", options={"soc_model": 60, "quantize": "a16w8"})
    for bad in (0, -1, 2.5, True, "8"):
        with (
            pytest.raises(InvalidOptionsError, match=r"max_samples=.*accepted: a positive int"),
            qnnx_backend.calibrate(compiled, max_samples=bad),  # type: ignore[arg-type]
        ):
            pass
