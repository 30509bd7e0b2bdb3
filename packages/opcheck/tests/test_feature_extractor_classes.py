"""ai.onnx.ml's ArrayFeatureExtractor by shape class (measured on the HTP simulator by tools/opcheck/conformance.py),
and Shape with start > end (folded by onnxruntime before the QNN EP sees it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from opcheck_graphs import feature_extractor as _afe

import qnnx_opcheck as oc


def _verdict(m: onnx.ModelProto, version: str = "2.7.0") -> oc.NodeVerdict:
    return oc.check_model(m, "htp", onnxruntime_qnn=version, soc_model=60).verdicts[0]


@pytest.mark.parametrize(
    ("shape", "indices", "dtype", "runtime", "supported"),
    [
        ((3, 4), [0, 1], "float32", True, True),  # test_ai_onnx_ml_array_feature_extractor
        ((2, 1, 5), [4, 0, 2, 2], "float32", False, True),
        ((1, 2, 1, 5), [3], "float32", True, True),
        ((2, 3, 1), [0, 0], "float32", False, True),  # a last axis of one element
        ((2, 2, 3, 5), [1, 4], "int32", True, True),
        ((1, 2, 2, 3, 5), [1], "int64", False, False),  # the EP refused int64 at rank 5
        ((5,), [3], "float32", False, False),  # rank 1: wrong output shape (one index) or refused
        ((3, 5), [-1, 0], "float32", False, False),  # negative: onnxruntime's CPU kernel refuses them
        ((2, 3, 1), [0], "int32", False, False),  # unit last axis measured on float32 only
    ],
)
def test_array_feature_extractor_by_class(
    shape: tuple[int, ...], indices: list[int], dtype: str, runtime: bool, supported: bool
) -> None:
    """ArrayFeatureExtractor is vouched for in the classes measured right and refused, naming the class, in others."""
    v = _verdict(_afe(shape, indices, dtype, runtime))
    assert (v.status != "unsupported") is supported, v.reason
    if not supported:
        assert f"r{len(shape)}/" in (v.reason or "")


@pytest.mark.parametrize(
    ("shape", "index_shape", "supported"),
    [((3, 5), (2, 2), True), ((2, 3, 5), (2, 2), True), ((2, 2, 3, 5), (2, 2), False), ((3, 5), (), False)],
)
@pytest.mark.parametrize("runtime", [False, True])
def test_array_feature_extractor_by_index_rank(
    shape: tuple[int, ...], index_shape: tuple[int, ...], supported: bool, runtime: bool
) -> None:
    """Indices of rank 2 are vouched for at data ranks 2-3 (measured right) and refused at rank 4 (the EP refused
    them); scalar indices, which leave the output's last dim unknown to inference, are refused as measured."""
    indices = list(range(int(np.prod(index_shape))))
    v = _verdict(_afe(shape, indices, runtime=runtime, index_shape=index_shape))
    assert (v.status != "unsupported") is supported, v.reason
    if not supported:
        assert v.kind == "rejected" and f"indices_r{len(index_shape)}" in (v.reason or "")


@pytest.mark.parametrize("version", ["2.4.0", "2.5.0", "2.6.0"])
def test_array_feature_extractor_before_2_7_is_refused(version: str) -> None:
    """Releases before onnxruntime-qnn 2.7.0 (which added ArrayFeatureExtractor) do not vouch for it."""
    assert _verdict(_afe((3, 4), [0, 1]), version).status == "unsupported"


@given(
    leading=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    last=st.integers(2, 9),
    data=st.data(),
    dtype=st.sampled_from(["float32", "int32", "int64"]),
    runtime=st.booleans(),
)
def test_array_feature_extractor_verdict_follows_measured_classes(
    leading: list[int], last: int, data: st.DataObject, dtype: str, runtime: bool
) -> None:
    """Over random shapes of rank 2-5 and valid indices, the verdict is supported exactly when the class is one
    measured right: every rank 2-4 dtype, and rank 5 except int64."""
    indices = data.draw(st.lists(st.integers(0, last - 1), min_size=1, max_size=8))
    shape = (*leading, last)
    v = _verdict(_afe(shape, indices, dtype, runtime))
    expected = not (len(shape) == 5 and dtype == "int64")
    assert (v.status != "unsupported") is expected, v.reason


def _shape_node(start: int, end: int, through_relu: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Shape", ["r" if through_relu else "x"], ["y"], start=start, end=end)]
    if through_relu:
        nodes.insert(0, helper.make_node("Relu", ["x"], ["r"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [max(0, end - start)])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("through_relu", [False, True])
def test_shape_with_start_after_end_is_folded(through_relu: bool) -> None:
    """Shape(start=2, end=1) of a static shape (an empty output) is folded by onnxruntime, even as a graph output:
    QNN never sees the zero-element tensor, so the node is supported as folded."""
    report = oc.check_model(_shape_node(2, 1, through_relu), "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    assert report.supported
    assert report.verdicts[-1].kind == "constant_folded"


def test_shape_of_a_symbolic_input_with_start_after_end_is_refused() -> None:
    """Shape of an input with a symbolic dim is not folded, and its empty output keeps the node off QNN."""
    m = _shape_node(2, 1, False)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    assert not oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60).supported
