"""The direct ATen->ONNX translator (exporter="fast"): agrees with eager, declines cleanly, never mutates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from export_capture import Captured, capture, only
from export_qnn_helpers import (
    Capture,
    close_on_qnn_fast,
    compile_and_run,
    cpu_session,
    qnn_session,
    rel_err,
    run_exported,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten

import qnnx_export as qe
from qnnx_export.errors import ExportError, InvalidOptionsError
from qnnx_testkit.strategies import seeds, shapes

FAST = qe.ExportOptions(exporter="fast")
TORCH_ONNX = qe.ExportOptions(exporter="torch.onnx")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it (grad-enabled graphs are refused by design)."""
    with torch.no_grad():
        yield


def _export(fn: Callable[..., Any], *inputs: Any, options: qe.ExportOptions | None = None) -> tuple[Captured, Any]:
    cap = only(capture(fn, *inputs)[0])
    return cap, qe.export(cap.gm, cap.example_inputs, options=options, analysis=cap.analysis)


def _run(cap: Captured, exported: qe.ExportedGraph) -> Any:
    return run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)


def _assert_matches(out: Any, ref: Any, tol: float, *, structure: bool = True) -> None:
    """Same structure, dtypes and shapes; floats within ``tol`` relative error, the rest exactly."""
    outs, out_spec = tree_flatten(out)
    refs, ref_spec = tree_flatten(ref)
    assert not structure or out_spec == ref_spec
    for o, r in zip(outs, refs, strict=True):
        if not isinstance(r, torch.Tensor):
            assert o == r
            continue
        assert o.dtype == r.dtype and o.shape == r.shape, (o.dtype, o.shape, r.dtype, r.shape)
        assert not torch.isnan(o).any() or torch.isnan(r).any()
        if r.dtype.is_floating_point:
            assert rel_err(o, r) <= tol, rel_err(o, r)
        else:
            assert torch.equal(o, r)


def _check_fast(fn: Callable[..., Any], *inputs: Any, tol: float = 1e-5) -> qe.ExportedGraph:
    """torch.compile through the fast path on ORT CPU (one graph) and compare with eager."""
    ref = fn(*inputs)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, inputs, backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and exported.fast_path_declined is None
    _assert_matches(out, ref, tol)
    return exported


def _op_types(exported: qe.ExportedGraph) -> set[str]:
    return {n.op_type for n in exported.model.graph.node}


# --- example modules ---------------------------------------------------------------------------


def _seeded(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory().eval()


def _bn(c: int, dims: int = 2) -> nn.Module:
    bn = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(c)
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-0.5, 0.5)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    return bn


class _Sdpa(nn.Module):
    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if self.masked else None)


class _ConstantOutputs(nn.Module):
    """Returns its input, a parameter-only value, a fresh constant tensor and a Python constant."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x: torch.Tensor) -> tuple[Any, ...]:
        return x, x @ self.w, self.w.t() * 2, torch.ones(2, 3), 7


class _ConvBnSharedOutput(nn.Module):
    """The conv output is used by the BN and by another op, so the BN cannot be folded."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = _bn(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return self.bn(y), y.relu()


def _attention_mask() -> torch.Tensor:
    mask = torch.rand(2, 1, 5, 7) > 0.4
    mask[:, :, 0, :] = False  # a fully masked query row: PyTorch returns 0 there, not NaN
    mask[:, :, 1, :] = True
    return mask


class _M:
    """A module built for :func:`_case` under a fixed seed, in eval mode."""

    def __init__(self, factory: Callable[[], nn.Module]) -> None:
        self.factory = factory


Example = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]


def _case(fn: Callable[..., Any] | _M, *inputs: tuple[int, ...] | Callable[[], torch.Tensor]) -> Example:
    """A lazily built (callable, inputs) pair: a tuple input is a randn shape, a callable makes the tensor."""

    def build() -> tuple[Callable[..., Any], tuple[Any, ...]]:
        model = _seeded(fn.factory) if isinstance(fn, _M) else fn
        torch.manual_seed(0)
        return model, tuple(torch.randn(*i) if isinstance(i, tuple) else i() for i in inputs)

    return build


def _ints(*shape: int, high: int = 10) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, high, shape)


