"""float_pad_ends_as_concat: a float Pad HTP fills wrongly, written as constant blocks joined on with Concat."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

import qnnx_export as qe
from qnnx_clikit import htp_pads_wrongly
from qnnx_export._passes import run_passes

_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _pad_model(shape: tuple[int, ...], begin: list[int], end: list[int], value: float, dtype: int):
    """y = Pad(x, begin + end, value), mode constant, every input but x a constant."""
    out = tuple(n + b + e for n, b, e in zip(shape, begin, end, strict=True))
    inits = {"pads": np.array(begin + end, np.int64), "value": np.array(value, _NP[dtype])}
    nodes = [h.make_node("Pad", ["x", "pads", "value"], ["y"], mode="constant")]
    return make_model(nodes, [("x", dtype, shape)], [("y", dtype, out)], inits)


@settings(max_examples=60)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=5).map(tuple),
    dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]),
    value=st.sampled_from([0.0, 0.5, -3.25, 1e4]),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_the_rewrite_pads_as_the_pad_does(shape, dtype, value, data, seed) -> None:
    """For any rank 1-5, pads of 0-3 before and after each axis and any pad value: the pass rewrites exactly the
    Pads ``htp_pads_wrongly`` names (no Pad left), leaves the others alone, and the graph gives the CPU EP's Pad
    bit for bit."""
    rank = len(shape)
    begin = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank), label="begin")
    end = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank), label="end")
    model = _pad_model(shape, begin, end, value, dtype)
    x = np.random.default_rng(seed).standard_normal(shape).astype(_NP[dtype])
    (want,) = cpu_session(model.SerializeToString()).run(None, {"x": x})
    m = to_ir(model)
    [(_, changed)] = run_passes(m, ("float_pad_ends_as_concat",))
    wrong = htp_pads_wrongly(begin, end, half=dtype == TensorProto.FLOAT16)
    assert changed == (wrong and any(begin + end))
    assert any(n.op_type == "Pad" for n in m.graph) == (not changed)
    (got,) = cpu_session(to_bytes(m)).run(None, {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_integer_pads_and_other_modes_are_not_this_passs() -> None:
    """Integer Pads are integer_pad_as_concat's, and an edge or reflect Pad is no constant block."""
    int_model = _pad_model((2, 3), [0, 0], [1, 2], 0.0, TensorProto.FLOAT)
    int_model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    assert run_passes(to_ir(int_model), ("float_pad_ends_as_concat",)) == [("float_pad_ends_as_concat", False)]
    edge = make_model(
        [h.make_node("Pad", ["x", "pads"], ["y"], mode="edge")],
        [("x", TensorProto.FLOAT, (2, 3))],
        [("y", TensorProto.FLOAT, (3, 5))],
        {"pads": np.array([0, 0, 1, 2], np.int64)},
    )
    assert run_passes(to_ir(edge), ("float_pad_ends_as_concat",)) == [("float_pad_ends_as_concat", False)]


@pytest.mark.parametrize(
    ("shape", "begin", "end", "dtype"),
    [
        ((1, 3), [0, 0], [1, 2], TensorProto.FLOAT),  # F.pad(x, (0, 2, 0, 1), value=...)
        ((3, 4, 5), [0, 0, 0], [0, 1, 2], TensorProto.FLOAT),
        ((2, 3, 4, 5), [0, 0, 0, 0], [0, 0, 1, 2], TensorProto.FLOAT),
        ((2, 3, 4, 5), [1, 1, 1, 0], [2, 2, 2, 2], TensorProto.FLOAT),
        ((2, 2, 3, 3, 5), [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], TensorProto.FLOAT16),  # rank 5 float16: any pad
    ],
)
def test_on_qnn_the_rewrite_is_right_where_htps_pad_is_not(shape, begin, end, dtype) -> None:
    """On the HTP simulator (CPU fallback off): HTP's own Pad of these patterns, as the graph's output, leaves
    padding unwritten (1.5 or more off for a pad value of 1.5 and inputs within +-4); the rewritten graph gives the
    CPU EP's values to float16 rounding."""
    model = _pad_model(shape, begin, end, 1.5, dtype)
    x = np.random.default_rng(5).uniform(-4, 4, shape).astype(_NP[dtype])
    (want,) = cpu_session(model.SerializeToString()).run(None, {"x": x})
    (raw,) = qnn_session(model.SerializeToString()).run(None, {"x": x})
    assert float(np.abs(raw.astype(np.float64) - want).max()) >= 1.0  # the defect the pass exists for
    m = to_ir(model)
    run_passes(m, ("float_pad_ends_as_concat",))
    (got,) = qnn_session(to_bytes(m)).run(None, {"x": x})
    np.testing.assert_allclose(got.astype(np.float64), want, atol=4e-3, rtol=0)


