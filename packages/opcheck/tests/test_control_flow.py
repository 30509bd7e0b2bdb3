"""Placeholders and control flow: the static verdict against what the QNN EP does on the HTP simulator.

Each live answer comes from ``qnnx_opcheck.live_check`` (a child process: QNN may stop a process natively), with CPU
fallback disabled, so "the session builds and matches the CPU EP" means QNN ran the whole graph right.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc
from qnnx_opcheck import LiveReport, live_check

pytest.importorskip("onnxruntime_qnn")

F = TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = 13,
) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def _resize(opset: int, *, sizes: bool) -> onnx.ModelProto:
    """Resize as opset 11-13 exporters write it: an empty roi initializer (and, with sizes, an empty scales)."""
    roi = numpy_helper.from_array(np.zeros([0], np.float32), "roi")
    if sizes:
        inits = [
            roi,
            numpy_helper.from_array(np.zeros([0], np.float32), "scales"),
            numpy_helper.from_array(np.array([1, 3, 16, 16], np.int64), "sizes"),
        ]
        names = ["x", "roi", "scales", "sizes"]
    else:
        inits = [roi, numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
        names = ["x", "roi", "scales"]
    return _model(
        [helper.make_node("Resize", names, ["y"], mode="nearest", name="up")],
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 3, 16, 16])],
        inits,
        opset,
    )


def _branch(op: str, name: str) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node(op, ["x"], [name])], name, [], [helper.make_tensor_value_info(name, F, [2, 4])]
    )


def _if(cond_from_shape: bool, else_op: str = "Sigmoid") -> onnx.ModelProto:
    """If(Relu | else_op) on a runtime bool input, or on Shape(x)[0] == 2 (a constant once x is static)."""
    x = helper.make_tensor_value_info("x", F, [2, 4])
    y = helper.make_tensor_value_info("y", F, [2, 4])
    branch = {"then_branch": _branch("Relu", "t"), "else_branch": _branch(else_op, "e")}
    if not cond_from_shape:
        c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
        return _model([helper.make_node("If", ["c"], ["y"], name="choose", **branch)], [x, c], [y])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Equal", ["d0", "two"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], name="choose", **branch),
    ]
    consts = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
    ]
    return _model(nodes, [x], [y], consts)


def _loop() -> onnx.ModelProto:
    """y = x + 3 as a Loop of three Adds."""
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", F, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", F, [2, 4]),
        ],
    )
    inits = [
        numpy_helper.from_array(np.array(3, np.int64), "M"),
        numpy_helper.from_array(np.ones([2, 4], np.float32), "one"),
    ]
    return _model(
        [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="loop")],
        [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info("y", F, [2, 4])],
        inits,
    )


def _static(m: onnx.ModelProto) -> oc.OpCheckReport:
    return oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60)


def _runs_whole_and_right(m: onnx.ModelProto) -> LiveReport:
    return live_check(m, soc_model=60, fallback=False)


@pytest.mark.parametrize(("opset", "sizes"), [(11, False), (13, True)])
def test_resize_with_an_empty_roi_is_accepted_and_qnn_runs_it_right(opset: int, sizes: bool) -> None:
    """An empty roi (and empty scales before sizes) is "not given", not zero-element data: opcheck accepts the
    Resize, and the simulator builds it with CPU fallback off and matches the CPU EP."""
    rep = _static(_resize(opset, sizes=sizes))
    assert rep.supported, rep.summary()
    live = _runs_whole_and_right(_resize(opset, sizes=sizes))
    assert live.whole_on_qnn and live.outputs_match, live.to_dict()


def test_zero_element_data_into_resize_is_still_refused() -> None:
    """The placeholder rule covers the optional inputs only: an empty data tensor is still a crash verdict."""
    roi = numpy_helper.from_array(np.zeros([0], np.float32), "roi")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    m = _model(
        [helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest")],
        [helper.make_tensor_value_info("x", F, [1, 0, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 0, 16, 16])],
        [roi, scales],
    )
    v = _static(m).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "crash")


def test_an_if_on_a_constant_condition_is_checked_as_its_taken_branch() -> None:
    """Shape(x)[0] == 2 is true for a static x: the report has the then-branch's Relu (supported), not the If, and
    the simulator runs the graph whole."""
    rep = _static(_if(cond_from_shape=True, else_op="Erf"))  # the branch not taken would be refused
    assert rep.supported, rep.summary()
    assert [v.op_type for v in rep.verdicts][-1] == "Relu"
    assert any("folds it" in n and "then_branch" in n for n in rep.notes)
    assert _runs_whole_and_right(_if(cond_from_shape=True, else_op="Erf")).outputs_match


def test_an_if_with_free_dims_folds_once_they_are_fixed() -> None:
    """The same If on x['batch', 4]: with --dim batch=3 the condition is false and the else branch is checked."""
    m = _if(cond_from_shape=True, else_op="Erf")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0", free_dims={"batch": 3})
    assert [v.op_type for v in rep.verdicts][-1] == "Erf"
    assert any("else_branch" in n for n in rep.notes)


@pytest.mark.parametrize(("else_op", "supported"), [("Sigmoid", True), ("Erf", False)])
def test_a_runtime_if_is_as_good_as_its_branches(else_op: str, supported: bool) -> None:
    """A runtime If is supported when every branch node is (the QNN EP runs it), refused naming the branch node
    otherwise; the simulator agrees (the session builds with CPU fallback off exactly when opcheck accepts)."""
    v = _static(_if(cond_from_shape=False, else_op=else_op)).verdicts[0]
    assert v.op_type == "If" and (v.status == "supported") is supported, v.reason
    if not supported:
        assert "else_branch Erf" in (v.reason or "") and "CPU EP" in (v.reason or "")
    live = _runs_whole_and_right(_if(cond_from_shape=False, else_op=else_op))
    assert (live.ran and live.outputs_match) is supported, live.to_dict()


def test_a_loop_is_refused_and_the_simulator_agrees() -> None:
    """Loop runs on the CPU EP: opcheck says so, and with CPU fallback off the session fails."""
    v = _static(_loop()).verdicts[0]
    assert (v.op_type, v.status) == ("Loop", "unsupported") and "CPU EP" in (v.reason or "")
    live = _runs_whole_and_right(_loop())
    assert live.session_error is not None and "fallback" in live.session_error


def _if_with_weight(inside: bool) -> onnx.ModelProto:
    """If(c) -> MatMul(x, W) | Relu(x), with W an initializer of the main graph or of the branch itself."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((4, 4), dtype=np.float32), "W")
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2, 4])],
        [w] if inside else [],
    )
    return _model(
        [helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=_branch("Relu", "e"))],
        [helper.make_tensor_value_info("x", F, [2, 4]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, 4])],
        [] if inside else [w],
    )


@pytest.mark.parametrize("inside", [True, False])
def test_a_branch_reading_an_outer_initializer_sends_the_if_to_the_cpu(inside: bool) -> None:
    """A branch MatMul whose weight is an initializer of the main graph makes the QNN EP decline the If (it and both
    branches run on the CPU EP); the same weight inside the branch runs on QNN. opcheck and the simulator agree."""
    v = _static(_if_with_weight(inside)).verdicts[0]
    assert (v.status == "supported") is inside, v.reason
    if not inside:
        assert "initializers of the enclosing graph (W)" in (v.reason or "")
    placed = live_check(_if_with_weight(inside), soc_model=60, fallback=True)
    assert placed.ran and placed.outputs_match, placed.to_dict()
    assert placed.whole_on_qnn is inside, placed.assignment
