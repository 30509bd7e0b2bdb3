"""qnnx_backend.save / load on plain modules and tiny Hugging Face models: a fresh process that never constructs the
model loads the file and returns the saving process's outputs, bit for bit; every load-time check names the value,
what is accepted and the fix; the torch-free loader gives the same numbers in a process where torch cannot import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from integration_models import tiny_hf

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError, SavedGraphError, SavedInputError

pytestmark = pytest.mark.skipif(not qnnx_backend.is_available("npu"), reason="QNN HTP is not usable here")

OPTIONS = {"device": "npu", "soc_model": 60, "strict": True}

# The loading process builds no module (nn.Module.__init__ raises) and compiles no Dynamo frame.
_TORCH_CHILD = textwrap.dedent(
    """
    import json, logging, sys
    import torch, torch.utils._pytree as pytree
    import torch._dynamo.utils

    def refuse(self, *args, **kwargs):
        raise AssertionError("the loading process must not construct a module")

    torch.nn.Module.__init__ = refuse
    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("qnnx_backend").addHandler(Collect(logging.WARNING))
    if "__VERSIONS__":
        import qnnx_backend._session as session
        real = session.runtime_versions
        session.runtime_versions = lambda: {**real(), "onnxruntime-qnn": "__VERSIONS__"}
    import qnnx_backend
    args, kwargs = torch.load(sys.argv[2])
    try:
        model = qnnx_backend.load(sys.argv[1])
    except qnnx_backend.errors.QnnDeviceError as exc:
        print(json.dumps({"error": str(exc)}))
        raise SystemExit(0)
    out = model(*args, **kwargs)
    torch.save(pytree.tree_leaves(out), sys.argv[3])
    print(json.dumps({
        "type": type(out).__name__,
        "caches": [r.cache for r in model.reports],
        "dynamo_frames": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "transformers_models": sorted(m for m in sys.modules if m.startswith("transformers.models.")),
        "warnings": warnings,
    }))
    """
)

# The loading process without torch: any import of it fails.
_ARRAYS_CHILD = textwrap.dedent(
    """
    import json, sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is hidden in this process ({name})")
            return None

    sys.meta_path.insert(0, NoTorch())
    import numpy as np
    import qnnx_backend
    feed = dict(np.load(sys.argv[2]))
    args = [feed.pop(f"args[{i}]") for i in range(sum(k.startswith("args[") for k in feed))]
    kwargs = {k.removeprefix("kwargs['").removesuffix("']"): v for k, v in feed.items()}
    model = qnnx_backend.load_arrays(sys.argv[1])
    out = model(*args, **kwargs)
    np.savez(sys.argv[3], **out)
    print(json.dumps({"outputs": list(out), "torch_loaded": any(m.split(".")[0] == "torch" for m in sys.modules)}))
    """
)


def _run(code: str, *argv: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QNNX_CACHE": "0", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _load_in_child(
    path: Path, args: tuple[Any, ...], kwargs: dict[str, Any], tmp_path: Path, versions: str = ""
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    torch.save((args, kwargs), tmp_path / "inputs.pt")
    code = _TORCH_CHILD.replace("__VERSIONS__", versions)
    result = _run(code, path, tmp_path / "inputs.pt", tmp_path / "out.pt")
    return result, torch.load(tmp_path / "out.pt") if "error" not in result else []


def _assert_identical(got: list[torch.Tensor], saved: Any) -> None:
    want = pytree.tree_leaves(saved)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), f"max |diff| {(a.double() - b.double()).abs().max().item()}"


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()


def _hf(kind: str) -> torch.nn.Module:
    """The tiny random Hugging Face model of the end-to-end corpus (its ``transformers`` class, not a wrapper)."""
    model: torch.nn.Module = tiny_hf(kind)[0].model
    return model


def _llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = transformers.LlamaConfig(
        vocab_size=128, num_key_value_heads=2, max_position_embeddings=128, attn_implementation="eager", **sizes
    )
    return transformers.LlamaForCausalLM(config).eval()


def _ids(n: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def _bert_inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 12:] = 0  # padding: the mask reaches the graph
    return (ids,), {"attention_mask": mask}


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, qnnx_backend.SaveReport]:
    path = tmp_path_factory.mktemp("bert") / "bert.qnnx"
    args, kwargs = _bert_inputs()
    return path, qnnx_backend.save(_hf("bert"), args, path, example_kwargs=kwargs, options=OPTIONS)


def test_a_plain_module_loads_in_a_process_that_never_builds_it(tmp_path: Path) -> None:
    """A saved MLP runs in a fresh process from its compiled context alone: no module, no Dynamo frame, the saving
    process's outputs bit for bit (and eager's to fp16 precision)."""
    model, x = _mlp(), torch.randn(2, 8)
    report = qnnx_backend.save(model, x, tmp_path / "mlp.qnnx", options=OPTIONS)
    with torch.no_grad():
        torch.testing.assert_close(report.outputs, model(x), rtol=2e-2, atol=2e-3)
    result, out = _load_in_child(tmp_path / "mlp.qnnx", (x,), {}, tmp_path)
    assert result["caches"] == ["aot"] and result["dynamo_frames"] == 0 and not result["warnings"]
    assert result["type"] == "Tensor"
    _assert_identical(out, report.outputs)


def test_bert_loads_without_its_module_and_returns_its_output_class(
    saved_bert: tuple[Path, qnnx_backend.SaveReport], tmp_path: Path
) -> None:
    """A tiny BertModel with a padding mask: the child gets a BaseModelOutputWithPoolingAndCrossAttentions whose
    tensors equal the saving process's, without constructing a module or compiling a Dynamo frame."""
    path, report = saved_bert
    args, kwargs = _bert_inputs()
    result, out = _load_in_child(path, args, kwargs, tmp_path)
    assert result["type"] == type(report.outputs).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert result["caches"] == ["aot"] and result["dynamo_frames"] == 0
    assert not any("modeling_bert" in m for m in result["transformers_models"])  # the model code is not needed
    _assert_identical(out, report.outputs)


