"""qnnx_backend.hf.save_for_generation / load_for_generation: a tiny Llama's prefill buckets and decode step saved in
one file; a fresh process that never constructs a module, compiles no Dynamo frame and imports no transformers
model code generates the same greedy tokens as eager and as the compiling process; bad inputs and options are named
with what is accepted and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend.errors import InvalidOptionsError, SavedGraphError, SavedInputError
from qnnx_backend.hf import prompt_bucket

pytest.importorskip("transformers")
npu = pytest.mark.skipif(not qnnx_backend.is_available("npu"), reason="QNN HTP is not usable here")

OPTIONS = {"device": "npu", "soc_model": 60, "strict": True}
CACHE = 48
BUCKETS = [8, 16]
PROMPTS = (6, 11)  # padded to 8 and to 16 tokens
NEW_TOKENS = 12

# The loading process builds no module (nn.Module.__init__ raises), and reports its Dynamo frames, the transformers
# model code it imported, and its load and first-token times.
_CHILD = textwrap.dedent(
    """
    import json, sys, time
    start = time.perf_counter()
    import torch, torch._dynamo.utils

    def refuse(self, *args, **kwargs):
        raise AssertionError("the loading process must not construct a module")

    torch.nn.Module.__init__ = refuse
    import qnnx_backend.hf
    prompts, new = json.loads(sys.argv[2])
    imported = time.perf_counter()
    generator = qnnx_backend.hf.load_for_generation(sys.argv[1])
    loaded = time.perf_counter()
    first = generator.generate(torch.tensor([prompts[0]]), max_new_tokens=1)
    first_token = time.perf_counter()
    tokens = [generator.generate(torch.tensor([p]), max_new_tokens=new)[0].tolist() for p in prompts]
    print(json.dumps({
        "tokens": tokens,
        "first": first[0].tolist(),
        "caches": [r.cache for r in generator.reports],
        "dynamo_frames": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "transformers_models": sorted(m for m in sys.modules if m.startswith("transformers.models")),
        "import_s": imported - start,
        "load_s": loaded - imported,
        "first_token_s": first_token - loaded,
    }))
    """
)


def _llama(layers: int = 2) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa", pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _prompt(length: int) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(length))


def _in_child(path: Path, prompts: list[list[int]], new: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), json.dumps([prompts, new])],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QNNX_CACHE": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, float]:
    from qnnx_backend.hf import save_for_generation

    path = tmp_path_factory.mktemp("gen") / "llama.qnnx"
    start = time.perf_counter()
    report = save_for_generation(_llama(), path, max_cache_len=CACHE, prompt_buckets=BUCKETS, options=OPTIONS)
    return path, report, time.perf_counter() - start


@npu
def test_a_saved_llama_generates_in_a_process_that_never_builds_it(saved: tuple[Path, Any, float]) -> None:
    """Prompts of 6 and 11 tokens (prefill buckets 8 and 16): the child's greedy tokens equal eager generate()'s and
    those of the compiling process (compile_for_generation), with no module built, no Dynamo frame compiled and no
    transformers model code imported; every graph loads straight from its saved context."""
    from qnnx_backend.hf import compile_for_generation

    path, report, save_s = saved
    assert report.prompt_buckets == tuple(BUCKETS) and report.max_cache_len == CACHE
    assert len(report.reports) == 3 and all(r.on_qnn for r in report.reports), [r.summary() for r in report.reports]
    model = _llama()
    prompts = [_prompt(n) for n in PROMPTS]
    with torch.no_grad():
        eager = [model.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False) for p in prompts]
        compile_for_generation(model, max_cache_len=CACHE, options=OPTIONS)
        compiled = [model.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False) for p in prompts]
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a, b)
    result = _in_child(path, [p[0].tolist() for p in prompts], NEW_TOKENS)
    assert result["dynamo_frames"] == 0 and result["transformers_models"] == []
    assert result["caches"] == ["aot", "aot", "aot"]
    assert result["tokens"] == [e[0].tolist() for e in eager]
    assert result["first"] == eager[0][0, : PROMPTS[0] + 1].tolist()
    print(
        f"file {report.file_bytes} bytes; save (cold compile of 3 graphs) {save_s:.1f} s; child import "
        f"{result['import_s']:.2f} s, load {result['load_s']:.2f} s, first token {result['first_token_s']:.3f} s"
    )


@npu
def test_a_left_padded_prompt_and_an_end_token_generate_as_hugging_face_does(saved: tuple[Path, Any, float]) -> None:
    """A prompt given with padding on the left and its mask generates the unpadded prompt's tokens after the
    padding; generation stops after an end-of-sequence token, which is kept, as generate() does."""
    from qnnx_backend.hf import load_for_generation

    path, _, _ = saved
    generator = load_for_generation(path)
    prompt = _prompt(PROMPTS[0])
    plain = generator.generate(prompt, max_new_tokens=NEW_TOKENS)
    padded = torch.cat([torch.zeros((1, 3), dtype=torch.long), prompt], dim=1)
    mask = torch.cat([torch.zeros((1, 3), dtype=torch.long), torch.ones_like(prompt)], dim=1)
    got = generator.generate(padded, max_new_tokens=NEW_TOKENS, attention_mask=mask)
    assert torch.equal(got[:, 3:], plain)
    model = _llama()
    with torch.no_grad():
        logits = model(prompt).logits[0, -1]
    generator._eos = frozenset({int(logits.argmax())})  # the first new token ends the sequence
    assert generator.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == [
        [*prompt[0].tolist(), int(logits.argmax())]
    ]


@npu
def test_each_bad_input_names_the_value_what_is_accepted_and_the_fix(saved: tuple[Path, Any, float]) -> None:
    """A prompt past the last bucket, too many new tokens for the cache, int32 ids, a batch of two, a bad mask, and
    each loader given the other's file: each refused, naming the value, what the file takes and what to do."""
    from qnnx_backend.hf import load_for_generation

    path, _, _ = saved
    generator = load_for_generation(path)
    with pytest.raises(
        SavedInputError, match=r"prompt has 20 tokens; this file serves prompts of up to 16.*include 20"
    ):
        generator.generate(_prompt(20), max_new_tokens=2)
    with pytest.raises(SavedInputError, match=r"max_new_tokens=40 .*padded to 16.*at most 33 new tokens"):
        generator.generate(_prompt(11), max_new_tokens=40)
    with pytest.raises(SavedInputError, match=r"input_ids is int32\[1, 6\]; accepted: an int64 .*\.long\(\)"):
        generator.generate(_prompt(6).int(), max_new_tokens=2)
    with pytest.raises(SavedInputError, match=r"input_ids has shape \[2, 6\].*once per prompt"):
        generator.generate(torch.cat([_prompt(6)] * 2), max_new_tokens=2)
    with pytest.raises(SavedInputError, match=r"attention_mask is float32\[1, 6\]; accepted: None, or an integer"):
        generator.generate(_prompt(6), max_new_tokens=2, attention_mask=torch.ones(1, 6))
    with pytest.raises(SavedInputError, match=r"input_ids holds ids from .* to 200; accepted: .* from 0 to 127"):
        generator.generate(torch.tensor([[5, 200]]), max_new_tokens=2)
    with pytest.raises(SavedGraphError, match=r"generation file .*load it with qnnx_backend\.hf\.load_for_generation"):
        qnnx_backend.load(path)


