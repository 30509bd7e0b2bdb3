"""Hugging Face generation with a static KV cache runs on the NPU: prefill and decode graphs on QNN, tokens that
agree with eager PyTorch step by step (judged by teacher forcing, since exact equality is not a fair test in fp16)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from integration_helpers import generate_wholly_on_qnn
from integration_models import TINY_DECODER as _TINY

import qnnx_backend

pytest.importorskip("transformers")

NEW_TOKENS = 32

EOS = 2  # the models' eos_token_id


def _model(kind: str, attention: str, layers: int = 2) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = {**_TINY, "num_hidden_layers": layers, "attn_implementation": attention}
    config = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "phi3": transformers.Phi3Config,
    }[kind](**common)
    causal_lm = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "phi3": transformers.Phi3ForCausalLM,
    }[kind]
    return causal_lm(config).eval()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "phi3"])
def test_static_cache_generation_runs_on_qnn_and_agrees_with_eager(kind: str, attention: str) -> None:
    """generate(cache_implementation="static") with a compiled forward: two QNN graphs (prefill, decode), no
    recompile after the first decode step, and every step's token and logits agree with eager by teacher forcing."""
    model = _model(kind, attention)
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    eager_forward = model.forward
    model.forward = torch.compile(
        model.forward, backend="qnn", fullgraph=True, dynamic=False, options={"soc_model": 60}
    )
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            cache_implementation="static",
            output_logits=True,
            return_dict_in_generate=True,
        )
        model.forward = eager_forward
        sequence = out.sequences
        reference = model(sequence).logits[0]  # teacher forcing: eager on the sequence qnnx generated
    reports = qnnx_backend.compile_reports()
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    _assert_agrees_by_teacher_forcing(out, reference, prompt.shape[1])


@pytest.mark.parametrize("family", ["llama-eager", "gemma2"])
def test_eager_attention_with_a_padded_prompt_runs_wholly_on_qnn(family: str) -> None:
    """Eager attention (Gemma-2's default; Llama with attn_implementation="eager") on a prompt padded on the left to
    its bucket: the padding queries see only masked keys. Their rows came back as a softmax of fp16 rounding noise
    on QNN, so the cached keys and values of the padding differed and the first-call check sent the prefill to
    PyTorch; with the softmax input floored both graphs run on QNN (strict) with eager's tokens."""
    model = _model("llama", "eager") if family == "llama-eager" else _gemma2(sliding_window=4096)
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    options = {"soc_model": 60, "strict": True}
    out, ref = generate_wholly_on_qnn(
        model, prompt, 32, options, eager_cache="static", max_new_tokens=5, min_new_tokens=5, do_sample=False
    )
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())


def _assert_agrees_by_teacher_forcing(out: object, reference: torch.Tensor, start: int) -> None:
    """Each step's token is eager's pick (or within fp16 noise of it), and its logits match eager's (run on the
    sequence qnnx generated). ``min_new_tokens`` keeps generate() from picking the end-of-sequence token: it is
    no candidate here either."""
    sequence = out.sequences  # type: ignore[attr-defined]
    for step, logits in enumerate(out.logits):  # type: ignore[attr-defined]
        got = logits[0].double()
        ref = reference[start - 1 + step].double()
        token = int(sequence[0, start + step])
        scale = float(ref.abs().max())
        candidates = ref.clone()
        candidates[EOS] = -torch.inf
        assert float(candidates.max() - ref[token]) <= 1e-2 * scale, f"step {step}: token {token} is not eager's pick"
        assert float((got - ref).abs().max()) <= 5e-2 * scale, f"step {step}: logits off"
        assert float(torch.nn.functional.cosine_similarity(got, ref, dim=0)) >= 0.999, f"step {step}: cosine"


_CACHED_RUN = """
import sys, warnings, torch, transformers, qnnx_backend
warnings.filterwarnings("ignore")
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
model = transformers.LlamaForCausalLM(cfg).eval()
prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
options = {"soc_model": 60, "cache": True, "cache_dir": sys.argv[1]}
model.forward = torch.compile(model.forward, backend="qnn", fullgraph=True, dynamic=False, options=options)
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static")
print(" ".join(map(str, out[0].tolist())))
print(" ".join(r.cache for r in qnnx_backend.compile_reports()))
"""


def test_a_second_process_loads_prefill_and_decode_from_the_context_cache(tmp_path: Path) -> None:
    """With cache=True a new process loads both generation graphs' contexts (no export) and generates the same tokens."""
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", _CACHED_RUN, str(tmp_path)], capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(proc.stdout.strip().splitlines()[-2:])
    (tokens_1, caches_1), (tokens_2, caches_2) = runs
    assert caches_1 == "miss miss" and caches_2 == "hit hit"
    assert tokens_1 == tokens_2


