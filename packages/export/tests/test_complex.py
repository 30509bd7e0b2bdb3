"""Complex values inside a graph: carried as real pairs (the same values as eager), or refused when an op on them
has no real-pair rewrite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import onnx
import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import cpu_session, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export._complex import as_real_pairs, complex_values, refusal
from qnnx_testkit.strategies import seeds


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode for every test (grad-enabled graphs are refused by design)."""
    with torch.no_grad():
        yield


def _rounding(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal up to float32 rounding: torch.polar's libm cosine and sine may differ from torch.cos and torch.sin in
    the last bit, and ATen's scalar tail of a complex product may fuse a multiply-add."""
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max())))


def _rewritten_matches(cap: Any) -> tuple[Any, ...]:
    """Rewrite the captured graph, check it holds no complex value and returns the original's outputs; return
    its outputs."""
    gm, inputs = as_real_pairs(cap.gm, cap.example_inputs)
    prop = torch.fx.passes.shape_prop.ShapeProp(gm)
    prop.propagate(*inputs)
    dtypes = {
        n.name: n.meta["tensor_meta"].dtype for n in gm.graph.nodes if hasattr(n.meta.get("tensor_meta"), "dtype")
    }
    assert not [name for name, dtype in dtypes.items() if dtype.is_complex], dtypes
    ref, got = cap.gm(*cap.example_inputs), gm(*inputs)
    for r, g in zip(ref, got, strict=True):
        _rounding(g, r)
    return tuple(got)


def _llama4_rope() -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """Hugging Face Llama 4's rotary embedding and its application, as the model calls them."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    cfg = transformers.Llama4TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64
    )
    rotary = Llama4TextRotaryEmbedding(cfg)

    def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs_cis = rotary(q, positions)
        return apply_rotary_emb(q, k, freqs_cis)

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 7, 4, 16, generator=g), torch.randn(2, 7, 2, 16, generator=g)
    return rope, (q, k, torch.arange(7).expand(2, 7))


def test_llama4_rope_is_carried_as_real_pairs() -> None:
    """Llama 4's rope (torch.polar, view_as_complex, a complex product, view_as_real) is exportable, and the
    rewritten graph holds no complex value and gives eager's outputs."""
    rope, args = _llama4_rope()
    cap = only(capture(rope, *args)[0])
    assert complex_values(cap.gm, cap.example_inputs), "the capture should hold complex values"
    assert cap.analysis.exportable, cap.analysis.problems
    _rewritten_matches(cap)


class _BufferRope(torch.nn.Module):
    """Meta's reference Llama: ``freqs_cis`` precomputed with torch.polar, kept as a complex buffer and sliced."""

    def __init__(self, head_dim: int = 8, length: int = 32) -> None:
        super().__init__()
        freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h, d = x.shape
        freqs_cis = self.freqs_cis[:s].view(1, s, 1, d // 2)
        x_ = torch.view_as_complex(x.float().reshape(b, s, h, -1, 2))
        return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


@pytest.mark.parametrize("exporter", ["fast", "torch.onnx"])
def test_complex_buffer_is_frozen_as_real_pair(exporter: str) -> None:
    """A complex buffer becomes a real initializer: the ONNX model has no complex type, and ONNX Runtime's CPU EP
    gives eager's output with either exporter."""
    module = _BufferRope().eval()
    x = torch.randn(2, 5, 3, 8, generator=torch.Generator().manual_seed(1))
    cap = only(capture(module, x)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(exporter=exporter))
    assert exported.exporter == exporter
    model = exported.model
    types = [t.data_type for t in model.graph.initializer]
    types += [v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]]
    assert not {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128} & set(types)
    got = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    _rounding(got[0] if isinstance(got, (tuple, list)) else got, module(x))


