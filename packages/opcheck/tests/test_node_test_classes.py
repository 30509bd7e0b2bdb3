"""The verdict classes ONNX's node tests measured on QNN HTP (tools/opcheck/node_tests.py): each rule on the smallest
graph showing it, with the neighbour it leaves vouched for."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, tuple[int, ...]]],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 22,
    out_type: int = F,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _verdict(m: onnx.ModelProto, name: str) -> oc.NodeVerdict:
    report = oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return next(v for v in report.verdicts if v.node_name == name)


def _nll(rank: int, **attrs: object) -> onnx.ModelProto:
    dims = (3, 5, *([2] * (rank - 2)))
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["y"], name="nll", **attrs)
    inputs = {"x": (F, dims), "t": (I64, (dims[0], *dims[2:])), "w": (F, (5,))}
    return _model([node], inputs)


@pytest.mark.parametrize("attrs", [{}, {"reduction": "none"}, {"reduction": "sum", "ignore_index": -1}])
def test_nll_loss_below_rank_5_is_vouched_for(attrs: dict[str, object]) -> None:
    """onnxruntime expands NegativeLogLikelihoodLoss into its function body and the QNN EP takes the body: every
    reduction, with weights and ignore_index, from rank 2 to 4."""
    for rank in (2, 3, 4):
        assert _verdict(_nll(rank, **attrs), "nll").status == "supported", rank


def test_nll_loss_at_rank_5_is_refused() -> None:
    """At rank 5 the body's int64 Unsqueeze of the targets is 5-D and the QNN EP declines the node."""
    v = _verdict(_nll(5), "nll")
    assert (v.status, v.kind) == ("unsupported", "rejected")


def test_gather_elements_by_targets_from_a_graph_input_stays_refused() -> None:
    """The expanded body's GatherElements reads indices straight from a graph input, which may be negative (QNN HTP
    reads those wrongly): only NegativeLogLikelihoodLoss itself, whose targets are class indices, is vouched for."""
    nodes = [
        helper.make_node("Unsqueeze", ["t", "axes"], ["t1"]),
        helper.make_node("GatherElements", ["x", "t1"], ["y"], axis=1, name="gather"),
    ]
    m = _model(nodes, {"x": (F, (3, 5)), "t": (I64, (3,))}, {"axes": np.array([1], np.int64)})
    v = _verdict(m, "gather")
    assert (v.status, v.kind) == ("unsupported", "wrong_result")


def _reduce(axes_runtime: bool, then: str | None = None, noop: int = 0) -> onnx.ModelProto:
    out = "r" if then else "y"
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], [out], keepdims=1, noop_with_empty_axes=noop, name="sum")]
    if then:
        nodes.append(helper.make_node(then, ["r"], ["y"]))
    inputs = {"x": (F, (3, 2, 2))}
    inits = {}
    if axes_runtime:
        inputs["axes"] = (I64, (0,))
    else:
        inits["axes"] = np.zeros((0,), np.int64)
    return _model(nodes, inputs, inits, opset=18)


def test_empty_axes_reduce_every_axis_and_are_no_empty_tensor() -> None:
    """An empty axes input (a constant, or a graph input of shape [0] whose reduction is a graph output) reduces
    every axis: vouched for, not refused as a zero-element tensor."""
    assert _verdict(_reduce(axes_runtime=False), "sum").status == "supported"
    assert _verdict(_reduce(axes_runtime=False, then="Sqrt"), "sum").status == "supported"
    assert _verdict(_reduce(axes_runtime=True), "sum").status == "supported"


def test_runtime_empty_axes_before_another_node_and_noop_stay_refused() -> None:
    """onnxruntime does not infer the shape of a reduction by runtime axes, so the next node fails ("Cannot get
    shape"); with noop_with_empty_axes the QNN EP declines the node."""
    v = _verdict(_reduce(axes_runtime=True, then="Sqrt"), "sum")
    assert (v.status, v.kind) == ("unsupported", "rejected") and "axes" in (v.reason or "")
    assert _verdict(_reduce(axes_runtime=False, noop=1), "sum").status == "unsupported"


