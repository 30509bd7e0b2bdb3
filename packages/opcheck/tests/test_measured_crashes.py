"""Graphs that stop the process while a QNN session is created: opcheck refuses them as crashes and vouches for
their neighbours that build (each measured in a child process; the export's defect tests show the crash live)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc

_dims = st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple)


def _flat_gather(source: tuple[int, ...], index_shape: tuple[int, ...], *, transposed: bool) -> onnx.ModelProto:
    """``source`` (transposed or not) flattened to rank 1 and gathered by constant indices of ``index_shape``."""
    size = math.prod(source)
    nodes = [helper.make_node("Reshape", ["t" if transposed else "x", "flat"], ["v"], name="flatten")]
    if transposed:
        perm = list(reversed(range(len(source))))
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["t"], perm=perm, name="transpose"))
    nodes.append(helper.make_node("Gather", ["v", "ids"], ["y"], axis=0, name="gather"))
    inits = {"flat": np.array([size], np.int64), "ids": np.zeros(index_shape, np.int64)}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(source))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _refused(model: onnx.ModelProto) -> list[tuple[str, str]]:
    report = oc.check_model(model, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return [(v.node_name, v.kind) for v in report.verdicts if v.status != "supported"]


@given(
    source=_dims, index_shape=st.lists(st.integers(1, 5), min_size=0, max_size=4).map(tuple), transposed=st.booleans()
)
def test_a_transposed_vector_gathered_by_multi_dim_indices_is_refused_as_a_crash(
    source: tuple[int, ...], index_shape: tuple[int, ...], transposed: bool
) -> None:
    """The Reshape of a Transpose to rank 1 read by a Gather with indices of rank >= 2 is a crash; with indices of
    rank 0 or 1, or without the Transpose, the graph builds and opcheck vouches for it."""
    refused = _refused(_flat_gather(source, index_shape, transposed=transposed))
    if transposed and len(index_shape) >= 2:
        assert refused == [("flatten", "crash")]
    else:
        assert refused == []


def test_the_refusal_names_the_fix() -> None:
    """The reason says what stops the process and how to write the gather instead."""
    report = oc.check_model(_flat_gather((8, 4), (2, 3), transposed=True), "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    (verdict,) = [v for v in report.verdicts if v.status != "supported"]
    assert "SIGABRT" in (verdict.reason or "") and "flattened indices" in (verdict.reason or "")
