"""Attention masks in quantized graphs: a constant -inf fill becomes a finite one that a quantized tensor can hold,
with the same attention weights, fully masked rows still giving 0."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper

from qnnx_backend._quantize import MASK_FILL, finite_masks


def _masked_softmax() -> onnx.ModelProto:
    """softmax(scores + where(keep, 0, -inf)) with the safe softmax's fully-masked test as qnnx-export writes it."""
    nodes = [
        helper.make_node("Where", ["keep", "zero", "neg_inf"], ["mask"]),
        helper.make_node("Add", ["scores", "mask"], ["x"]),
        helper.make_node("ReduceMax", ["x", "axes"], ["row_max"], keepdims=1),
        helper.make_node("LessOrEqual", ["row_max", "threshold"], ["fully_masked"]),
        helper.make_node("Softmax", ["x"], ["weights"], axis=-1),
        helper.make_node("Where", ["fully_masked", "zero", "weights"], ["out"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(-32768.0, np.float32), "threshold"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_softmax",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [None, None]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(model: onnx.ModelProto, scores: np.ndarray, keep: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"scores": scores, "keep": keep})[0]


def test_the_fill_and_the_fully_masked_test_become_finite() -> None:
    """The -inf fill becomes MASK_FILL and the -32768 test half of it; nothing infinite is left to calibrate."""
    model = _masked_softmax()
    assert finite_masks(model) == 1
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    used = {name for node in model.graph.node for name in node.input}
    assert all(np.all(np.isfinite(v)) for name, v in values.items() if name in used)
    assert float(values["neg_inf_finite_mask"]) == MASK_FILL
    assert float(values["threshold_finite_mask_test"]) == MASK_FILL / 2


def test_a_graph_without_an_infinite_fill_is_left_alone() -> None:
    """A Where between two runtime tensors, or a finite constant, is not a mask fill: nothing changes."""
    model = _masked_softmax()
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(-1e4, np.float32), "neg_inf"))
    before = model.SerializeToString()
    assert finite_masks(model) == 0 and model.SerializeToString() == before


@settings(deadline=None, max_examples=40)
@given(
    data=st.data(),
    shape=st.tuples(st.integers(1, 6), st.integers(1, 12)),
)
def test_finite_fill_gives_the_same_attention_weights(data: st.DataObject, shape: tuple[int, int]) -> None:
    """For scores within +-100 and any mask (rows with no kept position included), the finite fill gives the -inf
    fill's weights: the same softmax over the kept positions, and 0 for a fully masked row."""
    scores = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-100, 100, width=32)))
    keep = data.draw(hnp.arrays(np.bool_, shape))
    model = _masked_softmax()
    reference = _run(model, scores, keep)
    finite_masks(model)
    got = _run(model, scores, keep)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-7)
    assert np.all(got[~keep.any(axis=1)] == 0)
