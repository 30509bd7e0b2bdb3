"""Shape classes measured on the HTP simulator (tools/opcheck/conformance.py): RMSNormalization at rank 3-4 by the
dims before the normalized axis, Resize by runtime sizes or scales to a declared output shape."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _verdict(m: onnx.ModelProto) -> oc.NodeVerdict:
    return oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60).verdicts[0]


def _rms(shape: tuple[int, ...]) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones(shape[-1], np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, name="rms")],
        "g",
        [helper.make_tensor_value_info("x", F, list(shape))],
        [helper.make_tensor_value_info("y", F, list(shape))],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


@pytest.mark.parametrize(
    ("shape", "supported"),
    [
        ((2, 3, 5), True),  # test_rms_normalization_3d_axis2_epsilon
        ((2, 3, 4, 5), True),  # test_rms_normalization_4d_axis3
        ((8, 8, 100), True),
        ((1, 1, 8, 16), True),
        ((2, 16, 16), False),  # measured wrong (error 1.0 of the output's scale)
        ((16, 1, 16), False),  # measured wrong
        ((1, 16, 1, 16), False),  # measured wrong
        ((1, 64, 16), False),  # right when measured, but outside the class measured right
        ((1, 2, 3, 4, 16), False),  # rank 5: the EP declines it
    ],
)
def test_rms_normalization_rank_3_4_by_leading_dims(shape: tuple[int, ...], supported: bool) -> None:
    """At ranks 3-4 RMSNormalization is vouched for when every dim before the last is at most 8; with a larger one
    it is refused and the reason names the class."""
    v = _verdict(_rms(shape))
    assert (v.status == "supported") is supported, v.reason
    if not supported and len(shape) < 5:
        assert v.kind == "wrong_result" and f"r{len(shape)}" in (v.reason or "")


@given(leading=st.lists(st.integers(1, 8), min_size=2, max_size=3), last=st.integers(1, 128))
def test_rms_normalization_with_short_leading_dims_is_vouched_for(leading: list[int], last: int) -> None:
    assert _verdict(_rms((*leading, last))).status == "supported"


@given(
    leading=st.lists(st.integers(1, 8), min_size=2, max_size=3),
    big=st.integers(9, 64),
    where=st.integers(0, 2),
    last=st.integers(1, 64),
)
def test_rms_normalization_with_a_long_leading_dim_is_refused(
    leading: list[int], big: int, where: int, last: int
) -> None:
    leading[min(where, len(leading) - 1)] = big
    v = _verdict(_rms((*leading, last)))
    assert (v.status, v.kind) == ("unsupported", "wrong_result")


def _resize(out: tuple[int, ...], given_as: str, value: list[float], runtime: bool, **attrs: object) -> onnx.ModelProto:
    shape = (1, 1, 4, 4)
    inputs = [helper.make_tensor_value_info("x", F, list(shape))]
    inits = []
    arr = np.array(value, np.float32 if given_as == "scales" else np.int64)
    if runtime:
        inputs.append(helper.make_tensor_value_info(given_as, F if given_as == "scales" else I64, [len(value)]))
    else:
        inits.append(numpy_helper.from_array(arr, given_as))
    ins = ["x", "", "scales"] if given_as == "scales" else ["x", "", "", "sizes"]
    graph = helper.make_graph(
        [helper.make_node("Resize", ins, ["y"], name="resize", **attrs)],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", F, list(out))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


@pytest.mark.parametrize(
    ("out", "given_as", "value", "attrs", "supported"),
    [
        ((1, 1, 3, 3), "sizes", [1, 1, 3, 3], {"mode": "cubic"}, True),  # test_resize_downsample_sizes_cubic
        ((1, 1, 9, 10), "sizes", [1, 1, 9, 10], {"mode": "cubic"}, True),  # test_resize_upsample_sizes_cubic
        ((1, 1, 8, 8), "sizes", [1, 1, 8, 8], {"mode": "nearest", "nearest_mode": "ceil"}, False),  # wrong
        ((1, 1, 8, 8), "sizes", [1, 1, 8, 8], {"mode": "nearest", "coordinate_transformation_mode": "half_pixel"},
         True),
        ((1, 1, 8, 8), "scales", [1, 1, 2, 2], {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
         True),
        ((1, 1, 8, 8), "scales", [1, 1, 2, 2], {"mode": "linear"}, False),  # half_pixel reads the scale itself
        ((1, 1, 8, 8), "scales", [1, 1, 2, 2], {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
         False),  # the EP declines cubic by runtime scales
        ((1, 1, 1, 2), "sizes", [1, 1, 1, 2], {"mode": "linear"}, False),  # to one element: not measured
    ],
    ids=["cubic-down", "cubic-frac", "nearest-ceil-up", "nearest-up", "align-corners-scales", "half-pixel-scales",
         "cubic-scales", "to-one"],
)  # fmt: skip
def test_resize_by_runtime_sizes_or_scales(
    out: tuple[int, ...], given_as: str, value: list[float], attrs: dict[str, object], supported: bool
) -> None:
    """A Resize by runtime sizes (or runtime scales under align_corners) to a declared output shape is its own class
    of the size change, vouched for where it was measured right; runtime scales under other modes stay refused."""
    v = _verdict(_resize(out, given_as, value, True, **attrs))
    assert (v.status == "supported") is supported, v.reason
    if not supported:
        assert "Resize" in (v.reason or "")


def test_resize_to_one_element_is_its_own_class() -> None:
    """A constant Resize of an axis down to one element was never measured (ONNX's align_corners divides by out - 1
    there), so it is no longer vouched for as a whole-factor downsample."""
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    v = _verdict(_resize((1, 1, 1, 2), "sizes", [1, 1, 1, 2], False, **attrs))
    assert v.status == "unsupported" and "to1" in (v.reason or "")
    assert _verdict(_resize((1, 1, 2, 2), "sizes", [1, 1, 2, 2], False, **attrs)).status == "supported"