@pytest.mark.parametrize("kind", ["vit", "llama-prefill"])
def test_hugging_face_models_load_in_a_fresh_process_with_identical_outputs(kind: str, tmp_path: Path) -> None:
    """ViT, and a decoder's prefill (logits of a prompt, use_cache=False): saved, loaded in a child that builds no
    module, the same outputs bit for bit."""
    if kind == "vit":
        model, args, kwargs = _hf("vit"), (torch.randn(1, 3, 32, 32),), {}
    else:
        model, args, kwargs = _llama(), (_ids(8),), {"use_cache": False}
    report = qnnx_backend.save(model, args, tmp_path / "m.qnnx", example_kwargs=kwargs, options=OPTIONS)
    result, out = _load_in_child(tmp_path / "m.qnnx", args, kwargs, tmp_path)
    assert result["caches"] == ["aot"] and result["dynamo_frames"] == 0
    assert result["type"] == type(report.outputs).__name__
    _assert_identical(out, report.outputs)


def test_each_load_time_input_check_names_the_value_what_is_accepted_and_the_fix(
    saved_bert: tuple[Path, qnnx_backend.SaveReport],
) -> None:
    """Another shape, another dtype, a missing keyword input, a changed constant: each refused, naming the input,
    what it got, what the file was saved with, and what to do."""
    path, _ = saved_bert
    model = qnnx_backend.load(path)
    (ids,), kwargs = _bert_inputs()
    with pytest.raises(SavedInputError, match=r"args\[0\] is int64\[1, 8\], saved as int64\[1, 16\].*save the model"):
        model(ids[:, :8], attention_mask=kwargs["attention_mask"])
    with pytest.raises(SavedInputError, match=r"kwargs\['attention_mask'\] is float32\[1, 16\], saved as int64"):
        model(ids, attention_mask=kwargs["attention_mask"].float())
    with pytest.raises(SavedInputError, match=r"takes \(args\[0\]: int64\[1, 16\], kwargs\['attention_mask'\]"):
        model(ids)
    with pytest.raises(SavedInputError, match=r"args\[0\] is 7, saved as a tensor int64\[1, 16\]"):
        model(7, attention_mask=kwargs["attention_mask"])


