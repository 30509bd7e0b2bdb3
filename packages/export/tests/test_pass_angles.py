"""``angles_from_tables``: sines and cosines of integer multiples (rotary and sinusoidal position embeddings) from
exact tables, on QNN, over shapes, positions and multipliers; and the graphs it must leave alone."""

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

from qnnx_export._passes import run_passes

_PASS = ("angles_from_tables",)


def _rotary(batch: int, seq: int, half: int, theta: float, form: str) -> onnx.ModelProto:
    """cos/sin of positions[b, t] * inv_freq[j], written as Hugging Face's rotary embedding (a MatMul of
    inv_freq[1, half, 1] by positions[b, 1, t], transposed and concatenated with itself) or as a broadcast Mul."""
    inv_freq = (1.0 / theta ** (np.arange(half, dtype=np.float32) * 2 / (2 * half))).astype(np.float32)
    shape = [batch, seq, 2 * half]
    if form == "matmul":
        nodes = [
            h.make_node("Unsqueeze", ["pos", "axis1"], ["pos3"]),
            h.make_node("Cast", ["pos3"], ["posf"], to=TensorProto.FLOAT),
            h.make_node("Expand", ["inv", "inv_shape"], ["inv_b"]),
            h.make_node("MatMul", ["inv_b", "posf"], ["freqs_t"]),
            h.make_node("Transpose", ["freqs_t"], ["freqs"], perm=[0, 2, 1]),
            h.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),
        ]
        inits = {
            "axis1": np.array([1], np.int64),
            "inv": inv_freq.reshape(1, half, 1),
            "inv_shape": np.array([batch, half, 1], np.int64),
        }
    else:
        nodes = [
            h.make_node("Unsqueeze", ["pos", "axis2"], ["pos3"]),
            h.make_node("Cast", ["pos3"], ["posf"], to=TensorProto.FLOAT),
            h.make_node("Mul", ["posf", "inv2"], ["emb"]),
        ]
        inits = {"axis2": np.array([2], np.int64), "inv2": np.concatenate([inv_freq, inv_freq])}
    nodes += [h.make_node("Cos", ["emb"], ["cos"]), h.make_node("Sin", ["emb"], ["sin"])]
    return make_model(
        nodes,
        [("pos", TensorProto.INT32, [batch, seq])],
        [("cos", TensorProto.FLOAT, shape), ("sin", TensorProto.FLOAT, shape)],
        inits,
    )


def _exact(model: onnx.ModelProto, pos: np.ndarray) -> list[np.ndarray]:
    """cos and sin of the angles computed in float64 from the graph's float32 multipliers."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    inv = (inits["inv"].reshape(-1) if "inv" in inits else inits["inv2"][: inits["inv2"].size // 2]).astype(np.float64)
    emb = pos.astype(np.float64)[..., None] * np.concatenate([inv, inv])
    return [np.cos(emb), np.sin(emb)]


@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 9),
    half=st.integers(1, 12),
    theta=st.sampled_from([10.0, 1e4, 1e6]),
    form=st.sampled_from(["matmul", "mul"]),
    top=st.sampled_from([8, 2048, 40000, 2**22]),
    seed=st.integers(0, 2**16),
)
def test_rotary_angles_are_exact_on_qnn_at_any_position(
    batch: int, seq: int, half: int, theta: float, form: str, top: int, seed: int
) -> None:
    """cos/sin of runtime positions times constant frequencies run wholly on QNN within 2e-3 of the exact values,
    for positions up to 4 million (the float16 angle was 0.14 off at position 1000), any batch, length, width and
    base, in both ways models write the product."""
    model = _rotary(batch, seq, half, theta, form)
    pos = np.random.default_rng(seed).integers(0, top, size=(batch, seq)).astype(np.int32)
    m = to_ir(model)
    assert dict(run_passes(m, _PASS))["angles_from_tables"]
    assert {n.op_type for n in m.graph}.isdisjoint({"Sin", "Cos"})
    got = qnn_session(to_bytes(m)).run(None, {"pos": pos})
    for g, want in zip(got, _exact(model, pos), strict=True):
        assert g.shape == want.shape
        assert float(np.abs(g - want).max()) < 2e-3


def test_negative_positions_are_exact_too() -> None:
    """Negative integers (relative positions) are within the tables' range: the same accuracy."""
    model = _rotary(1, 6, 4, 1e4, "mul")
    pos = np.array([[-5000, -1, 0, 1, 77, -(2**22)]], np.int32)
    m = to_ir(model)
    run_passes(m, _PASS)
    got = qnn_session(to_bytes(m)).run(None, {"pos": pos})
    for g, want in zip(got, _exact(model, pos), strict=True):
        assert float(np.abs(g - want).max()) < 2e-3


def _unchanged(nodes: list[onnx.NodeProto], inputs: list, inits: dict) -> None:
    m = to_ir(make_model(nodes, inputs, [("y", TensorProto.FLOAT, None)], inits))
    assert not dict(run_passes(m, _PASS))["angles_from_tables"]
    assert any(n.op_type in ("Sin", "Cos") for n in m.graph)


@pytest.mark.parametrize(
    "case",
    ["float_input", "phase_added", "product_of_positions", "constant_over_angle", "two_integers"],
)
def test_angles_that_are_not_integer_multiples_are_left_alone(case: str) -> None:
    """A float input, an added phase, a product of two runtime values, a constant divided by the angle and an
    angle from two integers are not of the form the tables prove: the pass leaves their Sin/Cos as they are."""
    f = {"f": np.array([0.5, 0.25], np.float32)}
    cast = h.make_node("Cast", ["p"], ["pf"], to=TensorProto.FLOAT)
    p = ("p", TensorProto.INT32, [3, 2])
    if case == "float_input":
        _unchanged(
            [h.make_node("Mul", ["x", "f"], ["a"]), h.make_node("Sin", ["a"], ["y"])],
            [("x", TensorProto.FLOAT, [3, 2])],
            f,
        )
    elif case == "phase_added":
        _unchanged(
            [
                cast,
                h.make_node("Mul", ["pf", "f"], ["m"]),
                h.make_node("Add", ["m", "f"], ["a"]),
                h.make_node("Cos", ["a"], ["y"]),
            ],
            [p],
            f,
        )
    elif case == "product_of_positions":
        _unchanged([cast, h.make_node("Mul", ["pf", "pf"], ["a"]), h.make_node("Sin", ["a"], ["y"])], [p], {})
    elif case == "constant_over_angle":
        _unchanged([cast, h.make_node("Div", ["f", "pf"], ["a"]), h.make_node("Sin", ["a"], ["y"])], [p], f)
    else:
        _unchanged(
            [
                cast,
                h.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
                h.make_node("Mul", ["pf", "qf"], ["a"]),
                h.make_node("Sin", ["a"], ["y"]),
            ],
            [p, ("q", TensorProto.INT32, [3, 2])],
            {},
        )
