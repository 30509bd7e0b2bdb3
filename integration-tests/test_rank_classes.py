"""Real ranks and shapes: decoders with QK-norm, a generated sweep of common patterns at ranks 2-5 with unit and odd
dims, and the first-call check that keeps a wrong graph's output from the caller.

The sweep runs with ``verify=False``: it proves the export passes and the op tables themselves, not the guard that
would hide their mistakes. ``QNNX_RANK_SWEEP_EXAMPLES`` widens it (``nox -s conformance`` sets it).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16

import qnnx_backend

_WIDE = int(os.environ.get("QNNX_RANK_SWEEP_EXAMPLES", "0"))


def _compile_run(fn: Callable[..., torch.Tensor], *args: torch.Tensor, **options: object) -> torch.Tensor:
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.compile(fn, backend="qnn", options={"soc_model": 60, **options})(*args)


# ------------------------------------------------------------------------------------ decoders with QK-norm


def _tiny_decoder(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "use_cache": False,
    }
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(**common)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:  # Gemma 3's text decoder: QK-norm with Gemma's (1 + weight), sliding-window layers
        cfg = transformers.Gemma3TextConfig(**common, sliding_window=8, query_pre_attn_scalar=16)
        model = transformers.Gemma3ForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    # Random init leaves the norm weights at their identity value; trained models do not.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_qk_norm_decoder_runs_wholly_on_qnn_and_right(kind: str) -> None:
    """Tiny Qwen3 and Gemma-3 text decoders (RMSNorm over head_dim of rank-4 q and k; Gemma's embedding scaled by a
    constant at batch 2) run every graph wholly on QNN under strict, with the logits within fp16 tolerance of eager,
    without the first-call guard's help."""
    model = _Logits(_tiny_decoder(kind))
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids)
    got = _compile_run(model, ids, device="npu", strict=True, verify=False)
    reports = qnnx_backend.compile_reports()
    assert reports and all(r.on_qnn and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert "fuse_rmsnorm" in reports[0].passes_applied
    if kind == "gemma3":
        assert "fold_gather_scale" in reports[0].passes_applied
    assert_close_fp16(got, ref, rel=2e-2, cos=0.999)


# ---------------------------------------------------------------------------------------------- rank sweep


def _rmsnorm_hf(x: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(0.5, 1.5, x.shape[-1])
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rmsnorm_gemma(x: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-0.3, 0.3, x.shape[-1])
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * (1.0 + w)


def _rmsnorm_torch(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), torch.linspace(0.5, 1.5, x.shape[-1]), 1e-6)


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), torch.linspace(0.5, 1.5, x.shape[-1]), torch.linspace(-1, 1, x.shape[-1]))


_LAST_AXIS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rmsnorm_hf": _rmsnorm_hf,
    "rmsnorm_gemma": _rmsnorm_gemma,
    "rmsnorm_torch": _rmsnorm_torch,
    "layer_norm": _layer_norm,
    "gelu": F.gelu,
    "silu": F.silu,
}
_ANY_AXIS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "softmax": lambda x, d: torch.softmax(x, d),
    "log_softmax": lambda x, d: torch.log_softmax(x, d),
    "mean_var": lambda x, d: x.mean(d, keepdim=True) + x.var(d, keepdim=True),
    "std": lambda x, d: x.std(d),
    "cumsum": lambda x, d: torch.cumsum(x, d),
    "amax_amin": lambda x, d: x.amax(d) - x.amin(d),
    "l2_normalize": lambda x, d: F.normalize(x, dim=d),
    "transpose": lambda x, d: x.transpose(d, -1).contiguous() * 2.0,
}

_dims = st.one_of(st.just(1), st.integers(2, 9), st.sampled_from([16, 17]))
_shapes = st.lists(_dims, min_size=2, max_size=5).map(tuple)


def _assert_as_eager(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Same NaN positions as eager, and the finite values within fp16 tolerance of eager's scale."""
    assert got.shape == ref.shape
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), "a NaN of eager came back as a number, or the reverse"
    finite = ~torch.isnan(ref)
    g, r = got[finite].double(), ref[finite].double()
    if r.numel():
        scale = max(r.abs().max().item(), 1e-2)
        err = (g - r).abs().max().item() / scale
        assert err <= 2e-2, f"max|err| / max|eager| = {err:.3g}"


def _sweep_settings(test: Callable[..., None]) -> Callable[..., None]:
    return settings(max_examples=_WIDE)(test) if _WIDE else test


@_sweep_settings
@given(shape=_shapes, name=st.sampled_from(sorted(_LAST_AXIS)), scale=st.sampled_from([1.0, 8.0]))
def test_rank_sweep_last_axis_patterns(shape: tuple[int, ...], name: str, scale: float) -> None:
    """Norms and activations over the last axis, at ranks 2-5 with unit and odd dims: qnnx gives eager's answer
    (on QNN or, where QNN would be wrong, by falling back), with the first-call guard off."""
    x = scale * torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    fn = _LAST_AXIS[name]
    with torch.no_grad():
        ref = fn(x)
    _assert_as_eager(_compile_run(fn, x, verify=False), ref)