def test_a_constant_input_is_fixed_to_its_saved_value(tmp_path: Path) -> None:
    """A non-tensor input is specialized at save (as Dynamo does): the same value runs, another is refused."""

    def scaled(x: torch.Tensor, *, scale: float) -> torch.Tensor:
        return torch.tanh(x * scale)

    x = torch.randn(4, 8)
    report = qnnx_backend.save(scaled, x, tmp_path / "s.qnnx", example_kwargs={"scale": 2.0}, options=OPTIONS)
    model = qnnx_backend.load(tmp_path / "s.qnnx")
    assert torch.equal(model(x, scale=2.0), report.outputs)
    with pytest.raises(SavedInputError, match=r"kwargs\['scale'\] is 3.0, saved as the constant 2.0"):
        model(x, scale=3.0)


def test_another_runtime_version_rebuilds_or_raises_under_strict(tmp_path: Path) -> None:
    """A file saved for another onnxruntime-qnn: rebuilt from its saved ONNX model with one warning naming the
    versions; saved with strict=True, loading raises naming the version and the fix."""
    model, x = _mlp(), torch.randn(2, 8)
    qnnx_backend.save(model, x, tmp_path / "strict.qnnx", options=OPTIONS)
    report = qnnx_backend.save(model, x, tmp_path / "loose.qnnx", options={**OPTIONS, "strict": False})
    result, out = _load_in_child(tmp_path / "loose.qnnx", (x,), {}, tmp_path, versions="9.9.9")
    assert result["caches"] == ["aot-rebuilt"]
    assert len(result["warnings"]) == 1 and "onnxruntime-qnn" in result["warnings"][0]
    torch.testing.assert_close(out[0], report.outputs, rtol=2e-2, atol=2e-3)
    result, _ = _load_in_child(tmp_path / "strict.qnnx", (x,), {}, tmp_path, versions="9.9.9")
    assert "onnxruntime-qnn" in result["error"] and "9.9.9" in result["error"] and "strict=False" in result["error"]