EXAMPLES: dict[str, Example] = {
    "linear_2d": _case(_M(lambda: nn.Linear(8, 5)), (3, 8)),
    "linear_3d": _case(_M(lambda: nn.Linear(8, 5)), (2, 4, 8)),
    "linear_no_bias": _case(_M(lambda: nn.Linear(8, 5, bias=False)), (2, 4, 8)),
    "conv1d": _case(_M(lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1)), (2, 4, 11)),
    "conv2d_bias_pad_stride": _case(_M(lambda: nn.Conv2d(3, 8, 3, stride=2, padding=1)), (2, 3, 9, 9)),
    "conv2d_groups_dilation": _case(
        _M(lambda: nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2, bias=False)), (1, 4, 8, 8)
    ),
    "conv2d_depthwise": _case(_M(lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6)), (1, 6, 7, 7)),
    "group_norm": _case(_M(lambda: nn.GroupNorm(2, 6)), (2, 6, 3, 5)),
    "group_norm_no_affine_rank3": _case(_M(lambda: nn.GroupNorm(3, 6, affine=False)), (2, 6, 7)),
    "group_norm_one_group_rank5": _case(_M(lambda: nn.GroupNorm(1, 4)), (1, 4, 2, 3, 2)),
    "instance_norm_as_groups": _case(_M(lambda: nn.GroupNorm(4, 4)), (2, 4, 5, 5)),
    # ATen gets padding=[0] for every spatial dim: SigLIP's patch embedding.
    "conv2d_padding_valid": _case(_M(lambda: nn.Conv2d(3, 8, 4, stride=4, padding="valid")), (1, 3, 16, 16)),
    "conv1d_padding_same": _case(_M(lambda: nn.Conv1d(3, 4, 4, padding="same")), (2, 3, 9)),
    "conv_transpose2d": _case(
        _M(lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)), (1, 4, 5, 5)
    ),
    "batchnorm_alone": _case(_M(lambda: _bn(4)), (2, 4, 5, 5)),
    "batchnorm1d": _case(_M(lambda: _bn(4, dims=1)), (3, 4, 6)),
    "layernorm_affine": _case(_M(lambda: nn.LayerNorm(8)), (2, 3, 8)),
    "layernorm_no_affine": _case(_M(lambda: nn.LayerNorm([3, 8], elementwise_affine=False)), (2, 3, 8)),
    "gelu": _case(_M(lambda: nn.GELU()), (4, 9)),
    "gelu_tanh": _case(_M(lambda: nn.GELU(approximate="tanh")), (4, 9)),
    "silu": _case(_M(lambda: nn.SiLU()), (4, 9)),
    "hardswish": _case(_M(lambda: nn.Hardswish()), lambda: torch.randn(4, 9) * 4),
    "hardsigmoid": _case(_M(lambda: nn.Hardsigmoid()), lambda: torch.randn(4, 9) * 4),
    "leaky_relu": _case(_M(lambda: nn.LeakyReLU(0.2)), (4, 9)),
    "elu": _case(_M(lambda: nn.ELU(0.7)), (4, 9)),
    "clamp": _case(lambda x: x.clamp(-0.5, 0.75), (4, 9)),
    "clamp_min": _case(lambda x: x.clamp(min=0.1), (4, 9)),
    "clamp_tensor_bounds": _case(
        lambda x, lo, hi: (x.clamp(lo, hi), x.clamp(min=lo), torch.clamp_max(x, hi), x.clamp(hi, lo)),
        (4, 9),
        (9,),
        (4, 1),
    ),
    "celu": _case(_M(lambda: nn.CELU(0.4)), lambda: torch.randn(4, 9) * 3),
    "triu_tril": _case(lambda x: (x.triu(1), x.tril(-1), torch.tril(x * 2)), (2, 4, 6)),
    "hardtanh": _case(_M(lambda: nn.Hardtanh(-0.3, 0.6)), (4, 9)),
    "relu6": _case(_M(lambda: nn.ReLU6()), lambda: torch.randn(4, 9) * 8),
    "softmax": _case(lambda x: x.softmax(-1), (2, 3, 7)),
    "softmax_dim1": _case(lambda x: torch.softmax(x, 1), (2, 3, 7)),
    "log_softmax": _case(lambda x: F.log_softmax(x, dim=-1), (2, 3, 7)),
    "maxpool2d": _case(_M(lambda: nn.MaxPool2d(3, stride=2, padding=1)), (1, 3, 9, 9)),
    "avgpool2d_include_pad": _case(_M(lambda: nn.AvgPool2d(3, stride=2, padding=1)), (1, 3, 9, 9)),
    "avgpool2d_exclude_pad": _case(
        _M(lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)), (1, 3, 9, 9)
    ),
    "avgpool2d_ceil_include_pad": _case(_M(lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)), (1, 3, 8, 8)),
    "avgpool2d_ceil_exclude_pad": _case(
        _M(lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)), (1, 3, 8, 9)
    ),
    # The last ceil window along H would start in the end padding: PyTorch and ONNX Runtime drop it (3 -> 2 rows).
    "avgpool2d_ceil_window_in_end_padding": _case(
        _M(lambda: nn.AvgPool2d(2, stride=2, padding=1, ceil_mode=True)), (1, 3, 3, 6)
    ),
    "adaptive_avgpool_1": _case(_M(lambda: nn.AdaptiveAvgPool2d(1)), (2, 3, 6, 5)),
    "adaptive_avgpool_divisible": _case(_M(lambda: nn.AdaptiveAvgPool2d((2, 3))), (2, 3, 6, 9)),
    "adaptive_avgpool_uneven": _case(_M(lambda: nn.AdaptiveAvgPool2d((3, 4))), (2, 3, 7, 5)),
    "embedding": _case(_M(lambda: nn.Embedding(10, 4)), _ints(2, 5)),
    "gather": _case(lambda x, i: torch.gather(x, 1, i), (3, 6), _ints(3, 4, high=6)),
    "index_select": _case(lambda x, i: x.index_select(1, i), (3, 6), _ints(4, high=6)),
    "cat": _case(lambda x, y: torch.cat([x, y, x], dim=1), (2, 3), (2, 4)),
    # Cohere's rotary embedding interleaves with stack(..., dim=-1).
    "stack_last": _case(lambda x, y: torch.stack([-y, x], dim=-1).flatten(-2), (2, 3, 4), (2, 3, 4)),
    "stack_first_one": _case(lambda x: torch.stack([x.relu()], dim=0) * 2, (3, 4)),
    # MobileViT-v2's patches: unfold and fold with the kernel as the stride are layout changes of rank <= 5.
    "unfold_fold_patches": _case(
        lambda x: F.fold(F.unfold(x, (2, 3), stride=(2, 3)) * 2, (4, 9), (2, 3), stride=(2, 3)), (2, 3, 4, 9)
    ),
    "split": _case(lambda x: [a * (i + 1) for i, a in enumerate(x.split(2, dim=1))], (2, 7)),
    "unbind": _case(lambda x: [a * (i + 1) for i, a in enumerate(x.unbind(1))], (2, 3, 4)),
    "unsafe_split": _case(lambda x: [a.relu() + i for i, a in enumerate(x.unsafe_split(2, dim=-1))], (2, 5)),
    "chunk": _case(lambda x: [a.relu() for a in x.chunk(3, dim=-1)], (2, 9)),
    "slice_step": _case(lambda x: x[:, 1::2] + x[:, :-1:3].sum(-1, keepdim=True), (3, 10)),
    "select": _case(lambda x: x[:, -1] * x[0, 2], (3, 4)),
    "permute_transpose": _case(lambda x: x.permute(2, 0, 1).transpose(0, 1).contiguous() * 2, (2, 3, 4)),
    "expand": _case(lambda x: x.expand(3, 4, 5) + 1, (1, 4, 1)),
    "masked_fill": _case(lambda x: x.masked_fill(x > 0.5, -2.0), (3, 5)),
    "where": _case(lambda x, y: torch.where(x > y, x, y * 2), (3, 5), (5,)),
    "where_scalar": _case(lambda x: torch.where(x > 0, x, 0.0), (3, 5)),
    "comparisons": _case(lambda x, y: (x < y, x <= 0.1, x > y, x >= 0, x == x, x != y), (3, 5), (3, 5)),
    "int_plus_float_scalar": _case(lambda i: i + 1.5, _ints(3, 4)),
    "int_times_float_tensor": _case(lambda i, x: i * x, _ints(3, 4), (3, 4)),
    "bool_sum_int64": _case(lambda x: (x > 0).sum(dim=1), (4, 6)),
    "int_arith": _case(lambda i: (i * 3 - 2, i.sum(), i.amax(0)), _ints(3, 4)),
    "pow": _case(lambda x: (x.abs() + 0.5).pow(1.7) + x.pow(2), (3, 5)),
    "rsqrt": _case(lambda x: torch.rsqrt(x.abs() + 0.1), (3, 5)),
    "reductions_keepdim": _case(
        lambda x: (x.mean(-1, keepdim=True), x.sum((0, 2)), x.amax(1, keepdim=True), x.mean()), (2, 3, 4)
    ),
    "constant_pad": _case(lambda x: F.pad(x, (1, 2, 0, 3), value=0.5), (1, 2, 3, 4)),
    "relu_inplace": _case(_M(lambda: nn.Sequential(nn.Linear(6, 6), nn.ReLU(inplace=True), nn.Linear(6, 2))), (2, 6)),
    "sdpa": _case(_M(lambda: _Sdpa(masked=False)), (2, 1, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), _attention_mask),
    "sdpa_bool_mask_fully_masked_row": _case(
        _M(lambda: _Sdpa(masked=True)), (2, 1, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), _attention_mask
    ),
    "sdpa_causal": _case(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (2, 2, 5, 4),
        (2, 2, 5, 4),
        (2, 2, 5, 4),
    ),
    "transformer_encoder_layer": _case(
        _M(lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)), (2, 5, 16)
    ),
    "index_constant_negative": _case(lambda x: x[:, torch.tensor([-1, 0, -3])] * 3, (3, 6)),
    "index_one_tensor": _case(lambda x, i: x[:, i] * 2, (3, 6), lambda: torch.tensor([5, -1, 0, 2])),
    "index_constant_grid": _case(
        lambda x: x[torch.arange(3)[:, None], torch.arange(4)[None, :] - 2] + 1,
        (3, 6),  # negative indices too
    ),
    "index_constant_grid_after_a_slice": _case(
        lambda x: x[:, torch.arange(2)[:, None], torch.tensor([[0, 3, -1]])], (2, 3, 5)
    ),
    "bool_mask_and_or_xor": _case(
        lambda x, y: ((x > 0) & (y > 0), (x > 0) | (y < 0), (x > 0) ^ (y > 0)), (3, 5), (3, 5)
    ),
    "output_is_view_of_input": _case(lambda x: (x.view(6, 2), x.t(), x[1]), (3, 4)),
    "duplicated_output": _case(lambda x: ((y := x.relu() * 2), y, y + 1), (3, 4)),
    "input_passthrough_and_constants": _case(_M(lambda: _ConstantOutputs()), (3, 4)),
    "conv_output_also_used_next_to_bn": _case(_M(lambda: _ConvBnSharedOutput()), (1, 3, 6, 6)),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_matches_eager_on_cpu(name: str) -> None:
    """Each handler family exports on the fast path and matches eager in values, dtypes and shapes."""
    fn, inputs = EXAMPLES[name]()
    _check_fast(fn, *inputs)


# --- batch-norm folding ------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [1, 2])
def test_conv_batchnorm_is_folded(dims: int) -> None:
    """Conv followed by an eval BatchNorm becomes a single Conv (no BatchNormalization) with eager's result."""
    conv = nn.Conv1d(3, 5, 3, padding=1) if dims == 1 else nn.Conv2d(3, 5, 3, padding=1, bias=False)
    model = _seeded(lambda: nn.Sequential(conv, _bn(5, dims), nn.ReLU()))
    x = torch.randn(2, 3, *([7] * dims))
    exported = _check_fast(model, x)
    ops = _op_types(exported)
    assert "BatchNormalization" not in ops
    assert [n.op_type for n in exported.model.graph.node].count("Conv") == 1


class _ConvThenLateNorm(nn.Module):
    """A batch norm whose weight is computed after the convolution in graph order (it cannot be folded in)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), self.mean, self.var, weight=self.gain * 2, training=False)


def test_batchnorm_argument_computed_after_the_conv_is_not_folded() -> None:
    """The fast path translates conv and batch norm apart (it used to raise KeyError) and matches eager."""
    exported = _check_fast(_seeded(_ConvThenLateNorm), torch.randn(1, 3, 8, 8))
    assert exported.exporter == "fast"


# --- declines ----------------------------------------------------------------------------------


def _atan2(x: torch.Tensor) -> torch.Tensor:
    return torch.atan2(x.relu(), x + 2) * 2


@pytest.mark.parametrize(
    ("fn", "op"),
    [(_atan2, "atan2"), (lambda x: torch.flip(x, [1]) + 1, "flip")],
    ids=["atan2", "flip"],
)
def test_unsupported_op_falls_back_to_torch_onnx(fn: Callable[..., Any], op: str) -> None:
    """An op without a handler makes "auto" use torch.onnx, names the op, and still gives eager's result."""
    x = torch.randn(3, 5)
    backend = Capture(cpu_session)
    out = compile_and_run(fn, (x,), backend)
    (exported,) = backend.exported
    assert exported.exporter == "torch.onnx"
    assert exported.fast_path_declined is not None and op in exported.fast_path_declined
    _assert_matches(out, fn(x), 1e-5)