@_sweep_settings
@given(shape=_shapes, name=st.sampled_from(sorted(_ANY_AXIS)), data=st.data())
def test_rank_sweep_axis_patterns(shape: tuple[int, ...], name: str, data: st.DataObject) -> None:
    """Softmax, log_softmax, mean + var, std, cumsum, amax - amin, L2 normalize and transposes over every axis
    (unit axes included, where var and std are NaN in eager) at ranks 2-5: qnnx gives eager's answer, NaN for
    NaN, with the first-call guard off."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    fn = _ANY_AXIS[name]

    def call(t: torch.Tensor) -> torch.Tensor:
        return fn(t, axis)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var/std over one element warn in eager
        ref = call(x)
    _assert_as_eager(_compile_run(call, x, verify=False), ref)


@_sweep_settings
@given(
    batch=_dims,
    groups=st.sampled_from([1, 2, 4]),
    per_group=st.sampled_from([1, 2, 3, 8]),
    spatial=st.lists(_dims, max_size=3),
    affine=st.booleans(),
)
def test_rank_sweep_group_norm(batch: int, groups: int, per_group: int, spatial: list[int], affine: bool) -> None:
    """GroupNorm (and instance norm: one channel per group) over ``[N, C, *]`` of rank 2-5, unit dims included,
    with and without its affine weight and bias, on the translator's InstanceNormalization form: eager's answer with
    the first-call guard off."""
    # A group of one element normalizes to its bias (eager refuses it at batch 1): 1/sqrt(eps) amplifies fp16
    # rounding there to about 4e-4 absolute, a degenerate case left out.
    assume(per_group * math.prod(spatial) > 1)
    c = groups * per_group
    x = 3.0 * torch.randn(batch, c, *spatial, generator=torch.Generator().manual_seed(c + len(spatial)))
    w, b = (torch.linspace(0.5, 1.5, c), torch.linspace(-1, 1, c)) if affine else (None, None)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return F.group_norm(t, groups, w, b, 1e-5)

    with torch.no_grad():
        ref = fn(x)
    _assert_as_eager(_compile_run(fn, x, verify=False), ref)


@pytest.mark.parametrize(
    ("name", "shape", "axis"),
    [
        ("log_softmax", (4, 1), 1),
        ("log_softmax", (2, 1, 3, 5), 1),
        ("std", (4, 1, 5), 1),
        ("mean_var", (3, 1), -1),
        ("mean_var", (4, 1, 5), 1),
    ],
)
def test_unit_axis_cases_once_wrong_on_qnn(name: str, shape: tuple[int, ...], axis: int) -> None:
    """log_softmax over an axis of size 1 (eager: 0) and var/std of one element (eager: NaN), which QNN computed as
    -4..-7 and as finite numbers: qnnx now gives eager's values."""
    x = torch.randn(shape)
    fn = _ANY_AXIS[name]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fn(x, axis)
    _assert_as_eager(_compile_run(lambda t: fn(t, axis), x, verify=False), ref)


# ---------------------------------------------------------------------------------------- first-call check


def _hand_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def test_default_options_never_return_a_wrong_graph_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately broken rewrite (the Erf GELU fused into a Relu, which QNN runs without complaint): with the
    default options the first call is checked against eager, the wrong output is never returned, and the report
    says why the graph left QNN."""
    import onnx_ir as ir

    from qnnx_export._passes import _fusions, _graph

    def broken(self: _fusions.FuseErfGelu, graph: ir.Graph) -> bool:
        changed = False
        for erf in [n for n in graph if n.op_type == "Erf"]:
            match = self._match(erf)
            if match is None:
                continue
            x, out = match
            new = _graph.new_value(f"broken_{erf.name}", out.dtype, _graph.static_shape(out))
            graph.insert_after(out.producer(), ir.Node("", "Relu", [x], outputs=[new]))
            _graph.replace_value(graph, out, new)
            changed = True
        return changed

    monkeypatch.setattr(_fusions.FuseErfGelu, "rewrite", broken)
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return layer(_hand_gelu(t)) - layer(torch.relu(t))  # the broken Relu makes this exactly 0 - a wrong answer

    with torch.no_grad():
        ref = fn(x)
    got = _compile_run(fn, x)
    torch.testing.assert_close(got, ref)
    reports = qnnx_backend.compile_reports()
    assert reports[0].on_qnn and not reports[-1].on_qnn, [r.summary() for r in reports]
    with pytest.raises(qnnx_backend.errors.QnnRuntimeError, match="accuracy guard"):
        _compile_run(fn, x, device="npu", strict=True)
