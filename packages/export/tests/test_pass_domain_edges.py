"""Log and Div at the edges of their domains on the real QNN HTP simulator: -inf, +-inf and NaN where IEEE arithmetic
has them, after ``log_domain_edges`` and ``div_by_zero_edges``; HTP's own Log and Div return ordinary numbers there."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import qnn_session
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from qnnx_export._passes import run_passes

# Ranks 1-4 with unit dims drawn often; Log is also drawn at rank 5 (computed on its flat view).
_dim = st.one_of(st.just(1), st.integers(2, 9))
# Zeros of both signs, negatives, values from float16's subnormals to its large numbers.
_VALUES = np.array([0.0, -0.0, 0.0, -1.0, -3e-3, 1e-6, 1e-3, 0.5, 1.0, 3.0, 250.0, -40.0], np.float32)


def _draw(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(_VALUES, size=shape)


def _agrees(got: np.ndarray, want: np.ndarray) -> None:
    """Where the reference is NaN, an infinity or beyond float16's range, QNN's output is one too or beyond float16's
    range (HTP writes float16's NaN as 98304 and its infinities as +-65536 into a float32 output), which the
    backend's per-call check catches, with an infinity's sign; elsewhere within fp16 tolerance of the output's
    largest value. The reference is computed on the inputs rounded to float16, as HTP reads them."""
    assert got.shape == want.shape
    flagged = ~np.isfinite(got) | (np.abs(got) > 65504)
    beyond = ~np.isfinite(want) | (np.abs(want) > 65504)
    np.testing.assert_array_equal(flagged, beyond, err_msg="non-finite positions differ")
    for sign in (np.isposinf, np.isneginf):
        assert np.all(np.sign(got[sign(want)]) == np.sign(want[sign(want)])), "an infinity has the wrong sign"
    scale = max(float(np.abs(want[~beyond]).max(initial=0.0)), 1.0)
    assert float(np.abs(got[~beyond] - want[~beyond]).max(initial=0.0)) <= 1e-2 * scale


def _half(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float16).astype(np.float32) for a in arrays]


def _rewritten_on_qnn(model: onnx.ModelProto, feeds: dict[str, np.ndarray], name: str) -> list[np.ndarray]:
    m = to_ir(model)
    ((_, changed),) = run_passes(m, (name,))
    assert changed
    return list(qnn_session(to_bytes(m)).run(None, feeds))


def _log(shape: tuple[int, ...], scale: tuple[str, float] | None = None) -> onnx.ModelProto:
    """``Log(x)``, or ``Log(x)`` then a Mul or Div by a constant (``log2``, ``log10`` as exporters write them)."""
    if scale is None:
        nodes, inits = [h.make_node("Log", ["x"], ["y"])], {}
    else:
        nodes = [h.make_node("Log", ["x"], ["l"]), h.make_node(scale[0], ["l", "c"], ["y"])]
        inits = {"c": np.array(scale[1], np.float32)}
    return make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, shape)], inits)


def _div(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> onnx.ModelProto:
    return make_model(
        [h.make_node("Div", ["a", "b"], ["y"])],
        [("a", TensorProto.FLOAT, a), ("b", TensorProto.FLOAT, b)],
        [("y", TensorProto.FLOAT, out)],
        {},
    )


# How exporters scale a natural log: log10 divides by ln(10) (which brings HTP's stand-ins for -inf and NaN back
# within float16's range unless the edges come after it), log2 multiplies by 1 / ln(2).
_SCALES = st.sampled_from([None, ("Div", 2.302585), ("Mul", 0.4342945), ("Mul", 1.442695), ("Div", 0.6931472)])


@given(shape=st.lists(_dim, min_size=1, max_size=5).map(tuple), seed=st.integers(0, 2**16), scale=_SCALES)
def test_log_domain_edges_shape_classes(shape: tuple[int, ...], seed: int, scale: tuple[str, float] | None) -> None:
    """log(0) is -inf and the log of a negative number NaN on QNN after the pass, as in IEEE arithmetic, at ranks
    1-5 with unit dims, also when the log is then scaled by a constant (log10, log2); positive inputs (float16
    subnormals included) keep Log's value."""
    x = _draw(shape, seed)
    model = _log(shape, scale)
    (want,) = ReferenceEvaluator(model).run(None, {"x": _half(x)[0]})
    (got,) = _rewritten_on_qnn(model, {"x": x}, "log_domain_edges")
    _agrees(got, want)


@given(
    shape=st.lists(_dim, min_size=1, max_size=4).map(tuple),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_div_by_zero_edges_shape_classes(shape: tuple[int, ...], data: st.DataObject, seed: int) -> None:
    """0/0 is NaN and a/0 is +-inf with a's sign on QNN after the pass, at ranks 1-4 with unit dims and a divisor
    broadcast over any of the dims; other quotients keep Div's value, also by divisors below 1/65504 (float16
    subnormals), where HTP's own Div is wrong."""
    broadcast = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    b_shape = tuple(1 if flat else d for d, flat in zip(shape, broadcast))
    a, b = _draw(shape, seed), np.abs(_draw(b_shape, seed + 1))  # +0 divisors: -0 would flip an infinity's sign
    model = _div(shape, b_shape, shape)
    ha, hb = _half(a, b)
    (want,) = ReferenceEvaluator(model).run(None, {"a": ha, "b": hb})
    (got,) = _rewritten_on_qnn(model, {"a": a, "b": b}, "div_by_zero_edges")
    _agrees(got, want)


def test_a_clamped_log_of_zero_is_the_clamp_on_qnn() -> None:
    """A binary cross-entropy's log clamped to -100 (PyTorch's) gives -100 at 0 on QNN after the pass, not HTP's
    -7.6: later ops read the edge value as -inf."""
    model = make_model(
        [h.make_node("Log", ["x"], ["l"]), h.make_node("Max", ["l", "floor"], ["y"])],
        [("x", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, [4])],
        {"floor": np.array(-100.0, np.float32)},
    )
    (got,) = _rewritten_on_qnn(model, {"x": np.array([0.0, 1.0, 0.5, 1e-3], np.float32)}, "log_domain_edges")
    np.testing.assert_allclose(got, [-100.0, 0.0, np.log(0.5), np.log(1e-3)], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("divisor", [1e-6, -3e-7])
def test_a_tiny_constant_divisor_is_scaled_on_qnn(divisor: float) -> None:
    """x / c with a constant c below 1/65504 gives x / c on QNN after the pass (HTP's own Div saturates 1 / c)."""
    f = TensorProto.FLOAT
    model = make_model(
        [h.make_node("Div", ["x", "c"], ["y"])], [("x", f, [5])], [("y", f, [5])], {"c": np.array(divisor, np.float32)}
    )
    x = np.array([1e-3, -2e-3, 0.0, 5e-4, 1e-5], np.float32)
    (got,) = _rewritten_on_qnn(model, {"x": x}, "div_by_zero_edges")
    np.testing.assert_allclose(got, x / np.float32(divisor), rtol=3e-3)


def test_htp_log_and_div_are_finite_at_the_edges_without_the_passes() -> None:
    """The defects the passes avoid: HTP's own Log gives about -7.6 for log(0) and a number for a negative input, and
    its Div gives 0 for 0/0 and 0.066 for 1e-6/1e-6 (re-measure when onnxruntime-qnn changes)."""
    x = np.array([0.0, -1.0, 1.0, 4.0], np.float32)
    (log,) = qnn_session(_log((4,)).SerializeToString()).run(None, {"x": x})
    assert np.isfinite(log[:2]).all() and log[0] > -10
    a = np.array([0.0, 1e-6, 1e-3, 1.0], np.float32)
    b = np.array([0.0, 1e-6, 1e-6, 1.0], np.float32)
    (div,) = qnn_session(_div((4,), (4,), (4,)).SerializeToString()).run(None, {"a": a, "b": b})
    assert div[0] == 0 and div[1] < 0.5 and div[2] < 100


def _ops(model: onnx.ModelProto, name: str) -> list[str]:
    m = to_ir(model)
    run_passes(m, (name,))
    return [n.op_type for n in m.graph]


def test_logs_and_divisors_known_positive_are_left_alone() -> None:
    """The softplus form log(1 + exp(x)), a division by sqrt(mean(x^2) + eps) or by a non-zero constant and a
    rank-5 Div are not rewritten; a Log of a bare exp (which underflows to 0) is."""
    shape = [2, 8]
    f = TensorProto.FLOAT
    softplus = make_model(
        [h.make_node("Exp", ["x"], ["e"]), h.make_node("Add", ["e", "one"], ["p"]), h.make_node("Log", ["p"], ["y"])],
        [("x", f, shape)],
        [("y", f, shape)],
        {"one": np.array(1.0, np.float32)},
    )
    assert _ops(softplus, "log_domain_edges") == ["Exp", "Add", "Log"]
    log_exp = make_model(
        [h.make_node("Exp", ["x"], ["e"]), h.make_node("Log", ["e"], ["y"])], [("x", f, shape)], [("y", f, shape)], {}
    )
    assert "Where" in _ops(log_exp, "log_domain_edges")
    norm = make_model(
        [
            h.make_node("Mul", ["x", "x"], ["s"]),
            h.make_node("ReduceMean", ["s", "axes"], ["m"], keepdims=1),
            h.make_node("Add", ["m", "eps"], ["v"]),
            h.make_node("Sqrt", ["v"], ["r"]),
            h.make_node("Div", ["x", "r"], ["y"]),
            h.make_node("Div", ["y", "c"], ["z"]),
        ],
        [("x", f, shape)],
        [("z", f, shape)],
        {"axes": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32), "c": np.array(-3.0, np.float32)},
    )
    assert "Where" not in _ops(norm, "div_by_zero_edges")  # sqrt(.. + 1e-6) >= 1e-3; a constant -3
    tiny = make_model(
        [h.make_node("Div", ["x", "c"], ["y"])], [("x", f, shape)], [("y", f, shape)], {"c": np.array(1e-6, np.float32)}
    )
    assert _ops(tiny, "div_by_zero_edges") == ["Mul", "Div"]
    rank5 = (1, 2, 1, 3, 4)
    assert _ops(_div(rank5, rank5, rank5), "div_by_zero_edges") == ["Div"]


@pytest.mark.parametrize("eps", [1e-9, 0.0])
def test_an_epsilon_float16_loses_does_not_prove_a_divisor_positive(eps: float) -> None:
    """sqrt(v + eps) with an eps that is 0 in float16 may be 0 on HTP: the division is guarded."""
    f = TensorProto.FLOAT
    model = make_model(
        [
            h.make_node("Abs", ["b"], ["m"]),
            h.make_node("Add", ["m", "eps"], ["v"]),
            h.make_node("Sqrt", ["v"], ["r"]),
            h.make_node("Div", ["a", "r"], ["y"]),
        ],
        [("a", f, [4]), ("b", f, [4])],
        [("y", f, [4])],
        {"eps": np.array(eps, np.float32)},
    )
    assert "Where" in _ops(model, "div_by_zero_edges")