def _vmapped(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.vmap(lambda row: row @ w)(x).relu()


def test_vmap_region_leaves_functorch_levels_as_found() -> None:
    """A graph holding a ``torch.vmap`` region (Dynamo writes it as ``_vmap_increment_nesting`` ...
    ``_vmap_decrement_nesting`` calls; transformers' Mamba scan is one): the direct translator's trace fails inside
    the region, and functorch's stack of levels is left as deep as it was. A vmap level it kept pushed made the
    torch.onnx fallback fail (``batched == nullptr INTERNAL ASSERT FAILED``), and every later run of the graph."""
    x, w = torch.randn(3, 4, 5), torch.randn(5, 6)
    cap = only(capture(_vmapped, x, w)[0])
    depth = torch._C._functorch.get_dynamic_layer_stack_depth
    with pytest.raises(ExportError):
        qe.export(cap.gm, cap.example_inputs, options=FAST)
    assert depth() == 0
    exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    assert depth() == 0
    assert exported.exporter == "torch.onnx" and exported.fast_path_declined is not None
    _assert_matches(_run(cap, exported), (_vmapped(x, w),), 1e-5)
    _assert_matches(cap.gm(*cap.example_inputs), (_vmapped(x, w),), 0.0)  # the graph itself still runs


def test_unsupported_op_with_fast_exporter_raises() -> None:
    """exporter="fast" refuses a graph it cannot translate with an ExportError saying why and how to fix."""
    cap = only(capture(_atan2, torch.randn(3, 5))[0])
    with pytest.raises(ExportError) as info:
        qe.export(cap.gm, cap.example_inputs, options=FAST)
    message = str(info.value)
    assert "atan2" in message and "exporter='auto'" in message and "torch.onnx" in message


@settings(max_examples=30, deadline=None)
@given(dims=shapes(min_rank=2, max_rank=5, max_side=5), data=st.data(), seed=seeds())
def test_a_circular_pad_is_translated_as_slices_and_equals_eager(
    dims: list[int], data: st.DataObject, seed: int
) -> None:
    """F.pad(mode="circular") of the 1 to 3 trailing axes after a batch axis (and a channel axis), each side from 0 to
    the axis' size, is written as slices
    joined by cat (PyTorch's own decomposition copies into an empty tensor, which no exporter takes) and equals
    eager bit for bit, corners included."""
    axes = data.draw(st.sampled_from([n for n in (len(dims) - 2, len(dims) - 1) if 1 <= n <= 3]))  # as PyTorch allows
    pads = tuple(data.draw(st.integers(0, dims[len(dims) - 1 - i // 2])) for i in range(2 * axes))
    x = torch.randn(dims, generator=torch.Generator().manual_seed(seed))
    exported = _check_fast(lambda a: F.pad(a, pads, mode="circular") * 2, x, tol=0.0)
    assert "Pad" not in {n.op_type for n in exported.model.graph.node}


def test_a_circular_convolution_runs_wholly_on_the_htp_simulator() -> None:
    """nn.Conv2d(padding_mode="circular") and a circular Conv1d run on QNN HTP with eager's values (before, the
    circular pad ran in PyTorch: torch.onnx writes it as a Pad of mode 'wrap', which the QNN EP declines)."""
    torch.manual_seed(0)
    conv2 = nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular").eval()
    conv1 = nn.Conv1d(3, 4, 5, padding=2, padding_mode="circular").eval()

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([conv2(x).flatten(), conv1(y).flatten()])

    close_on_qnn_fast(fn, torch.randn(1, 3, 6, 7), torch.randn(2, 3, 9), tol=1e-2)


@pytest.mark.parametrize("eps", [1e-5, None])
def test_rms_norm_is_translated_without_in_place_add(eps: float | None) -> None:
    """nn.RMSNorm (torch.rms_norm) traces to an in-place ``aten.add_`` of eps that functionalization leaves in the
    graph, which the translator declined (and torch.onnx cannot take once the graph also writes a static KV cache):
    it is exported as its plain math and runs on QNN HTP with eager's values."""
    torch.manual_seed(0)
    norm = nn.RMSNorm(16, eps=eps).eval()
    nn.init.normal_(norm.weight)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return norm(x) * 2 + F.rms_norm(x, (4, 16))

    close_on_qnn_fast(fn, torch.randn(2, 4, 16), tol=1e-2)


@settings(max_examples=12, deadline=None)
@given(
    size=st.tuples(st.integers(2, 9), st.integers(2, 9)),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 3),
    data=st.data(),
    seed=seeds(),
)
def test_maxpool_ceil_mode_equals_eager_on_qnn(
    size: tuple[int, int], kernel: int, stride: int, data: st.DataObject, seed: int
) -> None:
    """MaxPool2d(ceil_mode=True), with padding, runs wholly on the HTP simulator with eager's output shape and
    values (a last window that starts in the end padding is dropped as PyTorch drops it). (The QNN EP declines
    MaxPool with dilations, with or without ceil_mode.)"""
    padding = data.draw(st.integers(0, kernel // 2))
    assume(all(s + 2 * padding >= kernel for s in size))
    model = nn.MaxPool2d(kernel, stride=stride, padding=padding, ceil_mode=True)
    x = torch.randn(1, 2, *size, generator=torch.Generator().manual_seed(seed)) - 3  # all-negative windows too
    backend = Capture(qnn_session, FAST)
    out = compile_and_run(model, (x,), backend)
    ref = model(x)
    assert out.shape == ref.shape
    assert float((out - ref).abs().max()) <= 4e-3 * float(ref.abs().max())


def test_avgpool_divisor_override_matches_eager() -> None:
    """AvgPool2d(divisor_override=...) has no ONNX attribute: the fast path writes the pool with count_include_pad
    and a constant factor, equal to eager on the CPU EP. (torch.onnx drops the override, 0.56 of the scale off
    here, and the backend's check against eager refuses that model.)"""
    pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, divisor_override=4)
    x = torch.randn(1, 2, 8, 8)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(pool, (x,), backend)
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
    assert rel_err(out, pool(x)) <= 1e-6


_INDEX_DECLINES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], str]] = {
    "non_adjacent_indices": (
        lambda x: x[torch.tensor([0, 1]), :, torch.tensor([2, 0])],
        (torch.randn(2, 3, 4),),
        "non-adjacent",
    ),
    "int_bitwise_and": (lambda i, j: i & j, (torch.tensor([6, 3]), torch.tensor([3, 5])), "non-bool"),
    "fold_overlapping": (lambda x: F.fold(x, (5, 5), 3, padding=1), (torch.randn(1, 18, 25),), "non-overlapping"),
    "fold_remainder": (lambda x: F.fold(x, (5, 4), 2, stride=2), (torch.randn(1, 8, 4),), "does not divide"),
}


@pytest.mark.parametrize("name", sorted(_INDEX_DECLINES))
def test_index_and_bitwise_forms_outside_the_translator_decline(name: str) -> None:
    """Advanced indexing the translator cannot make exact, and integer bit operations, go to torch.onnx (or to
    ExportError with exporter="fast"), never to a wrong model."""
    fn, inputs, reason = _INDEX_DECLINES[name]
    with pytest.raises(Exception, match="direct translator cannot take this graph") as info:
        compile_and_run(fn, inputs, Capture(cpu_session, FAST))  # Dynamo wraps the backend's ExportError
    assert reason in str(info.value)
    ref = fn(*inputs)
    backend = Capture(cpu_session)
    _assert_matches(compile_and_run(fn, inputs, backend), ref, 1e-6)
    assert backend.exported[0].exporter == "torch.onnx"


def test_bogus_exporter_option_names_accepted_values() -> None:
    """An unknown exporter name is an InvalidOptionsError listing "auto", "fast" and "torch.onnx"."""
    with pytest.raises(InvalidOptionsError, match="bogus") as info:
        qe.ExportOptions(exporter="bogus")
    assert all(name in str(info.value) for name in ("'auto'", "'fast'", "'torch.onnx'"))


def test_torch_onnx_option_skips_fast_path() -> None:
    """exporter="torch.onnx" never uses the translator, even for a graph it supports."""
    model, x = _seeded(lambda: nn.Linear(4, 3)), torch.randn(2, 4)
    _, exported = _export(model, x, options=TORCH_ONNX)
    assert exported.exporter == "torch.onnx" and exported.fast_path_declined is None


_RANDOM = {
    "randint": lambda x: x + torch.randint(10, (3,)),
    "normal": lambda x: x + torch.normal(0.0, 1.0, (3,)),
    "multinomial": lambda x: x + torch.multinomial(torch.ones(3), 3, replacement=True),
    "poisson": lambda x: x + torch.poisson(torch.ones(3)),
}


@pytest.mark.parametrize("name", sorted(_RANDOM))
def test_random_ops_are_not_folded(name: str) -> None:
    """A random op with constant inputs is declined, not folded into one frozen draw (the RNG is untouched)."""
    cap = only(capture(_RANDOM[name], torch.zeros(3))[0])
    rng = torch.get_rng_state()
    with pytest.raises(ExportError, match=f"no translation for aten.{name}"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)
    assert torch.equal(torch.get_rng_state(), rng)


# --- folding never touches the user's tensors --------------------------------------------------


class _WeightViews(nn.Module):
    """A forward that transposes, slices, reshapes and does arithmetic on its parameters (all folded)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.w = nn.Parameter(torch.randn(8, 6))
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = _bn(4)
        self.register_buffer("pos", torch.arange(8).float())

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = x @ self.qkv.weight[:8].t() + self.qkv.bias[:8]
        k = x @ self.qkv.weight[8:16:2].transpose(0, 1).repeat(1, 2)
        w = self.w.clone()
        w.mul_(2).add_(self.pos[:, None])
        y = q + k + x @ w[:, ::2].reshape(8, 3).sum(-1, keepdim=True)
        return y, self.bn(self.conv(img))


def test_folding_never_mutates_parameters() -> None:
    """After export (with folding of weight views and BN), every parameter and buffer is bit-identical."""
    model = _seeded(_WeightViews)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = (torch.randn(3, 8), torch.randn(1, 2, 5, 5))
    exported = _check_fast(model, *inputs)
    assert "BatchNormalization" not in _op_types(exported)
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == before[name].dtype
        assert torch.equal(tensor.reshape(-1).view(torch.uint8), before[name].reshape(-1).view(torch.uint8)), name


class _ScaledWeights(nn.Module):
    """Each step uses a folded, non-contiguous tensor of the same layout (``w.t() * s``, ``w.t() + s``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(width, width) / width**0.5) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for i, w in enumerate(self.ws):
            y = y + x @ (w.t() * (i + 1)) if i % 2 else y @ (w.t() + 0.1 * i)
        return y


@pytest.mark.parametrize("width", [16, 32, 64, 128])
def test_folded_weights_of_same_layout_keep_their_values(width: int) -> None:
    """Folded temporaries of one layout each keep their own values (a freed one's address may be reused)."""
    _check_fast(_seeded(lambda: _ScaledWeights(width)), torch.randn(2, width))


# --- determinism and agreement with torch.onnx -------------------------------------------------


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), _bn(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


AGREEMENT = {
    "cnn": lambda: (_seeded(_cnn), (torch.randn(1, 3, 10, 10),)),
    "encoder_layer": EXAMPLES["transformer_encoder_layer"],
    # Not the masked SDPA with a fully masked row: torch.onnx (torch 2.13) gives the mean of V there.
    "sdpa_causal": EXAMPLES["sdpa_causal"],
}


@pytest.mark.parametrize("name", sorted(AGREEMENT))
def test_fast_export_is_deterministic_and_agrees_with_torch_onnx(name: str) -> None:
    """The same graph gives identical bytes twice, and the fast and torch.onnx models agree on ORT CPU."""
    model, inputs = AGREEMENT[name]()
    cap = only(capture(model, *inputs)[0])
    first = qe.export(cap.gm, cap.example_inputs, options=FAST)
    second = qe.export(cap.gm, cap.example_inputs, options=FAST)
    assert first.model_bytes() == second.model_bytes()
    reference = qe.export(cap.gm, cap.example_inputs, options=TORCH_ONNX)
    assert reference.exporter == "torch.onnx"
    fast_out, onnx_out = _run(cap, first), _run(cap, reference)
    _assert_matches(fast_out, onnx_out, 1e-5)
    _assert_matches(fast_out, model(*inputs), 1e-5, structure=False)


# --- dtypes ONNX Runtime has no kernel for -----------------------------------------------------

_BOOL_OPS = {
    "bool_mul": lambda x: (x > 0) * (x < 1),
    "bool_maximum": lambda x: torch.maximum(x > 0, x < 0.5),
    "bool_less": lambda x: (x > 0) < (x > 0.5),
}
_NO_KERNEL = {
    **_BOOL_OPS,
    "bool_add": lambda x: (x > 0) + (x < 1),
    "bool_where": lambda x: torch.where(x > 0, x > 1, x < -1),
    "int64_relu": lambda x: (x * 4).long().relu(),
    "int64_floor": lambda x: torch.floor((x * 4).long()),
    "int8_matmul": lambda x: (x * 4).to(torch.int8) @ (x * 4).to(torch.int8).t(),
}


@pytest.mark.parametrize("name", sorted(_NO_KERNEL))
def test_dtype_without_onnx_kernel_declines(name: str) -> None:
    """An op on a dtype ONNX/ORT cannot run (bool Mul, int64 Relu, ...) is declined, not written as a broken model."""
    cap = only(capture(_NO_KERNEL[name], torch.randn(3, 4))[0])
    with pytest.raises(ExportError, match="direct translator cannot take this graph"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


@pytest.mark.parametrize("name", sorted(_BOOL_OPS))
def test_bool_arithmetic_falls_back_and_matches(name: str) -> None:
    """Bool arithmetic/comparisons go to torch.onnx under "auto" and give eager's exact result."""
    fn, x = _BOOL_OPS[name], torch.randn(3, 4)
    backend = Capture(cpu_session)
    out = compile_and_run(fn, (x,), backend)
    assert backend.exported[0].exporter == "torch.onnx"
    assert "bool" in backend.exported[0].fast_path_declined
    _assert_matches(out, fn(x), 0.0)


# --- properties --------------------------------------------------------------------------------

_FLOAT_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": F.elu,
    "neg": torch.neg,
    "abs": torch.abs,
    "exp_tanh": lambda x: torch.exp(torch.tanh(x)),
    "sqrt_abs": lambda x: torch.sqrt(x.abs() + 0.1),
    "rsqrt_abs": lambda x: torch.rsqrt(x.abs() + 0.1),
    "sin": torch.sin,
    "erf": torch.erf,
    "clamp": lambda x: x.clamp(-0.5, 0.8),
    "softmax_last": lambda x: x.softmax(-1),
    "square": lambda x: x.pow(2),
}
_INT_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "clamp": lambda x: x.clamp(-2, 3),
    "to_float": lambda x: x.float(),
    "is_positive": lambda x: x > 0,
    "plus_float": lambda x: x + 0.5,
}
_BOOL_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "not": torch.logical_not,
    "to_float": lambda x: x.float(),
    "to_long": lambda x: x.long(),
}
_SCALAR_BINARY = {
    "add": lambda x, s: x + s,
    "sub": lambda x, s: x - s,
    "rsub": lambda x, s: s - x,
    "mul": lambda x, s: x * s,
}
_TENSOR_BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}


