"""softmax_scale_as_vector: a negative scalar factor of a Softmax's input, which the QNN EP folds into a wrong HTP
Softmax, given the shape [1]."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

import qnnx_export as qe
from qnnx_export._passes import run_passes

_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _scaled_softmax(shape, scale, axis, *, dtype=TensorProto.FLOAT, factor_shape=(), first=False, reused=False):
    """z = Softmax(Mul(x, c), axis) with c a constant of ``factor_shape`` (rank 0: the form the QNN EP fuses);
    ``first``: Mul(c, x); ``reused``: the product is also an output of its own."""
    inputs = ["c", "x"] if first else ["x", "c"]
    nodes = [h.make_node("Mul", inputs, ["t"]), h.make_node("Softmax", ["t"], ["z"], axis=axis)]
    outputs = [("z", dtype, shape)] + ([("t", dtype, shape)] if reused else [])
    return make_model(nodes, [("x", dtype, shape)], outputs, {"c": np.full(factor_shape, scale, _NP[dtype])})


@settings(max_examples=60)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple),
    scale=st.sampled_from([-2.0, -0.5, -0.125, 0.0, 0.125, 3.0]),
    dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]),
    factor_shape=st.sampled_from([(), (1,)]),
    first=st.booleans(),
    reused=st.booleans(),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_the_pass_reshapes_exactly_the_factors_htp_would_fold_wrongly(
    shape, scale, dtype, factor_shape, first, reused, data, seed
) -> None:
    """For any rank 1-5 and axis, the pass changes exactly a rank-0 factor read by the Softmax alone that is negative
    or scales another axis than the last, and the graph gives the CPU EP's values bit for bit."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    model = _scaled_softmax(shape, scale, axis, dtype=dtype, factor_shape=factor_shape, first=first, reused=reused)
    x = np.random.default_rng(seed).standard_normal(shape).astype(_NP[dtype])
    want = cpu_session(model.SerializeToString()).run(None, {"x": x})
    m = to_ir(model)
    [(_, changed)] = run_passes(m, ("softmax_scale_as_vector",))
    last = axis in (-1, len(shape) - 1)
    assert changed == (factor_shape == () and not reused and (scale < 0 or not last))
    got = cpu_session(to_bytes(m)).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    ("shape", "scale", "axis"),
    [((3, 4), -1.0, -1), ((1, 2, 4, 4), -0.125, -1), ((8,), -0.5, 0), ((1, 2, 2, 3, 4), -0.5, -1)],
)
def test_on_qnn_the_fused_negative_scale_is_wrong_and_the_rewrite_right(shape, scale, axis) -> None:
    """On the HTP simulator Softmax(Mul(x, c)) with a negative rank-0 c comes back far off (the QNN EP folds c
    into the HTP Softmax's beta); with the factor of shape [1] it is within float16 rounding."""
    model = _scaled_softmax(shape, scale, axis)
    x = np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)
    (want,) = cpu_session(model.SerializeToString()).run(None, {"x": x})
    (raw,) = qnn_session(model.SerializeToString()).run(None, {"x": x})
    assert np.abs(raw - want).max() > 0.2 * np.abs(want).max()
    m = to_ir(model)
    assert run_passes(m, ("softmax_scale_as_vector",)) == [("softmax_scale_as_vector", True)]
    (got,) = qnn_session(to_bytes(m)).run(None, {"x": x})
    assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()


def test_on_qnn_a_scaled_softmax_over_another_axis_builds_once_rewritten() -> None:
    """Over an axis other than the last, the fused Softmax fails QNN's graph finalize, whatever the factor; with the
    factor of shape [1] the graph builds and is right."""
    model = _scaled_softmax((2, 3, 4), 2.0, 1)
    with pytest.raises(Exception, match="finalize"):
        qnn_session(model.SerializeToString())
    m = to_ir(model)
    assert run_passes(m, ("softmax_scale_as_vector",)) == [("softmax_scale_as_vector", True)]
    x = np.random.default_rng(1).uniform(-2, 2, (2, 3, 4)).astype(np.float32)
    (want,) = cpu_session(model.SerializeToString()).run(None, {"x": x})
    (got,) = qnn_session(to_bytes(m)).run(None, {"x": x})
    assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()


def test_a_rank5_softmax_of_a_negatively_scaled_input_runs_on_qnn_as_eager() -> None:
    """``softmax(x * -0.5)`` at rank 5, which softmax_input_floor leaves alone, came back 0.81 of its scale off on
    the NPU; exported with the passes it is within float16 rounding of eager."""
    x = torch.randn(1, 2, 2, 3, 4, generator=torch.Generator().manual_seed(0))

    def fn(a: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a * -0.5, -1)

    backend = Capture(qnn_session, qe.ExportOptions())
    got = compile_and_run(fn, [x], backend)
    assert "softmax_scale_as_vector" in backend.exported[0].passes_applied
    assert rel_err(got, fn(x)) <= 5e-3
