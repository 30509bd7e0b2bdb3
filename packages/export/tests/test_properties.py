"""Property tests: generated MLP/CNN/attention graphs export, agree with eager on ORT CPU, deterministically."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn
from export_capture import capture, only
from export_qnn_helpers import cpu_session, rel_err, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_testkit.strategies import seeds, shapes


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode for every property (grad-enabled graphs are refused by design)."""
    with torch.no_grad():
        yield


ACTS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "silu": nn.SiLU}


@st.composite
def mlps(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    widths = draw(st.lists(st.integers(1, 24), min_size=2, max_size=4))
    acts = [draw(st.sampled_from(sorted(ACTS))) for _ in widths[1:]]
    layers: list[nn.Module] = []
    for (a, b), act in zip(itertools.pairwise(widths), acts, strict=True):
        layers += [nn.Linear(a, b, bias=draw(st.booleans())), ACTS[act]()]
    torch.manual_seed(draw(seeds()))
    model = nn.Sequential(*layers[:-1]).eval()
    return model, torch.randn(draw(st.integers(1, 3)), widths[0])


@st.composite
def cnns(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    cin, cout = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    k = draw(st.sampled_from([1, 3]))
    size = draw(st.integers(k + 1, 9))
    torch.manual_seed(draw(seeds()))
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, padding=draw(st.integers(0, 1)))]
    if draw(st.booleans()):
        bn = nn.BatchNorm2d(cout)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        layers.append(bn)
    layers.append(ACTS[draw(st.sampled_from(sorted(ACTS)))]())
    if draw(st.booleans()):
        layers.append(nn.MaxPool2d(2) if size >= 4 else nn.Identity())
    model = nn.Sequential(*layers).eval()
    return model, torch.randn(draw(st.integers(1, 2)), cin, size, size)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.norm(x + self.out(y.transpose(1, 2).reshape(b, s, d)))


@st.composite
def attentions(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    heads = draw(st.sampled_from([1, 2, 4]))
    dim = heads * draw(st.sampled_from([2, 4, 8]))
    torch.manual_seed(draw(seeds()))
    model = _Attention(dim, heads, draw(st.booleans())).eval()
    return model, torch.randn(draw(st.integers(1, 3)), draw(st.integers(1, 6)), dim)


def _check(model: nn.Module, x: torch.Tensor) -> None:
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    out = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    ref = model(x)
    assert out[0].shape == ref.shape and out[0].dtype == ref.dtype
    assert rel_err(out[0], ref) < 1e-4
    again = qe.export(cap.gm, cap.example_inputs)
    assert again.model_bytes() == exported.model_bytes()


@settings(max_examples=6)
@given(case=mlps())
def test_generated_mlps_match_eager(case: tuple[nn.Module, torch.Tensor]) -> None:
    """Generated MLPs export, agree with eager on ORT CPU and export byte-identically twice."""
    _check(*case)


@settings(max_examples=6)
@given(case=cnns())
def test_generated_cnns_match_eager(case: tuple[nn.Module, torch.Tensor]) -> None:
    """Generated Conv/BN/activation/pool stacks export and agree with eager on ORT CPU."""
    _check(*case)


@settings(max_examples=6)
@given(case=attentions())
def test_generated_attention_matches_eager(case: tuple[nn.Module, torch.Tensor]) -> None:
    """Generated attention blocks (SDPA, causal or not, LayerNorm) export and agree with eager."""
    _check(*case)


@settings(max_examples=8)
@given(data=st.data())
def test_signature_round_trip_property(data: st.DataObject) -> None:
    """Any signature built from generated specs survives to_dict/from_dict unchanged."""
    n_in = data.draw(st.integers(0, 3))
    inputs = tuple(
        qe.InputSpec(
            name=f"in{i}",
            arg_index=data.draw(st.integers(0, 20)),
            dtype=data.draw(st.sampled_from(["float32", "int64", "bool"])),
            onnx_dtype=data.draw(st.sampled_from(["float32", "int32", "bool"])),
            shape=tuple(data.draw(shapes(max_rank=4, min_side=0, max_side=5))),
            onnx_shape=data.draw(st.none() | shapes(max_rank=4, min_side=1, max_side=5).map(tuple)),
        )
        for i in range(n_in)
    )
    slot = st.one_of(
        st.builds(
            qe.OutputSlot,
            kind=st.just("onnx"),
            index=st.integers(0, 3),
            dtype=st.sampled_from(["float32", "int64"]),
            shape=st.none() | shapes(min_rank=5, max_rank=6, max_side=3).map(tuple),
        ),
        st.builds(qe.OutputSlot, kind=st.just("arg"), index=st.integers(0, 9)),
        st.builds(qe.OutputSlot, kind=st.just("none")),
        st.builds(qe.OutputSlot, kind=st.just("constant"), value=st.one_of(st.integers(), st.booleans(), st.none())),
    )
    sig = qe.GraphSignature(
        inputs=inputs,
        outputs=tuple(data.draw(st.lists(slot, max_size=5))),
        onnx_output_names=("a", "b", "c", "d"),
        onnx_output_dtypes=("float32",) * 4,
        output_container=data.draw(st.sampled_from(["tuple", "list", "single"])),
        writebacks=data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=2)),
        row_writebacks=data.draw(st.lists(_row_writebacks(), max_size=2)),
    )
    assert qe.GraphSignature.from_dict(sig.to_dict()) == sig


def _row_writebacks() -> st.SearchStrategy[qe.RowWriteback]:
    """Row write-backs whose positions come from an ONNX output or from an argument, never both."""
    where = {"arg_index": st.integers(0, 9), "dim": st.integers(0, 3), "values": st.integers(0, 3)}
    positions = st.sampled_from([{"index": 2}, {"index_arg": 7}])
    return st.builds(lambda w, p: qe.RowWriteback(**w, **p), st.fixed_dictionaries(where), positions)


@given(
    written=st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True),
    dim=st.integers(0, 1),
    positions_from_argument=st.booleans(),
)
def test_row_writeback_leaves_the_tensor_as_index_copy_does(
    written: list[int], dim: int, positions_from_argument: bool
) -> None:
    """Property: applying a row write-back (rows as a numpy output, positions from an output or an argument)
    leaves the target exactly as eager's ``index_copy_``; positions a pass legalized to int32 work too."""
    size = max(written) + 1
    shape = [size, 3] if dim == 0 else [3, size]
    target = torch.arange(float(size * 3)).reshape(shape)
    expected = target.clone()
    index = torch.tensor(written)
    new_shape = list(shape)
    new_shape[dim] = len(written)
    new = -torch.arange(float(len(written) * 3)).reshape(new_shape)
    expected.index_copy_(dim, index, new)
    outputs = [new.numpy(), index.to(torch.int32).numpy()]
    if positions_from_argument:
        row = qe.RowWriteback(arg_index=0, dim=dim, values=0, index_arg=1)
        row.apply(target, outputs, [target, index])
    else:
        row = qe.RowWriteback(arg_index=0, dim=dim, values=0, index=1)
        row.apply(target, outputs, [target])
    assert torch.equal(target, expected)


def test_row_writeback_needs_exactly_one_source_of_positions() -> None:
    with pytest.raises(qe.errors.SignatureError, match="exactly one"):
        qe.RowWriteback(arg_index=0, dim=0, values=0, index=1, index_arg=2)
    with pytest.raises(qe.errors.SignatureError, match="exactly one"):
        qe.RowWriteback(arg_index=0, dim=0, values=0)