@npu
def test_a_file_of_qnnx_backend_save_is_named_by_the_generation_loader(tmp_path: Path) -> None:
    """load_for_generation on a file of qnnx_backend.save says which loader reads it."""
    from qnnx_backend.hf import load_for_generation

    qnnx_backend.save(torch.nn.Linear(4, 4).eval(), torch.randn(1, 4), tmp_path / "m.qnnx", options=OPTIONS)
    with pytest.raises(SavedGraphError, match=r"file of qnnx_backend\.save: load it with qnnx_backend\.load"):
        load_for_generation(tmp_path / "m.qnnx")


def test_bad_save_options_are_refused_before_any_compile(tmp_path: Path) -> None:
    """A module that is not a causal LM, a cache of one token, buckets past the cache: refused naming the value."""
    from qnnx_backend.hf import save_for_generation

    with pytest.raises(InvalidOptionsError, match="AutoModelForCausalLM"):
        save_for_generation(torch.nn.Linear(2, 2), tmp_path / "x.qnnx", max_cache_len=32)
    with pytest.raises(InvalidOptionsError, match=r"max_cache_len=1 is not valid; accepted: an int of at least 2"):
        save_for_generation(_llama(), tmp_path / "x.qnnx", max_cache_len=1)
    with pytest.raises(InvalidOptionsError, match=r"prompt_buckets=\[8, 64\] .*lengths from 1 to 32"):
        save_for_generation(_llama(), tmp_path / "x.qnnx", max_cache_len=32, prompt_buckets=[8, 64])
    with pytest.raises(InvalidOptionsError, match=r"prompt_buckets='auto' .*max_cache_len=8"):
        save_for_generation(_llama(), tmp_path / "x.qnnx", max_cache_len=8)
    assert not list(tmp_path.iterdir())


@given(
    length=st.integers(-2, 80),
    new=st.integers(0, 80),
    buckets=st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True),
    cache=st.integers(2, 96),
)
def test_the_prompt_bucket_is_the_smallest_that_holds_the_prompt_and_fits_the_cache(
    length: int, new: int, buckets: list[int], cache: int
) -> None:
    """For any prompt length, token count, buckets and cache size: the bucket chosen is the smallest saved length
    that holds the prompt, and it and the fed-back tokens fit the cache; otherwise SavedInputError names the
    value that does not fit and how to fix it."""
    fitting = [b for b in buckets if b >= length]
    expected = min(fitting) if fitting and length >= 1 and new >= 1 else None
    if expected is not None and expected + new - 1 > cache:
        expected = None
    if expected is None:
        with pytest.raises(SavedInputError) as error:
            prompt_bucket(length, new, buckets, cache)
        message = str(error.value)
        assert "accepted" in message or "save_for_generation" in message
        assert str(new) in message or str(length) in message or "empty" in message
    else:
        assert prompt_bucket(length, new, buckets, cache) == expected


@npu
def test_graphs_run_as_parts_are_saved_and_generate_eager_tokens(tmp_path: Path) -> None:
    """Under a max_graph_bytes below two layers' weights every graph runs as parts (one context each); the file
    keeps them and a fresh process generates eager's tokens from it."""
    from qnnx_backend.hf import save_for_generation

    model = _llama(layers=4)
    layer_bytes = sum(p.numel() for p in model.model.layers[0].parameters()) * 2  # float16 on the NPU
    options = {**OPTIONS, "max_graph_bytes": layer_bytes + 1024}
    report = save_for_generation(model, tmp_path / "p.qnnx", max_cache_len=24, prompt_buckets=[8], options=options)
    assert all(len(r.parts) >= 4 for r in report.reports), [r.summary() for r in report.reports]
    prompt = _prompt(PROMPTS[0])
    with torch.no_grad():
        eager = model.generate(prompt, max_new_tokens=6, do_sample=False)
    result = _in_child(tmp_path / "p.qnnx", [prompt[0].tolist()], 6)
    assert result["tokens"] == [eager[0].tolist()] and result["dynamo_frames"] == 0