def _leaf(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype == torch.int64:
        return torch.randint(-6, 7, shape, generator=gen)
    return torch.randn(shape, generator=gen)


Step = Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]


def _draw_step(draw: st.DrawFn, cur: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[Step, str] | None:
    """One op valid for ``cur`` (its dtype and shape); extra operands are appended to ``inputs``."""
    rank, dt = cur.dim(), cur.dtype
    kinds = ["unary", "reshape", "permute"]
    kinds += ["transpose"] if rank >= 2 else []
    kinds += ["slice", "cat"] if rank >= 1 else []
    kinds += ["logical", "count"] if dt == torch.bool else ["scalar", "tensor"]
    kinds += ["reduce"] if rank >= 1 and dt != torch.bool else []
    kinds += ["matmul"] if rank >= 2 and dt != torch.bool else []  # 1-D @ 2-D leaves a squeeze_: declined
    kinds += ["compare", "where"] if dt != torch.bool else []
    kind = draw(st.sampled_from(kinds))
    seed = draw(seeds())
    k = len(inputs) - 1  # index in ``others`` of an operand appended now
    if kind == "unary":
        table = _FLOAT_UNARY if dt.is_floating_point else _INT_UNARY if dt == torch.int64 else _BOOL_UNARY
        name = draw(st.sampled_from(sorted(table)))
        if name == "softmax_last" and rank == 0:
            return None
        return (lambda x, o, f=table[name]: f(x)), name
    if kind == "scalar":
        name = draw(st.sampled_from(sorted(_SCALAR_BINARY)))
        s = draw(st.sampled_from([2, -1, 3] if dt == torch.int64 else [0.5, -1.5, 2.0, 3.0]))
        return (lambda x, o, f=_SCALAR_BINARY[name]: f(x, s)), f"{name}({s})"
    if kind == "tensor":
        name = draw(st.sampled_from(sorted(_TENSOR_BINARY)))
        # A broadcast operand: some dims are 1 and leading dims may be missing.
        shape = tuple(d if draw(st.booleans()) else 1 for d in cur.shape)
        shape = shape[draw(st.integers(0, len(shape))) :]
        inputs.append(_leaf(dt, shape, seed))
        return (lambda x, o, f=_TENSOR_BINARY[name]: f(x, o[k])), f"{name}{list(shape)}"
    if kind == "reshape":
        if rank >= 2 and draw(st.booleans()):
            d = draw(st.integers(0, rank - 2))
            return (lambda x, o: x.flatten(d, d + 1)), f"flatten({d})"
        d = draw(st.integers(0, rank))
        return (lambda x, o: x.unsqueeze(d)), f"unsqueeze({d})"
    if kind == "permute":
        perm = tuple(draw(st.permutations(range(rank))))
        return (lambda x, o: x.permute(perm)), f"permute{perm}"
    if kind == "transpose":
        a, b = draw(st.integers(0, rank - 1)), draw(st.integers(-rank, -1))
        return (lambda x, o: x.transpose(a, b)), f"transpose({a},{b})"
    if kind == "slice":
        d = draw(st.integers(0, rank - 1))
        start = draw(st.integers(0, cur.shape[d] - 1))
        stop = draw(st.integers(start + 1, cur.shape[d]))
        step = draw(st.integers(1, 3))
        index = (slice(None),) * d + (slice(start, stop, step),)
        return (lambda x, o: x[index]), f"slice(dim={d}, {start}:{stop}:{step})"
    if kind == "cat":
        d = draw(st.integers(-rank, rank - 1))
        shape = list(cur.shape)
        shape[d] = draw(st.integers(1, 3))
        inputs.append(_leaf(dt, tuple(shape), seed))
        return (lambda x, o: torch.cat([x, o[k], x], d)), f"cat({d}, {shape})"
    if kind == "reduce":
        name = draw(st.sampled_from(["sum", "amax"] + (["mean"] if dt.is_floating_point else [])))
        d, keep = draw(st.integers(-rank, rank - 1)), draw(st.booleans())
        return (lambda x, o: getattr(x, name)(d, keepdim=keep)), f"{name}({d}, keepdim={keep})"
    if kind == "matmul":
        inputs.append(_leaf(dt, (cur.shape[-1], draw(st.integers(1, 4))), seed))
        return (lambda x, o: x @ o[k]), f"matmul{list(inputs[-1].shape)}"
    if kind == "compare":
        fn = draw(st.sampled_from([torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne]))
        s = draw(st.sampled_from([0, 1] if dt == torch.int64 else [0.0, 0.3, -0.5]))
        return (lambda x, o: fn(x, s)), f"{fn.__name__}({s})"
    if kind == "where":
        inputs.append(_leaf(dt, tuple(cur.shape), seed))
        return (lambda x, o: torch.where(x > 0, x, o[k])), "where"
    if kind == "logical":
        inputs.append(_leaf(torch.bool, tuple(cur.shape), seed))
        fn = draw(st.sampled_from([torch.logical_and, torch.logical_or, torch.eq, torch.ne]))
        return (lambda x, o: fn(x, o[k])), fn.__name__
    # count: a bool sum is int64
    if rank == 0:
        return (lambda x, o: x.sum()), "count()"
    d = draw(st.integers(-rank, rank - 1))
    return (lambda x, o: x.sum(d)), f"count({d})"


@st.composite
def _op_chains(draw: st.DrawFn) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor], list[str]]:
    """A chain of 2-6 supported ops with its inputs; each step is checked on real tensors while drawing."""
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float32, torch.int64, torch.bool]))
    shape = tuple(draw(shapes(min_rank=1, max_rank=4, max_side=5)))
    inputs = [_leaf(dtype, shape, draw(seeds()))]
    steps: list[Step] = []
    labels: list[str] = []
    cur = inputs[0]
    target = draw(st.integers(2, 6))
    while len(steps) < target:
        drawn = _draw_step(draw, cur, inputs)
        if drawn is None:
            continue
        step, label = drawn
        cur = step(cur, tuple(inputs[1:]))
        steps.append(step)
        labels.append(label)

    def chain(x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
        for step in steps:
            x = step(x, others)
        return x

    return chain, inputs, labels


@settings(max_examples=40, deadline=None)
@given(case=_op_chains())
def test_generated_op_chains_match_eager(
    case: tuple[Callable[..., torch.Tensor], list[torch.Tensor], list[str]],
) -> None:
    """Random chains of supported ops on float32/int64/bool tensors take the fast path and match eager."""
    chain, inputs, labels = case
    ref = chain(*inputs)
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(chain, inputs, backend)
    assert len(backend.exported) <= 1, labels  # 0 when the chain is views of the input only
    assert all(e.exporter == "fast" for e in backend.exported)
    _assert_matches(out, ref, 1e-5)


@st.composite
def _conv_bn(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    k = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    # A string padding reaches ATen as one value for every spatial dim ("valid": [0]); "same" needs stride 1.
    padding: int | str = draw(st.sampled_from([0, 1, 2, "valid"] + (["same"] if stride == 1 else [])))
    conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=draw(st.booleans()))
    bn = nn.BatchNorm2d(cout, eps=draw(st.sampled_from([1e-5, 1e-3])), affine=draw(st.booleans()))
    gen = torch.Generator().manual_seed(draw(seeds()))
    for p in (*conv.parameters(), *bn.parameters()):
        p.copy_(torch.randn(p.shape, generator=gen))
    bn.running_mean.copy_(torch.randn(cout, generator=gen))
    bn.running_var.copy_(torch.rand(cout, generator=gen) * 2 + 0.05)
    layers = [conv, bn] + ([nn.ReLU()] if draw(st.booleans()) else [])
    pad = 0 if padding == "valid" else (dilation * (max(k) - 1) if padding == "same" else int(padding))
    reach = [dilation * (kk - 1) + 1 - 2 * pad for kk in k]  # smallest input giving one output
    size = [draw(st.integers(max(1, r), max(1, r) + 6)) for r in reach]
    x = torch.randn(draw(st.integers(1, 2)), cin, *size, generator=gen)
    return nn.Sequential(*layers).eval(), x


@settings(max_examples=25, deadline=None)
@given(case=_conv_bn())
def test_generated_conv_batchnorm_folds_and_matches(case: tuple[nn.Module, torch.Tensor]) -> None:
    """Random Conv2d configurations followed by an eval BatchNorm2d fold into one Conv that matches eager."""
    model, x = case
    exported = _check_fast(model, x)
    assert "BatchNormalization" not in _op_types(exported)


# --- QNN HTP simulator -------------------------------------------------------------------------


def test_fast_path_on_qnn_htp() -> None:
    """A Conv+BN+ReLU+Linear model exported by the fast path runs on the HTP simulator within fp16 error."""
    model, x = _seeded(_cnn), torch.randn(1, 3, 10, 10)
    ref = model(x)
    backend = Capture(qnn_session)
    out = compile_and_run(model, (x,), backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast"
    assert "BatchNormalization" not in _op_types(exported)
    assert rel_err(out, ref) <= 5e-3


def test_constant_gather_indices_are_made_non_negative() -> None:
    """QNN's Gather is not known to take negative indices: constant ones are normalized at export time."""
    import onnx

    exported = _check_fast(lambda x: x[:, torch.tensor([-1, 0, -3])] * 3, torch.randn(3, 6))
    model = exported.model
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    (gather,) = [n for n in model.graph.node if n.op_type == "Gather"]
    assert consts[gather.input[1]].tolist() == [5, 0, 3]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 4),
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
)
def test_unfold_and_fold_of_whole_patches_match_eager(
    n: int, c: int, kernel: tuple[int, int], grid: tuple[int, int]
) -> None:
    """F.unfold and F.fold with the kernel as the stride, over random batch, channels, kernels and patch grids, are
    translated (no torch.onnx fallback) and equal eager exactly: a layout change, no arithmetic."""
    size = (grid[0] * kernel[0], grid[1] * kernel[1])
    x = torch.randn(n, c, *size, generator=torch.Generator().manual_seed(n * 100 + c))

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cols = F.unfold(t, kernel, stride=kernel)
        return cols, F.fold(cols * 2 - 1, size, kernel, stride=kernel)

    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, (x,), backend)
    assert backend.exported[0].exporter == "fast"
    _assert_matches(out, fn(x), 0.0)