def test_complex_buffer_is_still_watched() -> None:
    """The export watches the complex buffer itself: writing into it marks the frozen weights stale and changes
    the graph's fingerprint."""
    module = _BufferRope().eval()
    x = torch.randn(1, 4, 2, 8)
    cap = only(capture(module, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    before = qe.fingerprint(cap.gm, cap.example_inputs, cap.analysis)
    assert exported.params_unchanged(cap.example_inputs)
    module.freqs_cis.mul_(1j)
    assert not exported.params_unchanged(cap.example_inputs)
    after = qe.fingerprint(cap.gm, cap.example_inputs, qe.analyze(cap.gm, cap.example_inputs))
    assert after != before


_GLOBAL_FREQS = torch.polar(torch.ones(4, 3), torch.linspace(-3.0, 3.0, 12).reshape(4, 3))


class _PlainAttributeRope(torch.nn.Module):
    """Meta's reference Llama keeps ``freqs_cis`` as a plain attribute (no buffer); a global constant too."""

    def __init__(self) -> None:
        super().__init__()
        self.freqs_cis = torch.polar(torch.full((4, 3), 0.5), torch.linspace(0.0, 6.0, 12).reshape(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x) * self.freqs_cis * _GLOBAL_FREQS
        return torch.view_as_real(z).flatten(-2)


def test_complex_attribute_and_global_are_frozen_and_watched() -> None:
    """A complex tensor read from a plain attribute or a global is frozen as its real pair (watched like a buffer:
    replacing the attribute marks the frozen weights stale), and the export gives eager's output."""
    module = _PlainAttributeRope().eval()
    x = torch.randn(2, 4, 3, 2, generator=torch.Generator().manual_seed(3))
    cap = only(capture(module, x)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    assert len(cap.analysis.param_indices) == 2 and cap.analysis.user_indices == (0,)
    exported = qe.export(cap.gm, cap.example_inputs)
    _rounding(run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)[0], module(x))
    replaced = list(cap.example_inputs)
    replaced[cap.analysis.param_indices[0]] = replaced[cap.analysis.param_indices[0]].clone()
    assert exported.params_unchanged(cap.example_inputs) and not exported.params_unchanged(replaced)


def test_complex_tensor_inside_an_argument_is_refused() -> None:
    """A complex tensor passed inside an argument (a list item) is an input, not model state: refused."""
    cap = only(
        capture(
            lambda x, zs: torch.view_as_real(torch.view_as_complex(x) * zs[0]),
            torch.randn(3, 2),
            [torch.ones(3, dtype=torch.complex64)],
        )[0]
    )
    assert "unsupported_input" in [p.kind for p in cap.analysis.problems]


def test_export_refuses_what_analysis_refuses() -> None:
    """Exporting a graph whose complex op has no rewrite, with an analysis that missed it, raises ExportError
    naming the op instead of exporting a wrong graph."""
    cap = only(capture(lambda x: torch.view_as_real(torch.exp(torch.view_as_complex(x))), torch.randn(3, 2))[0])
    blind = qe.GraphAnalysis(param_indices=(), user_indices=(0,), problems=())
    with pytest.raises(qe.errors.ExportError, match="exp"):
        qe.export(cap.gm, cap.example_inputs, analysis=blind)


@pytest.mark.parametrize(
    ("fn", "named"),
    [
        (lambda x: torch.view_as_real(torch.exp(torch.view_as_complex(x))), "exp"),
        (lambda x: torch.view_as_complex(x).abs(), "abs"),
        (lambda x: torch.view_as_real(torch.view_as_complex(x) / 3.0), "truediv"),
        (lambda x: torch.view_as_real(torch.view_as_complex(x).view(torch.complex64)), "view"),
        (lambda x: torch.view_as_complex(x).view(torch.float32), "view"),
    ],
    ids=["exp", "abs", "div", "view-same-dtype", "view-as-float"],
)
def test_complex_op_without_rewrite_is_refused(fn: Callable[[torch.Tensor], Any], named: str) -> None:
    """An op on a complex value with no real-pair rewrite keeps the graph in PyTorch with a problem naming it."""
    cap = only(capture(fn, torch.randn(3, 4, 2))[0])
    assert [p.kind for p in cap.analysis.problems] == ["unsupported_value"]
    assert named in cap.analysis.problems[0].detail
    with pytest.raises(ValueError, match="real pairs"):
        as_real_pairs(cap.gm, cap.example_inputs)


def test_complex_user_input_is_refused() -> None:
    """A complex graph input stays refused: the caller's tensor cannot be passed to ONNX."""
    cap = only(capture(lambda z: torch.view_as_real(z * 2), torch.randn(3, dtype=torch.complex64))[0])
    assert "unsupported_input" in [p.kind for p in cap.analysis.problems]


def test_real_and_imag_parts() -> None:
    """``.real``, ``.imag``, conj and a complex scalar factor are carried exactly."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x) * torch.view_as_complex(y).conj() * (0.5 - 2j)
        return torch.cat([z.real, z.imag, torch.view_as_real(z - torch.view_as_complex(y))[..., 1]], -1)

    g = torch.Generator().manual_seed(2)
    cap = only(capture(fn, torch.randn(2, 3, 2, generator=g), torch.randn(3, 2, generator=g))[0])
    assert cap.analysis.exportable, cap.analysis.problems
    assert refusal(cap.gm, cap.example_inputs) is None
    _rewritten_matches(cap)


def test_real_operands_take_part_as_x_plus_0i() -> None:
    """A real factor or summand takes part as x + 0i, as PyTorch promotes it: infinite parts give PyTorch's NaNs
    and signed zeros come out as PyTorch's."""

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x)
        return torch.cat([torch.view_as_real(z * r), torch.view_as_real(r * z * 2.0), torch.view_as_real(z - r)], 0)

    inf = float("inf")
    x = torch.tensor([[1.0, inf], [-0.0, 2.0], [3.0, -0.0], [-inf, 1.0], [0.0, -0.0]])
    r = torch.tensor([2.0, 0.0, -1.0, 0.5, -0.0])
    cap = only(capture(fn, x, r)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    (got,) = _rewritten_matches_nan(cap)
    ref = fn(x, r)
    assert torch.equal(got.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert torch.equal(got[finite], ref[finite]) and torch.equal(got[finite].signbit(), ref[finite].signbit())


def _rewritten_matches_nan(cap: Any) -> tuple[Any, ...]:
    """The rewritten graph's outputs (compared by the caller: they hold NaNs)."""
    gm, inputs = as_real_pairs(cap.gm, cap.example_inputs)
    return tuple(gm(*inputs))


# Each step: the name, and what it does to the complex value z (shape [B, S, H, D]) and the real angles.
_STEPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "polar_none_index": lambda z, a: z * torch.polar(torch.ones_like(a), a)[None, :, None, :],
    "complex_view": lambda z, a: z * torch.complex(a.cos(), a.sin()).view(1, a.shape[0], 1, a.shape[1]),
    "polar_unsqueeze_scaled": lambda z, a: z * (torch.polar(a.exp(), a) * 0.7).unsqueeze(0).unsqueeze(-2),
    "conj": lambda z, a: z.conj().resolve_conj(),
    "complex_scalar": lambda z, a: z * (1.5 + 0.25j),
    "real_factor": lambda z, a: z * a[None, :, None, :],
    "add_self_transposed": lambda z, a: z + z.transpose(1, 2).transpose(-3, -2),
    "sub_real": lambda z, a: z - 0.5,
    "neg_slice": lambda z, a: torch.cat([-z[..., :1], z[..., 1:]], dim=-1),
    "ellipsis_index": lambda z, a: z[..., None, :].squeeze(-2),
    "permute_back": lambda z, a: z.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),
    "reshape_flat": lambda z, a: z.reshape(z.shape[0], -1).reshape(z.shape),
}


@st.composite
def _chains(draw: st.DrawFn) -> tuple[list[str], tuple[int, int, int, int], int, str]:
    steps = draw(st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=4))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 5)))
    return steps, shape, draw(seeds()), draw(st.sampled_from(["flatten", "real_imag"]))


@settings(max_examples=30, deadline=None)
@given(_chains())
def test_random_complex_chains_equal_eager(chain: tuple[list[str], tuple[int, int, int, int], int, str]) -> None:
    """Random chains of the supported complex ops over random shapes (a rope-like product, views, indexing,
    conjugation, sums): the rewritten graph has no complex value and gives the original graph's outputs."""
    steps, (b, s, h, d), seed, out = chain

    def fn(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x.float().reshape(b, s, h, d, 2))
        for step in steps:
            z = _STEPS[step](z, angles)
        if out == "flatten":
            return torch.view_as_real(z).flatten(3)
        return torch.stack([z.real, z.imag], 0)

    g = torch.Generator().manual_seed(seed)
    x, angles = torch.randn(b, s, h, 2 * d, generator=g), torch.randn(s, d, generator=g) * 3
    torch._dynamo.reset()
    cap = only(capture(fn, x, angles)[0])
    assert cap.analysis.exportable, cap.analysis.problems
    _rounding(_rewritten_matches(cap)[0], fn(x, angles))
