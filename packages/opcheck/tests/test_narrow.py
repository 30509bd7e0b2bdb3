"""``narrow_failure``: the smallest run of nodes whose QNN HTP session fails, found by sessions of parts of the graph
built in child processes on the host simulator, in a number of trials logarithmic in the graph's size."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qnnx_opcheck import NarrowReport, narrow_failure
from qnnx_opcheck._narrow import MOVEMENT_OPS, Parts

_OPS = ("Relu", "Sigmoid", "Neg", "Reshape", "Abs")


def _chain(ops: list[str], head_split: bool = False) -> onnx.ModelProto:
    """x[4,4,24] -> one node per op of ``ops`` (shape-preserving) -> output; with ``head_split``, the projection
    QNN HTP fails to finalize (Reshape [16,24] -> Gemm -> Reshape [4,4,24] -> Reshape [4,4,4,6], measured with
    onnxruntime-qnn 2.7.0) sits in the middle, followed by a Transpose of the heads and a Reshape back."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([4, 4, 24], np.int64), "shape3")]
    nodes, value = [], "x"
    for k, op in enumerate(ops):
        out = f"v{k}"
        inputs = [value, "shape3"] if op == "Reshape" else [value]
        nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}_{k}"))
        value = out
        if head_split and k == len(ops) // 2:
            inits += [
                numpy_helper.from_array(np.array([16, 24], np.int64), "rows"),
                numpy_helper.from_array(np.array([4, 4, 4, 6], np.int64), "heads"),
                numpy_helper.from_array(rng.standard_normal((24, 24)).astype(np.float32), "w"),
                numpy_helper.from_array(np.zeros(24, np.float32), "b"),
            ]
            nodes += [
                helper.make_node("Reshape", [value, "rows"], ["r"], name="to_rows"),
                helper.make_node("Gemm", ["r", "w", "b"], ["g"], name="project", transB=1),
                helper.make_node("Reshape", ["g", "shape3"], ["g3"], name="to_3d"),
                helper.make_node("Reshape", ["g3", "heads"], ["h"], name="to_heads"),
                helper.make_node("Transpose", ["h"], ["t"], name="heads_first", perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", ["t", "shape3"], ["back"], name="from_heads"),
            ]
            value = "back"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4, 24])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, [4, 4, 24])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_narrows_a_finalize_failure_to_the_projection() -> None:
    """A 25-node graph whose finalize fails is narrowed to the failing projection's run, in at most
    2 + 2*ceil(log2(25)) trials, naming QNN's error; the run's computing op type is Gemm."""
    model = _chain(["Relu", "Sigmoid", "Neg", "Abs"] * 5, head_split=True)
    seen: list[int] = []
    report = narrow_failure(model, soc_model=60, on_trial=lambda k, _what: seen.append(k))
    assert report.error is not None and "QNN_COMMON_ERROR_MEM_ALLOC" in report.error, report
    assert "project" in report.nodes and set(report.nodes) <= {"abs_11", "to_rows", "project", "to_3d", "to_heads"}
    assert report.computing_op_types == ("Gemm",) and report.minimal
    assert report.trials == len(seen) <= 2 + 2 * math.ceil(math.log2(len(model.graph.node))), report.trials
    assert "narrowed to" in report.describe() and "Gemm" in report.describe()


def test_a_graph_that_builds_is_one_trial() -> None:
    """A graph QNN builds gives no error and no run, after a single trial."""
    report = narrow_failure(_chain(["Relu", "Sigmoid", "Neg"]), soc_model=60)
    assert report == NarrowReport(error=None, trials=1)
    assert report.describe() == "the graph builds on QNN"


@given(ops=st.lists(st.sampled_from(_OPS), min_size=1, max_size=12), data=st.data())
def test_every_run_is_a_valid_model_of_its_own(ops: list[str], data: st.DataObject, tmp_path_factory) -> None:
    """Any contiguous run of a graph's nodes is written as a valid ONNX model whose inputs are the values it reads
    from before the run and whose outputs are the values read after it; movement-only runs are known as such."""
    model = _chain(ops)
    start = data.draw(st.integers(0, len(ops) - 1))
    stop = data.draw(st.integers(start + 1, len(ops)))
    parts = Parts(model, Path(tmp_path_factory.mktemp("parts")))
    path = parts.write(range(start, stop))
    assert path is not None
    part = onnx.load(str(path))
    onnx.checker.check_model(part, full_check=True)
    assert [n.name for n in part.graph.node] == [n.name for n in model.graph.node[start:stop]]
    assert [i.name for i in part.graph.input] == ["x" if start == 0 else f"v{start - 1}"]
    assert [o.name for o in part.graph.output] == [f"v{stop - 1}"]
    assert parts.movement_only(range(start, stop)) == all(op in MOVEMENT_OPS for op in ops[start:stop])


@given(ops=st.lists(st.sampled_from(_OPS), min_size=2, max_size=10), data=st.data())
def test_joined_nodes_leave_out_another_branch(ops: list[str], data: st.DataObject, tmp_path_factory) -> None:
    """Within a run, the nodes joined to its last node are all of a chain's nodes, and never a side branch that only
    shares the run's input."""
    model = _chain(ops)
    side = onnx.helper.make_node("Relu", [model.graph.node[0].input[0]], ["side"], name="side_branch")
    model.graph.node.insert(1, side)
    model.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [4, 4, 24]))
    parts = Parts(model, Path(tmp_path_factory.mktemp("parts")))
    stop = data.draw(st.integers(3, len(model.graph.node)))
    run = tuple(range(0, stop))
    assert parts.connected_to_last(run) == tuple(k for k in run if k != 1)