def test_what_a_saved_file_cannot_hold_is_refused_at_save(tmp_path: Path) -> None:
    """An input that is neither a tensor nor a plain constant, or a model that does not trace as one graph, is
    refused with SavedGraphError before anything is written."""

    def takes_object(x: torch.Tensor, box: object) -> torch.Tensor:
        return x + 1

    with pytest.raises(SavedGraphError, match=r"input args\[1\] is a object; a saved file takes tensors"):
        qnnx_backend.save(takes_object, (torch.randn(2), object()), tmp_path / "o.qnnx", options=OPTIONS)

    def breaks(x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        torch._dynamo.graph_break()
        return y * 2

    with pytest.raises(SavedGraphError, match="does not trace as one graph"):
        qnnx_backend.save(breaks, torch.randn(4), tmp_path / "b.qnnx", options=OPTIONS)
    assert not list(tmp_path.iterdir())


def test_a_file_of_torch_save_compiled_function_is_named_as_such(tmp_path: Path) -> None:
    """load() on a file of aot_compile's save_compiled_function says which loader reads it."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    x = torch.randn(4, 4)  # alive while saving: the never-called graph is compiled from it
    with torch.no_grad():
        fn = torch.compile(f, backend="qnn", fullgraph=True, options=OPTIONS).aot_compile(((x,), {}))
        fn.save_compiled_function(str(tmp_path / "f.pt2"))
    with pytest.raises(SavedGraphError, match=r"torch\.compiler\.load_compiled_function"):
        qnnx_backend.load(tmp_path / "f.pt2")


@pytest.mark.parametrize("kind", ["vit", "bert"])
def test_a_saved_file_runs_without_torch_with_the_same_numbers(
    kind: str, saved_bert: tuple[Path, qnnx_backend.SaveReport], tmp_path: Path
) -> None:
    """load_arrays in a process where importing torch fails: numpy arrays in, the torch path's outputs out, bit
    for bit, keyed by output name."""
    if kind == "bert":
        path, report = saved_bert
        (ids,), kwargs = _bert_inputs()
        feed = {"args[0]": ids.numpy(), "kwargs['attention_mask']": kwargs["attention_mask"].numpy()}
    else:
        image = torch.randn(1, 3, 32, 32)
        path = tmp_path / "vit.qnnx"
        report = qnnx_backend.save(_hf("vit"), image, path, options=OPTIONS)
        feed = {"args[0]": image.numpy()}
    np.savez(tmp_path / "feed.npz", **feed)
    result = _run(_ARRAYS_CHILD, path, tmp_path / "feed.npz", tmp_path / "out.npz")
    assert not result["torch_loaded"]
    assert result["outputs"] == ["last_hidden_state", "pooler_output"]
    got = np.load(tmp_path / "out.npz")
    for name in result["outputs"]:
        want = getattr(report.outputs, name).numpy()
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want)


def test_the_torch_free_loader_checks_its_inputs(saved_bert: tuple[Path, qnnx_backend.SaveReport]) -> None:
    """load_arrays refuses arrays of another shape or dtype, and unknown names, naming each."""
    path, _ = saved_bert
    model = qnnx_backend.load_arrays(path)
    assert model.input_names == ("args[0]", "kwargs['attention_mask']")
    ids = _ids().numpy()
    with pytest.raises(SavedInputError, match=r"args\[0\] is int32\[1, 16\], saved as int64\[1, 16\]"):
        model(ids.astype(np.int32), attention_mask=np.ones_like(ids))
    with pytest.raises(SavedInputError, match=r"unknown keyword input\(s\) \['mask'\]; accepted: \['attention_mask'\]"):
        model(ids, mask=np.ones_like(ids))
    with pytest.raises(SavedGraphError, match="not written by qnnx-backend"):
        qnnx_backend.load_arrays(Path(__file__))


class _Ratio(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a / b * 2.0


def test_the_torch_free_loader_refuses_what_htp_cannot_compute(tmp_path: Path) -> None:
    """load_arrays has no PyTorch to fall back to: a NaN input, or a NaN or infinity in an output (a division by
    zero, which HTP writes beyond float16's range), raises QnnRuntimeError naming the input or output; finite calls
    return the torch path's numbers."""
    from qnnx_backend.errors import QnnRuntimeError

    a, b = torch.randn(2, 8), torch.rand(2, 8) + 0.5
    report = qnnx_backend.save(_Ratio(), (a, b), tmp_path / "r.qnnx", options=OPTIONS)
    model = qnnx_backend.load_arrays(tmp_path / "r.qnnx")
    (name,) = model.output_names
    np.testing.assert_array_equal(model(a.numpy(), b.numpy())[name], report.outputs.numpy())
    nan = a.numpy().copy()
    nan[1, 3] = np.nan
    with pytest.raises(QnnRuntimeError, match="holds NaN"):
        model(nan, b.numpy())
    zero = b.numpy().copy()
    zero[0, 0] = 0.0
    with pytest.raises(QnnRuntimeError, match="beyond float16's"):
        model(a.numpy(), zero)


class _MaskedScores(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x + mask, dim=-1) * 2.0


def test_a_saved_file_clips_inputs_beyond_half_range_only_where_that_was_found_exact(tmp_path: Path) -> None:
    """An additive mask of float32's minimum, clipped to -65504 for HTP, gave eager's result in the saving process:
    both loaders accept such a mask. A graph whose example inputs were all within float16's range was never
    checked with clipped inputs, so both loaders (which have no PyTorch graph to check with) refuse an input of 1e5,
    naming it, rather than return ``x / y * 2`` of a clipped x."""
    from qnnx_backend.errors import QnnRuntimeError

    x = torch.randn(2, 8)
    mask = torch.zeros(2, 8)
    mask[:, 5:] = torch.finfo(torch.float32).min
    qnnx_backend.save(_MaskedScores(), (x, mask), tmp_path / "m.qnnx", options=OPTIONS)
    other = torch.zeros(2, 8)
    other[0, :3] = float("-inf")
    want = _MaskedScores()(x, other).numpy()
    (name,) = qnnx_backend.load_arrays(tmp_path / "m.qnnx").output_names
    np.testing.assert_allclose(
        qnnx_backend.load_arrays(tmp_path / "m.qnnx")(x.numpy(), other.numpy())[name], want, atol=2e-3
    )
    np.testing.assert_allclose(qnnx_backend.load(tmp_path / "m.qnnx")(x, other).numpy(), want, atol=2e-3)

    a, b = torch.randn(2, 8), torch.rand(2, 8) + 0.5
    qnnx_backend.save(_Ratio(), (a, b), tmp_path / "r.qnnx", options=OPTIONS)
    far = a.clone()
    far[1, 2] = 1e5
    with pytest.raises(QnnRuntimeError, match=r"holds 100000, beyond float16's"):
        qnnx_backend.load_arrays(tmp_path / "r.qnnx")(far.numpy(), b.numpy())
    with pytest.raises(QnnRuntimeError, match=r"holds 100000, beyond float16's"):
        qnnx_backend.load(tmp_path / "r.qnnx")(far, b)


def _without_key(node: object, key: str) -> object:
    if isinstance(node, dict):
        return {k: _without_key(v, key) for k, v in node.items() if k != key}
    if isinstance(node, list):
        return [_without_key(v, key) for v in node]
    return node


def test_a_file_saved_before_the_clip_decision_was_recorded_still_clips(tmp_path: Path) -> None:
    """A file from before the decision was recorded (its graphs carry no ``clip_inputs``) loads as it did: an
    additive mask of -inf is clipped and masks, in both loaders."""
    from qnnx_backend import _payload

    x = torch.randn(2, 8)
    qnnx_backend.save(_MaskedScores(), (x, torch.zeros(2, 8)), tmp_path / "m.qnnx", options=OPTIONS)
    header, blobs = _payload.unpack_payload((tmp_path / "m.qnnx").read_bytes())
    assert "clip_inputs" in json.dumps(header)
    stripped = _without_key({k: v for k, v in header.items() if k not in ("format", "blobs")}, "clip_inputs")
    (tmp_path / "old.qnnx").write_bytes(_payload.pack_payload(stripped, [bytes(b) for b in blobs]))
    mask = torch.zeros(2, 8)
    mask[:, 5:] = float("-inf")
    want = _MaskedScores()(x, mask).numpy()
    loaded = qnnx_backend.load_arrays(tmp_path / "old.qnnx")
    (name,) = loaded.output_names
    np.testing.assert_allclose(loaded(x.numpy(), mask.numpy())[name], want, atol=2e-3)
    np.testing.assert_allclose(qnnx_backend.load(tmp_path / "old.qnnx")(x, mask).numpy(), want, atol=2e-3)


def test_strict_mismatch_in_the_torch_free_loader_names_the_fix(tmp_path: Path) -> None:
    """A strict file whose saved versions differ from this machine's: load_arrays raises QnnDeviceError naming the
    version and the way out (the header is rewritten with a foreign onnxruntime-qnn version)."""
    from qnnx_backend import _payload

    qnnx_backend.save(_mlp(), torch.randn(2, 8), tmp_path / "m.qnnx", options=OPTIONS)
    header, blobs = _payload.unpack_payload((tmp_path / "m.qnnx").read_bytes())
    header["fingerprint"]["onnxruntime-qnn"] = "0.0.1"
    stripped = {k: v for k, v in header.items() if k not in ("format", "blobs")}
    (tmp_path / "old.qnnx").write_bytes(_payload.pack_payload(stripped, [bytes(b) for b in blobs]))
    with pytest.raises(QnnDeviceError, match=r"onnxruntime-qnn '0.0.1'.*strict=False"):
        qnnx_backend.load_arrays(tmp_path / "old.qnnx")


class _Spectrum(torch.nn.Module):
    """Returns a complex tensor: the real pair comes back from QNN and is rebuilt as complex."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x, norm="ortho")


def test_a_saved_complex_output_comes_back_complex_with_and_without_torch(tmp_path: Path) -> None:
    """A saved graph returning a complex64 spectrum gives the saved complex output from load() and, bit for bit,
    from the torch-free load_arrays (numpy complex64)."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "spectrum.qnnx"
    report = qnnx_backend.save(_Spectrum(), x, path, options=OPTIONS)
    want = report.outputs
    assert want.dtype == torch.complex64
    torch.testing.assert_close(want, torch.fft.rfft(x, norm="ortho"), rtol=0, atol=5e-3)
    _, outs = _load_in_child(path, (x,), {}, tmp_path)
    assert outs[0].dtype == torch.complex64 and torch.equal(outs[0], want)
    np.savez(tmp_path / "feed.npz", **{"args[0]": x.numpy()})
    result = _run(_ARRAYS_CHILD, path, tmp_path / "feed.npz", tmp_path / "out.npz")
    assert not result["torch_loaded"]
    (name,) = result["outputs"]
    got = np.load(tmp_path / "out.npz")[name]
    assert got.dtype == np.complex64 and np.array_equal(got, want.numpy())


class _Pool3d(torch.nn.Module):
    """A 3-D encoder stage returning its max pool's indices: a batched int64 result of rank 5, which the graph
    returns with its leading dims merged and the loader views back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(2, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.max_pool3d(self.conv(x).relu(), 2, return_indices=True)


class _Unpool3d(torch.nn.Module):
    """A 3-D decoder stage taking batched rank-5 int64 indices, which the graph takes with merged leading dims."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 2, 3, padding=1)

    def forward(self, v: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.max_unpool3d(v, i, 2, output_size=(4, 6, 6))).relu()


def test_rank_5_indices_cross_a_saved_file_with_and_without_torch(tmp_path: Path) -> None:
    """A saved 3-D pool returning its batched indices and a saved unpooling taking them: load() in a fresh process
    and the torch-free load_arrays both give the saved outputs, the indices as int64 of rank 5, bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(2, 2, 4, 6, 6)
    encoder, decoder = _Pool3d().eval(), _Unpool3d().eval()
    pool_path, unpool_path = tmp_path / "pool.qnnx", tmp_path / "unpool.qnnx"
    pooled = qnnx_backend.save(encoder, x, pool_path, options=OPTIONS).outputs
    values, indices = pooled
    assert indices.dtype == torch.int64 and indices.shape == (2, 3, 2, 3, 3)
    unpooled = qnnx_backend.save(decoder, (values, indices), unpool_path, options=OPTIONS).outputs
    for path, args, want in ((pool_path, (x,), list(pooled)), (unpool_path, (values, indices), [unpooled])):
        _, outs = _load_in_child(path, args, {}, tmp_path)
        _assert_identical(outs, want)
        np.savez(tmp_path / "feed.npz", **{f"args[{k}]": a.numpy() for k, a in enumerate(args)})
        result = _run(_ARRAYS_CHILD, path, tmp_path / "feed.npz", tmp_path / "out.npz")
        assert not result["torch_loaded"]
        got = np.load(tmp_path / "out.npz")
        for name, w in zip(result["outputs"], want, strict=True):
            assert got[name].dtype == w.numpy().dtype and np.array_equal(got[name], w.numpy())
