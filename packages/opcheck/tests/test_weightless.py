"""Weights never reach the ONNX checker or shape inference: verdicts are those of the full model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from opcheck_graphs import const, inp, model, node

import qnnx_opcheck as oc
from qnnx_opcheck import _model

NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


@contextmanager
def _full_model_checked() -> Iterator[None]:
    """check_model as it was before the weightless view: checker and shape inference see every weight."""
    with mock.patch.object(_model, "weightless_view", lambda proto: proto):
        yield


def _report_with_and_without_view(m: onnx.ModelProto, backend: str = "htp") -> tuple[Any, Any]:
    fast = oc.check_model(m, backend, onnxruntime_qnn="2.7.0", soc_model=60)
    with _full_model_checked():
        full = oc.check_model(m, backend, onnxruntime_qnn="2.7.0", soc_model=60)
    return fast, full


def _mixed_model() -> onnx.ModelProto:
    """A 256 KiB MatMul weight, a float16 bias, and the small constants tables read (Reshape, Slice, Pad)."""
    rng = np.random.default_rng(0)
    inits = [
        const("w", rng.standard_normal((64, 1024))),
        const("b", rng.standard_normal(1024)),
        const("shape", [4, 256], np.int64),
        const("starts", [0], np.int64),
        const("ends", [128], np.int64),
        const("axes", [1], np.int64),
        const("pads", [0, 1, 0, 1], np.int64),
    ]
    nodes = [
        node("MatMul", ["x", "w"], ["mm"]),
        node("Add", ["mm", "b"], ["biased"]),
        node("Reshape", ["biased", "shape"], ["r"]),
        node("Slice", ["r", "starts", "ends", "axes"], ["s"]),
        node("Pad", ["s", "pads"], ["y"], mode="reflect"),
    ]
    return model(nodes, [inp("x", [1, 64])], ["y"], inits)


def test_view_drops_only_large_initializers() -> None:
    """The view keeps small and shape-like initializers, types the large ones as inputs, and leaves the model alone."""
    m = _mixed_model()
    before = m.SerializeToString()
    view = _model.weightless_view(m)
    assert m.SerializeToString() == before
    assert {t.name for t in view.graph.initializer} == {"shape", "starts", "ends", "axes", "pads"}
    moved = {vi.name: vi for vi in view.graph.input}
    assert [d.dim_value for d in moved["w"].type.tensor_type.shape.dim] == [64, 1024]
    assert moved["b"].type.tensor_type.elem_type == TensorProto.FLOAT
    assert view.ByteSize() < 4096 < m.ByteSize()
    onnx.checker.check_model(view)


def test_model_without_large_initializers_is_its_own_view() -> None:
    """Nothing to drop: the view is the model itself (no copy)."""
    m = model([node("Relu", ["x"], ["y"])], [inp("x", [2, 3])], ["y"], [const("unused", [1.0])])
    assert _model.weightless_view(m) is m


def test_overridable_initializer_keeps_its_data() -> None:
    """An initializer that is also a graph input stays an initializer: a caller may feed it."""
    w = const("w", np.ones((64, 64)))
    m = model([node("MatMul", ["x", "w"], ["y"])], [inp("x", [2, 64]), inp("w", [64, 64])], ["y"], [w])
    assert _model.weightless_view(m) is m


def test_large_weight_gives_the_report_of_the_full_model() -> None:
    """A model with a large weight gets the same report, verdicts and notes, as when the full model is checked."""
    m = _mixed_model()
    for backend in ("htp", "gpu"):
        fast, full = _report_with_and_without_view(m, backend)
        assert fast == full
        assert len(fast.verdicts) == len(m.graph.node)


def test_weights_are_never_serialized() -> None:
    """The checker and shape inference get models far smaller than the weights; other weight bytes, same report."""
    m = _mixed_model()
    weight_bytes = sum(len(t.raw_data) for t in m.graph.initializer)
    seen: list[int] = []
    real_check, real_infer = onnx.checker.check_model, onnx.shape_inference.infer_shapes

    def check(proto: onnx.ModelProto, *args: Any, **kwargs: Any) -> None:
        seen.append(proto.ByteSize())
        real_check(proto, *args, **kwargs)

    def infer(proto: onnx.ModelProto, *args: Any, **kwargs: Any) -> onnx.ModelProto:
        seen.append(proto.ByteSize())
        return real_infer(proto, *args, **kwargs)

    with (
        mock.patch.object(onnx.checker, "check_model", check),
        mock.patch.object(onnx.shape_inference, "infer_shapes", infer),
    ):
        report = oc.check_model(m, onnxruntime_qnn="2.7.0", soc_model=60)
    assert len(seen) == 2
    assert max(seen) < weight_bytes // 100

    other = onnx.ModelProto()
    other.CopyFrom(m)
    w = next(t for t in other.graph.initializer if t.name == "w")
    w.raw_data = (-numpy_helper.to_array(w)).tobytes()
    assert other.SerializeToString() != m.SerializeToString()
    assert oc.check_model(other, onnxruntime_qnn="2.7.0", soc_model=60) == report


@st.composite
def weighted_graphs(draw: st.DrawFn) -> onnx.ModelProto:
    """A chain of MatMul / Add / Mul / Reshape / Relu whose constant operands are small or large initializers."""
    dtype = draw(st.sampled_from(sorted(NP)))
    width = draw(st.sampled_from([4, 16, 96, 300]))
    x_shape = [draw(st.integers(1, 3)), width]
    nodes, inits, inputs = [], [], [helper.make_tensor_value_info("x", dtype, x_shape)]
    prev, cols = "x", width
    for i in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["MatMul", "Add", "Mul", "Reshape", "Relu"]))
        out = f"v{i}"
        if op == "MatMul":
            n = draw(st.sampled_from([1, 8, 64, 300]))
            inits.append(numpy_helper.from_array(np.full((cols, n), 0.5, NP[dtype]), f"w{i}"))
            nodes.append(helper.make_node(op, [prev, f"w{i}"], [out], name=f"n{i}"))
            cols = n
        elif op in ("Add", "Mul"):
            value = np.full((cols,), draw(st.sampled_from([0.0, 1.0, 2.5])), NP[dtype])
            inits.append(numpy_helper.from_array(value, f"c{i}"))
            if draw(st.booleans()):  # an initializer that is also a graph input (overridable)
                inputs.append(helper.make_tensor_value_info(f"c{i}", dtype, [cols]))
            nodes.append(helper.make_node(op, [prev, f"c{i}"], [out], name=f"n{i}"))
        elif op == "Reshape":
            inits.append(numpy_helper.from_array(np.array([-1, cols], np.int64), f"s{i}"))
            nodes.append(helper.make_node(op, [prev, f"s{i}"], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}"))
        prev = out
    g = helper.make_graph(nodes, "gen", inputs, [helper.make_tensor_value_info(prev, dtype, [None, None])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(m)
    return m


@given(weighted_graphs())
def test_view_never_changes_the_report(m: onnx.ModelProto) -> None:
    """For generated graphs with weights of any size, the report equals the one computed on the full model."""
    fast, full = _report_with_and_without_view(m)
    assert fast == full