@st.composite
def _windows(draw: st.DrawFn) -> tuple[torch.Tensor, dict[str, tuple[int, int]]]:
    """An image (batched or not) and unfold parameters that give at least one window."""
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    reach = [d * (k - 1) + 1 - 2 * p for k, d, p in zip(kernel, dilation, padding, strict=True)]
    size = [draw(st.integers(max(1, r), max(1, r) + 8)) for r in reach]
    lead = [*draw(st.sampled_from([[], [1], [2]])), draw(st.integers(1, 3))]
    x = torch.randn(*lead, *size, generator=torch.Generator().manual_seed(draw(seeds())))
    return x, {"kernel_size": kernel, "dilation": dilation, "padding": padding, "stride": stride}


@settings(max_examples=40, deadline=None)
@given(case=_windows())
def test_unfold_of_any_windows_matches_eager_exactly(case: tuple[torch.Tensor, dict[str, tuple[int, int]]]) -> None:
    """F.unfold with overlapping, dilated, padded or strided windows, batched or not (ConvBERT's span convolution,
    local attention): the translator gathers every window's pixels from the zero-padded image (it declined these
    and torch.onnx's graph had rank-6 nodes QNN refuses), exactly eager's values."""
    x, params = case
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(lambda t: F.unfold(t, **params), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    _assert_matches(out, F.unfold(x, **params), 0.0)


def test_overlapping_unfold_runs_on_qnn_htp() -> None:
    """ConvBERT's unfold (a 9-row kernel over [1, 32, 12, 1] with padding 4): on the HTP simulator, CPU fallback
    off, equal to eager (data movement, no arithmetic)."""
    x = torch.randn(1, 32, 12, 1)
    close_on_qnn_fast(lambda t: F.unfold(t, (9, 1), padding=(4, 0)), x, tol=1e-3)


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    rows=st.integers(1, 6),
    cols=st.integers(1, 6),
    diagonal=st.integers(-7, 7),
    seed=seeds(),
)
def test_triu_and_tril_are_exact_selects(lead: list[int], rows: int, cols: int, diagonal: int, seed: int) -> None:
    """triu/tril of any rank >= 2, size and diagonal translate to a constant-mask Where (no Trilu, which QNN
    declines) equal to eager bit for bit, an inf outside the triangle included."""
    x = torch.randn(*lead, rows, cols, generator=torch.Generator().manual_seed(seed))
    x.view(-1)[seed % x.numel()] = float("inf")

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t.triu(diagonal), t.tril(diagonal)

    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, (x,), backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and "Trilu" not in _op_types(exported)
    for got, want in zip(out, fn(x), strict=True):
        assert torch.equal(got, want)


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.permutations([(3, 4), (4,), (3, 1), ()]),
    which=st.sampled_from(["both", "min", "max"]),
    seed=seeds(),
)
def test_clamp_with_tensor_bounds_matches_eager(shapes: list[tuple[int, ...]], which: str, seed: int) -> None:
    """clamp with tensor bounds of any broadcastable shapes (crossed bounds too) is Max/Min, no Clip (the QNN EP
    takes Clip's bounds only as constants), and equals eager exactly."""
    gen = torch.Generator().manual_seed(seed)
    x, lo, hi = (torch.randn(s, generator=gen) for s in shapes[:3])
    fns = {
        "both": lambda a, b, c: torch.clamp(a, b, c),
        "min": lambda a, b, c: torch.clamp_min(a, b) + c,
        "max": lambda a, b, c: torch.clamp_max(a, c) + b,
    }
    exported = _check_fast(fns[which], x, lo, hi, tol=0.0)
    assert "Clip" not in _op_types(exported)