def test_compile_for_generation_helper() -> None:
    """qnnx_backend.hf.compile_for_generation: plain generate() then runs on QNN with a static cache of the given
    size, gives eager's greedy tokens, and a second prompt of another length reuses the same cache size."""
    from qnnx_backend.hf import compile_for_generation

    model = _model("llama", "sdpa")
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model.generate(prompt, max_new_tokens=8, do_sample=False)
    compile_for_generation(model, max_cache_len=48, options={"soc_model": 60})
    compile_for_generation(model, max_cache_len=48, options={"soc_model": 60})  # again: no nesting, no double padding
    with torch.no_grad():
        got = model.generate(prompt, max_new_tokens=8, do_sample=False)
        model.generate(prompt[:, :4], max_new_tokens=4, do_sample=False)
    assert torch.equal(got, eager)
    reports = qnnx_backend.compile_reports()
    assert reports and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert len(reports) == 2  # prompts of 6 and 4 tokens share the 16-token prefill graph; one decode graph


def test_prompts_of_many_lengths_share_a_few_prefill_graphs() -> None:
    """Prompts of 3 to 20 tokens compile one prefill graph per bucket (16 and 32 tokens; 16 tokens take the 32 one,
    as at least one token is padding) plus one decode graph, all
    on QNN, and every prompt's generation agrees with eager by teacher forcing; the padding never shows in the
    returned sequence."""
    from qnnx_backend.hf import compile_for_generation

    model = _model("qwen2", "sdpa")
    compile_for_generation(model, max_cache_len=64, options={"soc_model": 60})
    eager_forward = model._qnnx_eager_forward
    for length in (3, 7, 11, 16, 20):
        prompt = torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            out = model.generate(
                prompt,
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            assert torch.equal(out.sequences[:, :length], prompt)
            assert out.sequences.shape == (1, length + 12)
            reference = eager_forward(input_ids=out.sequences).logits[0]
        _assert_agrees_by_teacher_forcing(out, reference, length)
    reports = qnnx_backend.compile_reports()
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert sorted(r.input_shapes[0][1] for r in reports) == [1, 16, 32], [r.input_shapes[0] for r in reports]


def test_compile_for_generation_refuses_what_is_not_a_generation_model() -> None:
    """A plain module or a bad max_cache_len is refused with the fix."""
    from qnnx_backend.errors import InvalidOptionsError
    from qnnx_backend.hf import compile_for_generation

    with pytest.raises(InvalidOptionsError, match="AutoModelForCausalLM"):
        compile_for_generation(torch.nn.Linear(2, 2))
    with pytest.raises(InvalidOptionsError, match="max_cache_len"):
        compile_for_generation(_model("llama", "eager"), max_cache_len=0)


def test_an_eight_layer_decoder_compiles_its_decode_graph_in_seconds() -> None:
    """Compile steps stay linear in depth: an 8-layer tiny Llama's prefill and decode graphs compile on QNN and
    give eager's tokens. A guard far above the expected time (about 5 s per graph here), not a benchmark: a walk
    that grows with the number of paths took minutes at 4 layers (tools/bench/depth.py measures the scaling)."""
    from qnnx_backend.hf import compile_for_generation

    model = _model("llama", "sdpa", layers=8)
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model.generate(prompt, max_new_tokens=3, do_sample=False)
    compile_for_generation(model, max_cache_len=32, options={"soc_model": 60})
    with torch.no_grad():
        got = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, eager)
    reports = qnnx_backend.compile_reports()
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    for report in reports:
        ours = report.timings.get("analyze", 0.0) + report.timings.get("export", 0.0)
        assert ours < 120, f"export of an 8-layer graph took {ours:.0f} s: {report.summary()}"


def _gemma2(sliding_window: int) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma2Config(**_TINY, head_dim=8, sliding_window=sliding_window)
    return transformers.Gemma2ForCausalLM(config).eval()


def _generate_against_eager(model: torch.nn.Module, new_tokens: int, max_cache_len: int) -> list[Any]:
    from qnnx_backend.hf import compile_for_generation

    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    compile_for_generation(model, max_cache_len=max_cache_len, options={"soc_model": 60}, prompt_buckets=None)
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        reference = model._qnnx_eager_forward(out.sequences).logits[0]
    _assert_agrees_by_teacher_forcing(out, reference, prompt.shape[1])
    return qnnx_backend.compile_reports()


def test_a_sliding_window_longer_than_the_cache_compiles_one_decode_graph() -> None:
    """Gemma-2 (sliding-window layers) with a window longer than the cache: the window can never slide, so its
    cache layers hold full static ones; prefill and one decode graph serve every step (before, each step compiled a
    graph of its own), all on QNN, agreeing with eager by teacher forcing."""
    reports = _generate_against_eager(_gemma2(sliding_window=4096), new_tokens=8, max_cache_len=32)
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]