def _pad_into_model(shape: tuple[int, ...], end: int, value: float, then: str):
    """y = then(Pad(x, end of the last axis, value)): the Pad feeding another op, not the graph's output."""
    rank = len(shape)
    padded = (*shape[:-1], shape[-1] + end)
    inits = {"pads": np.array([0] * (2 * rank - 1) + [end], np.int64), "value": np.array(value, np.float32)}
    nodes = [h.make_node("Pad", ["x", "pads", "value"], ["p"], mode="constant")]
    out = padded
    if then == "MatMul":
        inits["w"] = np.random.default_rng(1).standard_normal((padded[-1], 3)).astype(np.float32)
        nodes.append(h.make_node("MatMul", ["p", "w"], ["y"]))
        out = (*shape[:-1], 3)
    else:
        nodes.append(h.make_node(then, ["p"], ["y"]))
    return make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, out)], inits)


@pytest.mark.parametrize(
    ("shape", "value", "then"),
    [((4, 6), 2.5, "Relu"), ((4, 6), 0.0, "MatMul"), ((2, 3, 6), 2.5, "Exp"), ((2, 3, 6), 0.0, "Relu")],
)
def test_on_qnn_an_op_fed_by_a_pad_of_the_last_axis_sees_the_pad_value(shape, value, then) -> None:
    """On the HTP simulator: an op fed by HTP's own Pad of the end of the last axis read 0 or memory never written in
    place of the padding (Relu of a pad of 2.5 gave 0; a MatMul over a zero pad was hundreds off); after the rewrite
    the op sees the pad value, as on the CPU EP."""
    model = _pad_into_model(shape, 3, value, then)
    x = np.random.default_rng(0).uniform(-3, 3, shape).astype(np.float32)
    (want,) = cpu_session(model.SerializeToString()).run(None, {"x": x})
    (raw,) = qnn_session(model.SerializeToString()).run(None, {"x": x})
    scale = float(np.abs(want).max())
    assert float(np.abs(raw - want).max()) > 0.1 * scale  # the defect the pass exists for
    m = to_ir(model)
    run_passes(m, ("float_pad_ends_as_concat",))
    (got,) = qnn_session(to_bytes(m)).run(None, {"x": x})
    assert float(np.abs(got - want).max()) <= 4e-3 * scale


def test_a_scatter_reduce_along_rows_with_narrower_indices_runs_on_qnn_as_eager() -> None:
    """scatter_reduce along dim 0 with indices narrower than the tensor: the translator pads the indices with -1
    at the end of their last axis and compares them with each row; with HTP's own Pad the comparison saw 0 there
    and summed into row 0 what belonged nowhere (0.1 of the output's scale off here, 0.95 in PyTorch's OpInfo
    samples)."""
    x = torch.randn(10, 5, generator=torch.Generator().manual_seed(0))
    src = torch.randn(10, 2, generator=torch.Generator().manual_seed(1)) * 5
    index = torch.stack([torch.randperm(10, generator=torch.Generator().manual_seed(k)) for k in (2, 3)], dim=1)

    def fn(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.scatter_reduce(x, 0, index, src, "sum", include_self=False)

    backend = Capture(qnn_session, qe.ExportOptions())
    got = compile_and_run(fn, [x, index, src], backend)
    want = fn(x, index, src)
    assert float((got - want).abs().max()) <= 4e-3 * float(want.abs().max())


class _Padded(torch.nn.Module):
    """A feature map padded at the end of its two spatial axes (to a multiple of a window, as windowed attention
    and patch embeddings pad), then scaled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 2, 0, 1), value=0.5) * 2


def test_an_end_padded_feature_map_runs_on_qnn_as_eager_pads_it() -> None:
    """Through the exporter on the HTP simulator: eager's values, the padding included (HTP's own Pad fed the
    multiply 0 or memory it never wrote in the new columns)."""
    x = torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(0))
    backend = Capture(qnn_session, qe.ExportOptions())
    got = compile_and_run(_Padded().eval(), [x], backend)
    (exported,) = backend.exported
    assert "float_pad_ends_as_concat" in exported.passes_applied
    torch.testing.assert_close(got, _Padded()(x), atol=4e-3, rtol=2e-3)