def test_triangles_clamps_and_celu_run_on_qnn_htp() -> None:
    """triu/tril, clamp with tensor bounds and celu, as translated, run wholly on the HTP simulator (CPU fallback
    off) within fp16 error."""

    def fn(x: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
        return F.celu(x.triu(1) + x.tril(-1) * 0.5, 0.7).clamp(lo, lo + 1.5) + torch.clamp_max(x, lo)

    x, lo = torch.randn(2, 6, 6) * 2, torch.randn(6) * 0.3
    ref = fn(x, lo)
    backend = Capture(qnn_session)
    out = compile_and_run(fn, (x, lo), backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast"
    assert not _op_types(exported) & {"Trilu", "Clip", "Celu"}
    assert rel_err(out, ref) <= 5e-3


@settings(max_examples=25, deadline=None)
@given(
    size=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    out=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    batched=st.booleans(),
    seed=seeds(),
)
def test_adaptive_avg_pool_of_any_sizes_matches_eager(
    size: tuple[int, int], out: tuple[int, int], batched: bool, seed: int
) -> None:
    """AdaptiveAvgPool2d from any size to any size (uneven and overlapping windows, upsampling too) is translated
    (constant averaging matrices where no AveragePool fits, never torch.onnx's rank-6 Gathers) and matches eager."""
    x = torch.randn(*((2,) if batched else ()), 3, *size, generator=torch.Generator().manual_seed(seed))
    exported = _check_fast(lambda t: F.adaptive_avg_pool2d(t, out), x)
    assert "Gather" not in _op_types(exported)


def test_uneven_adaptive_avg_pool_runs_on_qnn_htp() -> None:
    """An adaptive average pool whose windows are uneven and overlap (7x5 -> 3x4) runs wholly on the HTP simulator
    (CPU fallback off) within fp16 error."""
    x = torch.randn(2, 3, 7, 5)
    ref = F.adaptive_avg_pool2d(x, (3, 4))
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t: F.adaptive_avg_pool2d(t, (3, 4)), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, ref) <= 5e-3


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(1, 4), min_size=1, max_size=5), data=st.data(), seed=seeds())
def test_gather_by_runtime_indices_matches_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """gather by runtime indices along any axis of a rank 1-5 tensor (unit dims, indices longer or shorter than the
    data) equals eager exactly; up to rank 4 the indices are clamped at 0 (Max), which qnnx-opcheck reads as
    non-negative."""
    axis = data.draw(st.integers(0, len(dims) - 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*dims, generator=gen)
    ishape = [data.draw(st.integers(1, d)) for d in dims]
    ishape[axis] = data.draw(st.integers(1, 5))
    index = torch.randint(0, dims[axis], ishape, generator=gen)
    exported = _check_fast(lambda t, i: torch.gather(t, axis, i), x, index, tol=0.0)
    assert ("Max" in _op_types(exported)) == (len(dims) <= 4)


def test_gather_by_runtime_indices_is_vouched_for_and_runs_on_qnn_htp() -> None:
    """gather by runtime indices is vouched for by qnnx-opcheck and runs wholly on the HTP simulator (CPU fallback
    off), picking the elements eager picks."""
    import qnnx_opcheck as oc

    x = torch.randn(3, 5, 4)
    index = torch.tensor([[[4, 0, 2, 1]] * 2] * 3)
    ref = torch.gather(x, 1, index)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t, i: torch.gather(t, 1, i), (x, index), backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast"
    assert oc.check_model(exported.model, "htp", onnxruntime_qnn="2.7.0", soc_model=60).supported
    assert rel_err(out, ref) <= 2e-3


@settings(max_examples=25, deadline=None)
@given(
    alpha=st.sampled_from([1.0, 0.0, -1.5, 0.6]),
    beta=st.sampled_from([1.0, 0.0, 2.0, -0.3]),
    bias_shape=st.sampled_from([(3, 4), (4,), (1,), (3, 1)]),
    seed=seeds(),
)
def test_addmm_with_any_scales_matches_eager(alpha: float, beta: float, bias_shape: tuple[int, ...], seed: int) -> None:
    """addmm with any alpha and beta is one Gemm with alpha 1 and beta 0 or 1 (all the QNN EP takes) and Muls, and
    matches eager; with beta 0 a NaN in the bias does not reach the output, as in PyTorch."""
    gen = torch.Generator().manual_seed(seed)
    bias, a, b = (
        torch.randn(bias_shape, generator=gen),
        torch.randn(3, 5, generator=gen),
        torch.randn(5, 4, generator=gen),
    )
    if beta == 0:
        bias[0] = float("nan")
    exported = _check_fast(lambda c, x, y: torch.addmm(c, x, y, beta=beta, alpha=alpha), bias, a, b)
    for gemm in (n for n in exported.model.graph.node if n.op_type == "Gemm"):
        attrs = {a.name: a for a in gemm.attribute}
        assert "alpha" not in attrs and ("beta" not in attrs), gemm


@pytest.mark.parametrize(
    ("product", "shapes", "beta", "alpha"),
    [
        (torch.addmm, ((3, 4), (3, 5), (5, 4)), 0.5, -2.0),
        (torch.baddbmm, ((4, 1, 6), (4, 3, 8), (4, 8, 6)), 0.5, 0.125),  # BLOOM's scores plus ALiBi
    ],
    ids=["addmm", "baddbmm"],
)
def test_scaled_matrix_products_run_on_qnn_htp(
    product: Callable[..., torch.Tensor], shapes: tuple[tuple[int, ...], ...], beta: float, alpha: float
) -> None:
    """addmm and baddbmm with alpha and beta other than 1 run wholly on the HTP simulator (CPU fallback off) within
    fp16 error."""
    bias, a, b = (torch.randn(*s) for s in shapes)
    ref = product(bias, a, b, beta=beta, alpha=alpha)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda c, x, y: product(c, x, y, beta=beta, alpha=alpha), (bias, a, b), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, ref) <= 5e-3