def test_a_sliding_window_that_slides_keeps_its_semantics(caplog: pytest.LogCaptureFixture) -> None:
    """A window shorter than the cache really slides: its layers stay sliding (each step then compiles a graph, said
    in a warning), every graph runs on QNN (the steps that roll a full window too: a roll moves cached values
    without arithmetic, so it is lifted), and the tokens agree with eager, whose window drops the old positions."""
    with caplog.at_level("WARNING", logger="qnnx_backend"):
        reports = _generate_against_eager(_gemma2(sliding_window=4), new_tokens=3, max_cache_len=32)
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert any("sliding window (4 tokens) fits in the cache" in r.getMessage() for r in caplog.records)


def _long_llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**_TINY, "max_position_embeddings": 4096}, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).eval()


@settings(max_examples=20, deadline=None)
@given(positions=st.lists(st.integers(0, 299), min_size=1, max_size=12), batch=st.integers(1, 3))
def test_rotary_table_equals_the_rotary_module_at_any_positions(positions: list[int], batch: int) -> None:
    """Once compile_for_generation has tabulated a rotary embedding, its output at any positions the cache can
    hold (any order, repeats, batches) equals what the module computes, bit for bit."""
    from qnnx_backend._hf_rope import RotaryTables

    model = _long_llama()
    rope = model.model.rotary_emb
    original = rope.forward
    RotaryTables(model).cover(None, None, 300)
    ids = torch.tensor([positions] * batch)
    x = torch.zeros(1, 1, 1)
    with torch.no_grad():
        (cos, sin), (cos_ref, sin_ref) = rope(x, ids), original(x, ids)
    assert rope.forward != original
    assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)


def test_rotary_embedding_stays_exact_at_long_positions_on_qnn() -> None:
    """After compile_for_generation, a decoder's rotary cos/sin at positions up to 3000 come out of the NPU within
    float16 rounding of eager (computed from the positions on HTP they were off by 0.14 at position 1000 and 0.22
    at 3000, which the first call at short positions never shows)."""
    from qnnx_backend.hf import compile_for_generation

    strict = {"device": "npu", "strict": True, "soc_model": 60}
    model = _long_llama()
    rope = model.model.rotary_emb
    original = rope.forward
    compile_for_generation(model, max_cache_len=3008, options=strict)
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=1, do_sample=False)
        compiled = torch.compile(lambda x, p: rope(x, p), backend="qnn", options=strict)
        x = torch.zeros(1, 1, 32)
        for position in (5, 1000, 3000):
            p = torch.tensor([[position, position - 1]])
            (cos, sin), (cos_ref, sin_ref) = compiled(x, p), original(x, p)
            assert (cos - cos_ref).abs().max() <= 1e-3 and (sin - sin_ref).abs().max() <= 1e-3, position


def test_a_rotary_embedding_compiled_by_hand_is_exact_at_long_positions() -> None:
    """Without compile_for_generation (a decoder compiled as it is, its positions a runtime input), the rotary
    cos/sin of positions up to 100000 come out of the NPU within 1e-3 of eager: the angle is read from exact tables
    (it was 0.14 off at position 1000 when HTP computed it in float16)."""
    rope = _long_llama().model.rotary_emb
    compiled = torch.compile(
        lambda x, p: rope(x, p), backend="qnn", options={"device": "npu", "strict": True, "soc_model": 60}
    )
    x = torch.zeros(1, 1, 32)
    with torch.no_grad():
        for position in (5, 1000, 3000, 100000):
            p = torch.tensor([[position, position - 1]])
            (cos, sin), (cos_ref, sin_ref) = compiled(x, p), rope(x, p)
            assert (cos - cos_ref).abs().max() <= 1e-3 and (sin - sin_ref).abs().max() <= 1e-3, position


def test_bloom_generation_runs_on_qnn_and_agrees_with_eager() -> None:
    """BLOOM (ALiBi added to the scores by baddbmm, the padding mask read with runtime index tensors): the prefill
    and decode graphs run on QNN with the cache writes lifted, and every step agrees with eager by teacher forcing."""
    import transformers

    config = transformers.BloomConfig(
        vocab_size=128, hidden_size=32, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    reports = _generate_against_eager(transformers.BloomForCausalLM(config).eval(), new_tokens=8, max_cache_len=32)
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]


def test_llama4_generation_runs_on_qnn_and_agrees_with_eager() -> None:
    """Llama 4 text (rope by complex arithmetic, carried as real pairs; dense layers): the prefill and decode graphs
    run on QNN and every step agrees with eager by teacher forcing."""
    import transformers

    config = transformers.Llama4TextConfig(
        **_TINY, intermediate_size_mlp=64, head_dim=8, moe_layers=[], attn_implementation="eager"
    )
    torch.manual_seed(0)
    reports = _generate_against_eager(transformers.Llama4ForCausalLM(config).eval(), new_tokens=8, max_cache_len=32)
    assert len(reports) == 2 and all(r.on_qnn for r in reports), [r.summary() for r in reports]