def test_a_dropout_onnxruntime_cannot_remove_is_refused() -> None:
    """A Dropout from a graph input to a graph output (onnxruntime cannot join them) or in training mode stays in
    the graph, and the QNN EP declines it; between two ops it is removed."""
    alone = _model([helper.make_node("Dropout", ["x"], ["y"], name="drop")], {"x": (F, (3, 4))})
    assert _verdict(alone, "drop").status == "unsupported"
    training = _model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Dropout", ["a", "r", "t"], ["y"], name="drop")],
        {"x": (F, (3, 4)), "r": (F, ()), "t": (B, ())},
    )
    assert _verdict(training, "drop").status == "unsupported"
    mid = _model(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Dropout", ["a"], ["b"], name="drop"),
            helper.make_node("Sigmoid", ["b"], ["y"]),
        ],
        {"x": (F, (3, 4))},
    )
    assert _verdict(mid, "drop").kind == "removed"


def test_a_sequence_or_optional_value_is_refused() -> None:
    """Identity of a sequence or an optional tensor: the QNN EP cannot map the type to a QNN data type."""
    seq = helper.make_tensor_sequence_value_info("x", F, [2])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id")],
        "g",
        [seq],
        [helper.make_tensor_sequence_value_info("y", F, [2])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=10)
    v = _verdict(m, "id")
    assert v.status == "unsupported" and "sequence" in (v.reason or "")


def test_an_unknown_shape_does_not_hide_a_refusal() -> None:
    """Pad by pads computed from a graph input (CenterCropPad's body): the output shape is unknown, and the runtime
    pads the QNN EP declines still decide the verdict."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Max", ["s", "want"], ["m"]),
        helper.make_node("Sub", ["m", "s"], ["d"]),
        helper.make_node("Concat", ["zero", "d"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad"),
    ]
    m = _model(nodes, {"x": (F, (4, 3)), "want": (I64, (2,))}, {"zero": np.zeros(2, np.int64)}, opset=18)
    v = _verdict(m, "pad")
    assert (v.status, v.kind) == ("unsupported", "rejected") and "pads" in (v.reason or "")


def test_measured_node_conditions() -> None:
    """RMSNormalization over an axis before the last, GatherND with batch_dims and LSTM with a runtime sequence_lens
    are declined by the QNN EP; their plain forms are vouched for."""
    rms = lambda axis: _model(  # noqa: E731
        [helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=axis, name="rms")],
        {"x": (F, (3, 4)), "w": (F, (3, 4) if axis == 0 else (4,))},
        opset=23,
    )
    assert _verdict(rms(0), "rms").status == "unsupported"
    assert _verdict(rms(-1), "rms").status == "supported"
    gnd = lambda batch_dims: _model(  # noqa: E731
        [helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims, name="gnd")],
        {"x": (TensorProto.INT32, (2, 2, 2)), "i": (I64, (2, 1))},
        opset=13,
        out_type=TensorProto.INT32,
    )
    assert _verdict(gnd(1), "gnd").status == "unsupported"
    assert _verdict(gnd(0), "gnd").status == "supported"
    w, r = np.zeros((1, 12, 4), np.float32), np.zeros((1, 12, 3), np.float32)
    lstm = _model(
        [helper.make_node("LSTM", ["x", "w", "r", "", "lens"], ["", "y"], hidden_size=3, name="lstm")],
        {"x": (F, (1, 2, 4)), "lens": (TensorProto.INT32, (2,))},
        {"w": w, "r": r},
    )
    v = _verdict(lstm, "lstm")
    assert v.status == "unsupported" and "sequence_lens" in (v.reason or "")


def test_not_in_an_opset_1_model_is_refused() -> None:
    """The QNN EP declines Not in an opset-1 model (the probe's Not_opset1); at opset 21 it takes it."""
    build = lambda opset: _model(  # noqa: E731
        [helper.make_node("Not", ["x"], ["y"], name="not")], {"x": (B, (3, 4))}, opset=opset, out_type=B
    )
    assert _verdict(build(1), "not").status == "unsupported"
    assert _verdict(build(21), "not").status == "supported"


def test_probed_rotary_embedding_swiglu_and_roialign() -> None:
    """RotaryEmbedding (plain, interleaved, partial rotary dim), SwiGLU and average RoiAlign ran right on the
    simulator; RoiAlign in max mode is declined ("HTP only supports avg pooling mode")."""
    for attrs in ({}, {"interleaved": 1}):
        rope = _model(
            [helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], name="rope", **attrs)],
            {"x": (F, (2, 4, 3, 8)), "c": (F, (50, 4)), "s": (F, (50, 4)), "p": (I64, (2, 3))},
            opset=23,
        )
        assert _verdict(rope, "rope").status == "supported", attrs
    glu = _model(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"], name="glu")], {"a": (F, (2, 4)), "b": (F, (2, 4))}, opset=28
    )
    assert _verdict(glu, "glu").status == "supported"
    for mode, status in (("avg", "supported"), ("max", "unsupported")):
        roi = _model(
            [
                helper.make_node(
                    "RoiAlign", ["x", "rois", "ids"], ["y"], mode=mode, output_height=5, output_width=5, name="roi"
                )
            ],
            {"x": (F, (1, 1, 10, 10)), "rois": (F, (3, 4)), "ids": (I64, (3,))},
        )
        assert _verdict(roi, "roi").status == status, mode


