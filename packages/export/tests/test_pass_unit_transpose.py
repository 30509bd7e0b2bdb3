"""``transpose_of_unit_dims_as_reshape``: Transposes that move only axes of size 1 are dropped or become Reshapes,
exactly, and the rank-5 form QNN fails to finalize builds on QNN afterwards."""

from __future__ import annotations

import numpy as np
import onnx
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import qnn_session
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from qnnx_export._passes import run_passes

_PASS = ("transpose_of_unit_dims_as_reshape",)


@st.composite
def _unit_moves(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A shape of rank 2-5 with unit dims, and a permutation that keeps its non-unit axes in order."""
    shape = draw(st.lists(st.one_of(st.just(1), st.integers(2, 6)), min_size=2, max_size=5))
    units = [a for a, d in enumerate(shape) if d == 1]
    others = [a for a, d in enumerate(shape) if d != 1]
    slots = draw(st.permutations(range(len(shape))))
    perm, it_units, it_others = [], iter(draw(st.permutations(units))), iter(others)
    unit_slots = set(slots[: len(units)])
    for position in range(len(shape)):
        perm.append(next(it_units) if position in unit_slots else next(it_others))
    return shape, perm


@given(case=_unit_moves(), then_reshape=st.booleans(), seed=st.integers(0, 2**16))
def test_unit_dim_transposes_become_reshapes_exactly(
    case: tuple[list[int], list[int]], then_reshape: bool, seed: int
) -> None:
    """Any Transpose that moves only unit axes, at ranks 2-5, read by a Reshape or by the graph's output, gives the
    same values after the pass (ONNX's reference evaluator); the pass acts on rank 5 read by a Reshape only."""
    shape, perm = case
    out_shape = [shape[a] for a in perm]
    flat = [int(np.prod(shape))]
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=perm)]
    if then_reshape:
        nodes.append(h.make_node("Reshape", ["t", "flat"], ["y"]))
    else:
        nodes.append(h.make_node("Identity", ["t"], ["y"]))
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, shape)],
        [("y", TensorProto.FLOAT, flat if then_reshape else out_shape)],
        {"flat": np.array(flat, np.int64)},
    )
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    m = to_ir(model)
    changed = dict(run_passes(m, _PASS))["transpose_of_unit_dims_as_reshape"]
    assert changed == (then_reshape and len(shape) == 5)
    got = ReferenceEvaluator(onnx.load_from_string(to_bytes(m))).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_the_einsum_form_that_fails_finalize_builds_and_is_exact_on_qnn() -> None:
    """XLNet's relative attention lowers einsum to a rank-5 Transpose of unit dims followed by two Reshapes, which
    QNN HTP fails to finalize (QNN_COMMON_ERROR_MEM_ALLOC); after the pass the graph builds and returns the same
    values on QNN."""
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[3, 0, 1, 4, 2]),
        h.make_node("Reshape", ["t", "s1"], ["r1"]),
        h.make_node("Reshape", ["r1", "s2"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [4, 16, 1, 1, 32])],
        [("y", TensorProto.FLOAT, [1, 4, 32, 16])],
        {"s1": np.array([1, 4, 16, 32], np.int64), "s2": np.array([1, 4, 32, 16], np.int64)},
    )
    x = np.random.default_rng(0).standard_normal([4, 16, 1, 1, 32]).astype(np.float32)
    m = to_ir(model)
    assert dict(run_passes(m, _PASS))["transpose_of_unit_dims_as_reshape"]
    assert "Transpose" not in {n.op_type for n in m.graph}
    got = qnn_session(to_bytes(m)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x.reshape(1, 4, 32, 16), atol=2e-3 * np.abs(x).max())


def test_transposes_that_move_elements_are_left_alone() -> None:
    """A Transpose that swaps two axes of size > 1 moves elements: the pass does not touch it."""
    model = make_model(
        [h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), h.make_node("Reshape", ["t", "s"], ["y"])],
        [("x", TensorProto.FLOAT, [1, 3, 4])],
        [("y", TensorProto.FLOAT, [12])],
        {"s": np.array([12], np.int64)},
    )
    m = to_ir(model)
    assert not dict(run_passes(m, _PASS))["transpose_of_unit_dims_as_reshape"]