@settings(max_examples=15, deadline=None)
@given(
    dims=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    data=st.data(),
    seed=seeds(),
)
def test_index_with_several_runtime_index_tensors_matches_eager(
    dims: list[int], data: st.DataObject, seed: int
) -> None:
    """x[..., i1, i2, ...] with two or more adjacent runtime index tensors (broadcast against each other, negative
    indices included) is one Gather over the merged axes and matches eager exactly."""
    k = data.draw(st.integers(2, len(dims)))
    p = data.draw(st.integers(0, len(dims) - k))
    gen = torch.Generator().manual_seed(seed)
    idx_shapes = [data.draw(st.sampled_from([(3,), (1,), (2, 1), (2, 3)])) for _ in range(k)]
    assume(all(torch.broadcast_shapes(*idx_shapes)))
    indices = [torch.randint(-d, d, s, generator=gen) for d, s in zip(dims[p : p + k], idx_shapes, strict=True)]
    x = torch.randn(*dims, generator=gen)
    lead = (slice(None),) * p

    def fn(t: torch.Tensor, *idx: torch.Tensor) -> torch.Tensor:
        return t[(*lead, *idx)]

    exported = _check_fast(fn, x, *indices, tol=0.0)
    assert "Gather" in _op_types(exported)


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(), seed=seeds())
def test_roll_over_any_dims_and_shifts_is_exact_data_movement(dims: list[int], data: st.DataObject, seed: int) -> None:
    """torch.roll by any shifts (negative, zero, beyond the size) over any dims, or of the flattened tensor, is Slices
    and Concats equal to eager bit for bit."""
    x = torch.randn(*dims, generator=torch.Generator().manual_seed(seed))
    axes = data.draw(st.lists(st.integers(-len(dims), len(dims) - 1), max_size=len(dims), unique=True))
    shifts = data.draw(st.lists(st.integers(-7, 7), min_size=max(1, len(axes)), max_size=max(1, len(axes))))
    exported = _check_fast(lambda t: torch.roll(t, shifts, axes), x, tol=0.0)
    assert "Add" not in _op_types(exported) and "Mul" not in _op_types(exported)


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 4), min_size=2, max_size=4), data=st.data(), seed=seeds())
def test_index_put_after_skipped_dims_matches_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """x[:, ..., i1, i2] = v (index tensors after skipped leading dims, runtime or constant, negatives included,
    values broadcast) is a ScatterND on x transposed so the indexed dims lead, and matches eager exactly."""
    lead = data.draw(st.integers(1, len(dims) - 1))
    k = data.draw(st.integers(1, len(dims) - lead))
    gen = torch.Generator().manual_seed(seed)
    # distinct positions: duplicate writes are undefined in PyTorch
    picks = [
        torch.randperm(d, generator=gen)[: min(d, 2)] - d * int(data.draw(st.booleans())) for d in dims[lead : lead + k]
    ]
    n = min(len(p) for p in picks)
    indices = [p[:n] for p in picks]
    result = (*dims[:lead], n, *dims[lead + k :])
    v_shape = data.draw(st.sampled_from([result, result[-1:], (1,) * len(result)]))
    x, v = torch.randn(*dims, generator=gen), torch.randn(*v_shape, generator=gen)
    skip = (slice(None),) * lead

    def fn(t: torch.Tensor, vals: torch.Tensor, *idx: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[(*skip, *idx)] = vals
        return t

    exported = _check_fast(fn, x, v, *indices, tol=0.0)
    assert "ScatterND" in _op_types(exported)


def test_boolean_mask_writes_as_where_or_decline() -> None:
    """``ids[ids == k] = 0`` and ``embeds[ids == k] = row`` (Granite Speech's and T5Gemma2's writes) are a Where
    equal to eager; values with one row per selected position (a count known only at run time) decline."""
    ids, embeds, row = torch.tensor([[5, 1, 5, 2]]), torch.randn(1, 4, 3), torch.randn(3)

    def ids_fn(i: torch.Tensor) -> torch.Tensor:
        i = i.clone()
        i[i == 5] = 0
        return i

    def embeds_fn(e: torch.Tensor, i: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        e = e.clone()
        e[i == 5] = r
        return e

    assert "Where" in _op_types(_check_fast(ids_fn, ids, tol=0.0))
    assert "Where" in _op_types(_check_fast(embeds_fn, embeds, ids, row, tol=0.0))
    rows = torch.randn(2, 3)  # one row per selected position

    def rows_fn(e: torch.Tensor, m: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        e = e.clone()
        e[m] = r
        return e

    mask = torch.tensor([[True, False, True, False]])
    backend = Capture(cpu_session)
    out = compile_and_run(rows_fn, (embeds, mask, rows), backend)
    assert "one value per selected position" in (backend.exported[0].fast_path_declined or "")
    assert torch.equal(out, rows_fn(embeds, mask, rows))


def test_pooled_mean_restrided_in_place_translates() -> None:
    """adaptive_avg_pool2d to 1x1 of a tensor that looks channels-last (Hiera's pooler: a transpose before it)
    restrides its mean in place (as_strided_): a Reshape-free translation equal to eager; an as_strided that
    reorders the elements declines."""
    x = torch.randn(2, 5, 4)

    def pooled(t: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(t.transpose(1, 2).unsqueeze(-1).transpose(1, 3).transpose(2, 3), 1)

    _check_fast(pooled, x, tol=1e-6)
    backend = Capture(cpu_session)
    out = compile_and_run(lambda t: torch.as_strided(t, (4, 5), (1, 4)), (x[0],), backend)
    assert "reorders" in (backend.exported[0].fast_path_declined or "")
    assert torch.equal(out, torch.as_strided(x[0], (4, 5), (1, 4)))


def test_sliding_window_row_write_runs_on_qnn_htp() -> None:
    """A sliding window's write of its last row (``rolled[:, :, tensor([-1])] = k``, transformers' form) runs wholly
    on the HTP simulator (CPU fallback off) and equals eager."""
    keys, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 1, 4)

    def fn(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        rolled = cache.roll(-1, dims=-2)
        rolled[:, :, torch.tensor([-1])] = new
        return rolled

    backend = Capture(qnn_session)
    out = compile_and_run(fn, (keys, k), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, fn(keys, k)) <= 1e-3


@pytest.mark.parametrize("beta", [1.0, 0.5, 3.0])
def test_softplus_runs_on_qnn_htp_within_fp16(beta: float) -> None:
    """softplus with any beta over [-30, 30] (its threshold included) runs wholly on the HTP simulator (CPU fallback
    off) in the overflow-free form, within fp16 error of eager."""
    x = torch.linspace(-30, 30, 601)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t: F.softplus(t, beta=beta), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    ref = F.softplus(x, beta=beta)
    assert (out - ref).abs().max() <= 3e-3 * ref.abs().max() + 1e-3


def test_expm1_runs_on_qnn_htp_within_fp16() -> None:
    """expm1 over [-6, 3] (xIELU's range) runs wholly on the HTP simulator (CPU fallback off) within the fp16 error
    of values of its scale."""
    x = torch.linspace(-6, 3, 301)
    backend = Capture(qnn_session)
    out = compile_and_run(torch.expm1, (x,), backend)
    assert backend.exported[0].exporter == "fast"
    assert (out - torch.expm1(x)).abs().max() <= 2e-3 * torch.expm1(x).abs().max()


def test_padding_mask_read_with_runtime_indices_runs_on_qnn_htp() -> None:
    """transformers' padding-mask read ``mask[batch_idx, kv_idx]`` with runtime index tensors runs wholly on the HTP
    simulator (CPU fallback off) and equals eager."""
    mask = torch.rand(2, 16) > 0.3
    b = torch.arange(2).view(2, 1, 1, 1)
    kv = torch.arange(16).view(1, 1, 1, 16)

    def fn(m: torch.Tensor, bi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return m[bi, ki + 0] & m[bi, ki - 16]

    ref = fn(mask, b, kv)
    backend = Capture(qnn_session)
    out = compile_and_run(fn, (mask, b, kv), backend)
    assert backend.exported[0].exporter == "fast"
    assert torch.equal(out, ref)


@settings(max_examples=12, deadline=None)
@given(
    alpha=st.sampled_from([1.0, 0.0, 0.125, -2.0]),
    beta=st.sampled_from([1.0, 0.0, 0.5, -1.0]),
    bias_shape=st.sampled_from([(2, 3, 4), (2, 1, 4), (1, 3, 1), (4,)]),
    seed=seeds(),
)
def test_baddbmm_with_any_scales_matches_eager(
    alpha: float, beta: float, bias_shape: tuple[int, ...], seed: int
) -> None:
    """baddbmm (BLOOM's scores plus ALiBi) with any alpha, beta and broadcast bias is translated directly and matches
    eager; with beta 0 a NaN in the bias does not reach the output, as in PyTorch."""
    gen = torch.Generator().manual_seed(seed)
    bias, a, b = (
        torch.randn(bias_shape, generator=gen),
        torch.randn(2, 3, 5, generator=gen),
        torch.randn(2, 5, 4, generator=gen),
    )
    if beta == 0:
        bias.view(-1)[0] = float("nan")
    exported = _check_fast(lambda c, x, y: torch.baddbmm(c, x, y, beta=beta, alpha=alpha), bias, a, b)
    assert "MatMul" in _op_types(exported)


@settings(max_examples=10, deadline=None)
@given(
    dims=st.lists(st.integers(1, 4), min_size=2, max_size=5),
    data=st.data(),
    seed=seeds(),
)
def test_replicate_pad_of_any_widths_is_exact_data_movement(dims: list[int], data: st.DataObject, seed: int) -> None:
    """F.pad(mode="replicate") over 1-3 trailing dims, any widths (negative, zero and wider than the dim included),
    is Gathers by constant indices (no Pad, whose edge mode QNN HTP computes wrongly) equal to eager bit for bit."""
    # PyTorch pads the last rank-1 or rank-2 dims (1 to 3 of them) in this mode.
    padded = data.draw(st.sampled_from([p for p in (len(dims) - 2, len(dims) - 1) if 1 <= p <= 3]))
    pad = data.draw(st.lists(st.integers(-5, 5), min_size=2 * padded, max_size=2 * padded))
    x = torch.randn(*dims, generator=torch.Generator().manual_seed(seed))
    trailing = dims[::-1][:padded]
    assume(all(d + a + b > 0 for d, a, b in zip(trailing, pad[::2], pad[1::2], strict=True)))
    exported = _check_fast(lambda t: F.pad(t, pad, mode="replicate"), x, tol=0.0)
    assert "Pad" not in _op_types(exported)


def test_replicate_pad_runs_on_qnn_htp() -> None:
    """A 2-D replicate pad (a negative width too) runs wholly on the HTP simulator (CPU fallback off) and equals eager within fp16
    rounding."""
    x = torch.randn(1, 2, 3, 4)
    ref = F.pad(x, (1, -2, 3, 0), mode="replicate")
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t: F.pad(t, (1, -2, 3, 0), mode="replicate"), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, ref) <= 1e-3


@pytest.mark.parametrize(
    "fn",
    [lambda x, i: x.index_select(0, i), lambda x, i: x.index_copy(0, i, x * 2)],
    ids=["index_select", "index_copy"],
)
def test_index_ops_on_a_scalar_are_declined_not_a_failed_export(fn: Callable[..., Any]) -> None:
    """index_select and index_copy of a scalar (dim 0, index [0]) decline the direct translation (there is no axis
    to index) instead of failing the export with an IndexError; torch.onnx's graph equals eager."""
    x, i = torch.tensor(1.5), torch.tensor([0])
    backend = Capture(cpu_session)
    out = compile_and_run(fn, (x, i), backend)
    (exported,) = backend.exported
    assert exported.exporter == "torch.onnx" and "scalar" in (exported.fast_path_declined or "")
    assert torch.equal(out, fn(x, i))


@settings(max_examples=10, deadline=None)
@given(rank=st.integers(0, 3), seed=seeds())
def test_index_select_of_any_rank_matches_eager(rank: int, seed: int) -> None:
    """index_select along dim 0 of a tensor of any rank (a scalar included) by runtime indices equals eager."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn([3] * rank, generator=gen)
    i = torch.randint(0, 3, (2,), generator=gen) if rank else torch.tensor([0])
    backend = Capture(cpu_session)
    out = compile_and_run(lambda t, j: t.index_select(0, j), (x, i), backend)
    assert torch.equal(out, x.index_select(0, i))


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 6), max_size=4), data=st.data(), seed=seeds())
def test_cumprod_along_any_axis_matches_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """cumprod along any axis of a rank 0-4 tensor (unit dims included) is a chain of Muls over prefixes and equals
    eager within float32 rounding, zeros and signs included."""
    dim = data.draw(st.integers(-1, len(dims) - 1)) if dims else 0
    x = torch.randn(dims, generator=torch.Generator().manual_seed(seed)) * 1.5
    if x.numel() > 2:
        x.view(-1)[1] = 0.0
    _check_fast(lambda t: torch.cumprod(t, dim), x, tol=1e-5)


def test_cumprod_runs_on_qnn_htp() -> None:
    """cumprod along an inner axis runs wholly on the HTP simulator (CPU fallback off) within fp16 error."""
    x = torch.rand(2, 6, 3) + 0.5
    ref = torch.cumprod(x, 1)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t: torch.cumprod(t, 1), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, ref) <= 5e-3


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 6), max_size=4), data=st.data(), seed=seeds())
def test_logcumsumexp_along_any_axis_matches_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """logcumsumexp along any axis of a rank 0-4 tensor with values spread over [-50, 50] is the running maximum
    plus the log of a masked sum of exponentials and equals eager within float32 rounding."""
    dim = data.draw(st.integers(-1, len(dims) - 1)) if dims else 0
    x = torch.rand(dims, generator=torch.Generator().manual_seed(seed)) * 100 - 50
    _check_fast(lambda t: torch.logcumsumexp(t, dim), x, tol=1e-5)


def test_logcumsumexp_over_a_large_spread_runs_on_qnn_htp() -> None:
    """logcumsumexp of values uniform in [-50, 50] runs wholly on the HTP simulator within fp16 error at every
    position (subtracting the axis' maximum, as torch.onnx does, left early positions 1.4-3.1% off); an axis longer
    than the bound is declined."""
    x = torch.rand(3, 40, 5, generator=torch.Generator().manual_seed(1)) * 100 - 50
    ref = torch.logcumsumexp(x, 1)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda t: torch.logcumsumexp(t, 1), (x,), backend)
    assert backend.exported[0].exporter == "fast"
    assert ((out - ref).abs() / ref.abs().max()).max() <= 2e-3
    from qnnx_export._fast._ops_scan import MAX_SCAN_LENGTH

    long = Capture(cpu_session)
    compile_and_run(lambda t: torch.logcumsumexp(t, 0), (torch.randn(MAX_SCAN_LENGTH + 1),), long)
    assert long.exported[0].exporter == "torch.onnx"
    assert "logcumsumexp" in (long.exported[0].fast_path_declined or "")


def _with_nans(shape: list[int], seed: int, scale: float = 1.0) -> torch.Tensor:
    """Gaussian values times ``scale`` with about a third of them NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    return x.masked_fill(torch.rand(shape, generator=g) < 0.3, float("nan"))


@settings(max_examples=20, deadline=None)
@given(a=st.lists(st.integers(1, 4), max_size=3), b=st.lists(st.integers(1, 4), max_size=3), seed=seeds())
def test_fmax_fmin_ignore_nans_like_eager(a: list[int], b: list[int], seed: int) -> None:
    """fmax and fmin of broadcast operands with NaNs give the other operand where one is NaN and NaN only where
    both are, exactly as eager (on ONNX Runtime's CPU EP)."""
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return
    x, y = _with_nans(a, seed), _with_nans(b, seed + 1)
    for fn in (torch.fmax, torch.fmin):
        ref = fn(x, y)
        out = compile_and_run(fn, (x, y), Capture(cpu_session, FAST))
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out[~ref.isnan()], ref[~ref.isnan()])


@settings(max_examples=20, deadline=None)
@given(a=st.lists(st.integers(1, 4), max_size=3), seed=seeds(), scale=st.sampled_from([1e-3, 1.0, 1e3, 3e4]))
def test_hypot_matches_eager_at_any_scale(a: list[int], seed: int, scale: float) -> None:
    """hypot (scaled by the larger magnitude, zeros included) equals eager from 1e-3 to 3e4, where the plain sum
    of squares would overflow float16."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(a, generator=g) * scale, torch.randn(a, generator=g) * scale
    if x.numel():
        x.view(-1)[0], y.view(-1)[0] = 0.0, 0.0
    _check_fast(torch.hypot, x, y, tol=1e-6)


def test_fmax_and_hypot_run_on_qnn_htp() -> None:
    """fmax with a NaN in one operand gives the other on the HTP simulator, and hypot of values up to 2000 stays
    within fp16 error (a sum of squares would saturate at 65504)."""
    nan = float("nan")
    x, y = torch.tensor([1.0, nan, -2.0, 0.5]), torch.tensor([nan, 3.0, -1.0, -0.5])
    backend = Capture(qnn_session)
    out = compile_and_run(torch.fmax, (x, y), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, torch.tensor([1.0, 3.0, -1.0, 0.5])) <= 2e-3
    a, b = torch.tensor([300.0, 1000.0, 0.0, -3.0]), torch.tensor([400.0, -2000.0, 0.0, 4.0])
    assert rel_err(compile_and_run(torch.hypot, (a, b), Capture(qnn_session)), torch.hypot(a, b)) <= 2e-3


@settings(max_examples=30, deadline=None)
@given(
    dims=st.lists(st.integers(1, 5), max_size=3),
    data=st.data(),
    seed=seeds(),
    reduce=st.sampled_from(["mean", "amax", "amin"]),
    include_self=st.booleans(),
)
def test_index_reduce_matches_eager(
    dims: list[int], data: st.DataObject, seed: int, reduce: str, include_self: bool
) -> None:
    """index_reduce (mean, amax, amin; with or without the input's own values) along any axis of a rank 0-3
    tensor, with repeated and missing indices, equals eager: matched rows reduce the source, the others keep their
    values."""
    g = torch.Generator().manual_seed(seed)
    dim = data.draw(st.integers(-max(len(dims), 1), max(len(dims), 1) - 1))
    x = torch.randn(dims, generator=g)
    rows = dims[dim] if dims else 1
    k = data.draw(st.integers(1, 6))
    index = torch.randint(0, rows, (k,), generator=g)
    source_shape = list(dims)
    if dims:
        source_shape[dim] = k
    source = torch.randn(source_shape, generator=g) if dims else torch.randn((), generator=g)
    if not dims and k != 1:
        return  # a 0-d input takes one index
    _check_fast(lambda a, i, s: a.index_reduce(dim, i, s, reduce, include_self=include_self), x, index, source)


def test_index_reduce_runs_on_qnn_htp_and_declines_prod() -> None:
    """index_reduce's amax with repeated indices runs wholly on the HTP simulator; prod is left to PyTorch's
    exporters (the translator declines it, naming the reason)."""
    x, index, source = torch.randn(6, 4), torch.tensor([0, 2, 2, 5, 0]), torch.randn(5, 4)
    backend = Capture(qnn_session)
    out = compile_and_run(lambda a, i, s: a.index_reduce(0, i, s, "amax"), (x, index, source), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, x.index_reduce(0, index, source, "amax")) <= 2e-3
    cap = only(capture(lambda a, i, s: a.index_reduce(0, i, s, "prod"), x, index, source)[0])
    with pytest.raises(ExportError, match="prod"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


@settings(max_examples=30, deadline=None)
@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
    seed=seeds(),
    reduce=st.sampled_from(["sum", "mean", "amax", "amin"]),
    include_self=st.booleans(),
)
def test_scatter_reduce_matches_eager(
    dims: list[int], data: st.DataObject, seed: int, reduce: str, include_self: bool
) -> None:
    """scatter_reduce (sum, mean, amax, amin; with or without the input's own values) along any axis of a rank 1-3
    tensor, with an index smaller than the input and the source, repeated and missing positions, equals eager."""
    g = torch.Generator().manual_seed(seed)
    dim = data.draw(st.integers(-len(dims), len(dims) - 1))
    index_shape = [
        data.draw(st.integers(1, d + 1)) if i == dim % len(dims) else data.draw(st.integers(1, d))
        for i, d in enumerate(dims)
    ]
    source_shape = [s + data.draw(st.integers(0, 1)) for s in index_shape]
    x, source = torch.randn(dims, generator=g), torch.randn(source_shape, generator=g)
    index = torch.randint(0, dims[dim], index_shape, generator=g)
    _check_fast(lambda a, i, s: a.scatter_reduce(dim, i, s, reduce, include_self=include_self), x, index, source)


def test_scatter_add_runs_on_qnn_htp_and_declines_products() -> None:
    """scatter_add along the last axis with an index narrower than the input runs wholly on the HTP simulator;
    scatter with reduce="multiply" is left to PyTorch's exporters (named)."""
    g = torch.Generator().manual_seed(0)
    x, source, index = (
        torch.randn(10, 5, generator=g),
        torch.randn(5, 5, generator=g),
        torch.randint(0, 5, (3, 2), generator=g),
    )
    backend = Capture(qnn_session)
    out = compile_and_run(lambda a, i, s: a.scatter_add(-1, i, s), (x, index, source), backend)
    assert backend.exported[0].exporter == "fast"
    assert rel_err(out, x.scatter_add(-1, index, source)) <= 2e-3
    cap = only(capture(lambda a, i, s: a.scatter(0, i, s, reduce="multiply"), x, index, source)[0])
    with pytest.raises(ExportError, match="multiply"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


@settings(max_examples=20, deadline=None)
@given(dims=st.lists(st.integers(1, 6), max_size=3), data=st.data(), seed=seeds())
def test_median_values_match_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """median over every element, and its values along any axis (keepdim or not), of a rank 0-3 tensor with
    repeated values equal eager exactly (the lower median of an even count)."""
    x = torch.randint(-3, 4, dims, generator=torch.Generator().manual_seed(seed)).float()
    dim = data.draw(st.integers(-max(len(dims), 1), max(len(dims), 1) - 1))
    keepdim = data.draw(st.booleans())
    _check_fast(lambda t: (torch.median(t), torch.median(t, dim, keepdim=keepdim).values * 1), x, tol=0.0)


def test_median_indices_decline_unless_one_position() -> None:
    """median(x, dim)'s indices are left to PyTorch's exporters (float16 can make distinct values equal on HTP),
    except along an axis of one position, where they are 0; nanmedian of several values is declined too."""
    cap = only(capture(lambda t: torch.median(t, 1), torch.randn(3, 4))[0])
    with pytest.raises(ExportError, match="indices"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)
    cap = only(capture(lambda t: torch.nanmedian(t), torch.randn(3, 4))[0])
    with pytest.raises(ExportError, match="NaN"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)
    _check_fast(lambda t: torch.median(t, 1), torch.randn(3, 1, 2), tol=0.0)
    _check_fast(lambda t: torch.nanmedian(t, 0, keepdim=True), torch.tensor(2.5), tol=0.0)


@settings(max_examples=15, deadline=None)
@given(dims=st.lists(st.integers(1, 5), max_size=4), data=st.data(), seed=seeds())
def test_aminmax_over_any_axis_or_all_matches_eager(dims: list[int], data: st.DataObject, seed: int) -> None:
    """aminmax over one axis (keepdim or not) or over every axis of a rank 0-4 tensor equals eager exactly."""
    dim = data.draw(st.one_of(st.none(), st.integers(-len(dims), len(dims) - 1))) if dims else None
    keepdim = data.draw(st.booleans())
    x = torch.randn(dims, generator=torch.Generator().manual_seed(seed))
    kwargs: dict[str, Any] = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    _check_fast(lambda t: tuple(torch.aminmax(t, **kwargs)), x, tol=0.0)


@settings(max_examples=25, deadline=None)
@given(features=st.integers(1, 9), out=st.integers(1, 9), bias=st.booleans(), seed=seeds())
def test_a_linear_of_an_unbatched_input_is_translated(features: int, out: int, bias: bool, seed: int) -> None:
    """nn.Linear of a 1-d input (ATen writes it ``mm(x.unsqueeze(0), w.t()).squeeze_(0)``, an in-place view of the
    product) is translated, with eager's values on the CPU EP, and a cross-entropy over its logits too."""
    torch.manual_seed(seed)
    lin = nn.Linear(features, out, bias=bias).eval()
    x = torch.randn(features)
    fn = lambda v: (lin(v), F.cross_entropy(lin(v), torch.tensor(out - 1)))  # noqa: E731
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, (x,), backend)  # type: ignore[arg-type]  # a function of one tensor
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    for g, r in zip(got, fn(x), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_an_in_place_view_of_an_argument_is_declined() -> None:
    """``squeeze_`` of the graph's own argument (an ATen graph Dynamo would not hand over: it applies such changes
    itself) would change the caller's tensor: the translator declines it, naming the argument."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from qnnx_export import _fast

    gm = torch.fx.symbolic_trace(lambda v: (torch.ops.aten.squeeze_.dim(v, 0),))
    FakeTensorProp(gm, FakeTensorMode()).propagate(torch.randn(1, 4))
    (name,) = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    with pytest.raises(_fast.Declined, match=f"argument {name}"):
        _fast.translate_aten(gm, {}, user_inputs=[(name, 0)], opset=qe.ExportOptions().opset)