@pytest.mark.parametrize("elem", [TensorProto.INT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.UINT8])
def test_mod_on_narrow_integers_is_refused(elem: int) -> None:
    """Mod on int8, int16, uint16 and uint8 is refused as a wrong result: the node tests' small values ran right,
    but HTP computes it in fp16 (int16 and uint16 wrong from 2049 on, int8 -5 mod 7 = 127; see
    test_measured_defects.py)."""
    mod = helper.make_node("Mod", ["a", "b"], ["y"], name="mod")
    m = _model([mod], {"a": (elem, (2, 3)), "b": (elem, (2, 3))}, out_type=elem)
    v = _verdict(m, "mod")
    assert (v.status, v.kind) == ("unsupported", "wrong_result"), v


@pytest.mark.parametrize(("exponent", "status"), [(3.0, "supported"), (0.5, "unsupported")])
def test_pow_by_a_cast_constant_is_read_through_the_cast(exponent: float, status: str) -> None:
    """gelu_tanh's x^3 writes the exponent as CastLike(constant, x): a whole number is vouched for, a fraction on a
    base that may be negative stays refused."""
    nodes = [
        helper.make_node("CastLike", ["k", "x"], ["kx"]),
        helper.make_node("Pow", ["x", "kx"], ["y"], name="pow"),
    ]
    m = _model(nodes, {"x": (F, (2, 3))}, {"k": np.array(exponent, np.float32)}, opset=20)
    assert _verdict(m, "pow").status == status


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "refused"),
    [(2, 1, 2, True), (4, 3, 2, False), (5, 2, 2, False)],
)
def test_maxpool_whose_last_ceil_window_is_dropped_is_refused(
    size: int, kernel: int, stride: int, refused: bool
) -> None:
    """With ceil_mode, a last window starting past the end of the input is dropped and the QNN EP fails at session
    creation (x[1, 1, 2, 2], kernel 1, stride 2); a last window that starts inside the input is vouched for."""
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], ceil_mode=1, kernel_shape=[kernel] * 2, strides=[stride] * 2, name="pool"
    )
    v = _verdict(_model([node], {"x": (F, (1, 1, size, size))}), "pool")
    assert (v.status == "unsupported") == refused, v


def test_the_gpu_tables_leave_out_ops_run_only_as_function_bodies() -> None:
    """NegativeLogLikelihoodLoss has no QNN EP builder: the HTP table vouches for its expanded body, the GPU tables
    (documented, not measured) do not list it."""
    htp, _ = oc.load_table("htp", "2.7.0", 60)
    gpu, _ = oc.load_table("gpu", "2.7.0")
    assert "::NegativeLogLikelihoodLoss" in htp.ops and "::NegativeLogLikelihoodLoss" not in gpu.ops


@pytest.mark.parametrize("shape", [(1,), (1, 1, 1, 1)])
def test_reshape_to_a_scalar_is_no_empty_tensor_and_qnn_runs_it(shape: tuple[int, ...]) -> None:
    """Reshape by a constant shape of no elements makes a scalar (one element), not an empty tensor: vouched for,
    and the simulator builds it with CPU fallback off and matches the CPU EP."""
    from qnnx_opcheck import live_check

    m = _model(
        [helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"), helper.make_node("Mul", ["r", "r"], ["y"])],
        {"x": (F, shape)},
        {"s": np.zeros((0,), np.int64)},
    )
    assert _verdict(m, "reshape").status == "supported"
    live = live_check(m, soc_model=60, fallback=False)
    assert live.whole_on_qnn and live.outputs_match, live.to_dict()


def test_zero_element_data_into_reshape_is_still_refused() -> None:
    """Only the constant shape input of Reshape may be empty: an empty data tensor is still a crash verdict."""
    m = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        {"x": (F, (0, 3))},
        {"s": np.array([3, 0], np.int64)},
    )
    v = _verdict(m, "reshape")
    assert (v.status, v.kind) == ("unsupported", "crash")


@settings(max_examples=30, deadline=None)
@given(dims=st.lists(st.integers(0, 3), min_size=1, max_size=5), to_scalar=st.booleans())
def test_reshape_is_refused_exactly_when_its_data_has_no_elements(dims: list[int], to_scalar: bool) -> None:
    """Whatever the data's shape, Reshape is refused as a zero-element crash exactly when the data has a dim of 0;
    an empty constant shape (a scalar result) never counts."""
    size = int(np.prod(dims))
    target = np.zeros((0,), np.int64) if to_scalar and size == 1 else np.array([size], np.int64)
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], {"x": (F, tuple(dims))}, {"s": target})
    v = _verdict(m, "reshape")
    assert (v.kind == "crash") == (0 in dims), v


def _scatter(reduction: str, shape: tuple[int, ...] = (4, 6), axis: int = 0) -> onnx.ModelProto:
    ishape = tuple(max(1, d - 1) for d in shape)
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="scatter", axis=axis, reduction=reduction)
    return _model([node], {"x": (F, shape), "u": (F, ishape)}, {"i": np.zeros(ishape, np.int64)}, opset=18)


@settings(max_examples=30, deadline=None)
@given(
    reduction=st.sampled_from(["none", "add", "mul", "max", "min"]),
    shape=st.lists(st.integers(2, 4), min_size=1, max_size=4).map(tuple),
    data=st.data(),
)
def test_scatter_elements_is_refused_exactly_with_a_reduction(
    reduction: str, shape: tuple[int, ...], data: st.DataObject
) -> None:
    """ScatterElements by constant non-negative indices is vouched for with reduction='none' and refused with any
    reduction, whatever the rank and axis (the QNN EP declines the reductions)."""
    axis = data.draw(st.integers(0, len(shape) - 1))
    v = _verdict(_scatter(reduction, shape, axis), "scatter")
    assert (v.status == "supported") == (reduction == "none"), v


def test_scatter_elements_with_a_reduction_does_not_run_whole_on_qnn() -> None:
    """The simulator confirms the refusal: with reduction='add' the session does not build with CPU fallback off,
    with reduction='none' it runs whole and right."""
    from qnnx_opcheck import live_check

    assert not live_check(_scatter("add"), soc_model=60, fallback=False).whole_on_qnn
    live = live_check(_scatter("none"), soc_model=60, fallback=False)
    assert live.whole_on_qnn and live.outputs_match, live.to_dict()


def _pad(mode: str, shape: tuple[int, ...] = (1, 3, 4, 4)) -> onnx.ModelProto:
    pads = np.array([0] * (len(shape) - 2) + [1, 1] + [0] * (len(shape) - 2) + [1, 1], np.int64)
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode=mode)
    return _model([node], {"x": (F, shape)}, {"pads": pads}, opset=21)


@settings(max_examples=20, deadline=None)
@given(mode=st.sampled_from(["wrap", "reflect"]), shape=st.lists(st.integers(2, 5), min_size=2, max_size=4).map(tuple))
def test_a_pad_of_mode_wrap_is_refused_as_declined(mode: str, shape: tuple[int, ...]) -> None:
    """Pad with mode='wrap' (circular padding, as torch.onnx writes F.pad(mode='circular')) is refused as a node the
    QNN EP declines, at any rank; mode='reflect' on the same input stays vouched for."""
    v = _verdict(_pad(mode, shape), "pad")
    if mode == "wrap":
        assert v.status == "unsupported" and v.kind == "rejected" and "wrap" in (v.reason or ""), v
    else:
        assert v.status == "supported", v


def test_a_pad_of_mode_wrap_does_not_run_whole_on_qnn() -> None:
    """The simulator confirms it: with CPU fallback off the session of a wrap Pad does not build; reflect runs whole
    and right."""
    from qnnx_opcheck import live_check

    assert not live_check(_pad("wrap"), soc_model=60, fallback=False).whole_on_qnn
    live = live_check(_pad("reflect"), soc_model=60, fallback=False)
    assert live.whole_on_qnn and live.outputs_match, live.to_dict()
