"""Graphs built to contain each known QNN hazard get the right verdict (HTP, onnxruntime-qnn 2.7.0).

The verdicts here are what the live EP did in the probe; test_live_tables.py re-checks the live EP.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from opcheck_graphs import const, inp, model, node, unary
from opcheck_graphs import const as const_init

import qnnx_opcheck as oc

I64 = TensorProto.INT64
I32 = TensorProto.INT32
BOOL = TensorProto.BOOL


def _check(m: object, backend: str = "htp") -> oc.OpCheckReport:
    return oc.check_model(m, backend, onnxruntime_qnn="2.7.0", soc_model=60)


def _by_name(rep: oc.OpCheckReport) -> dict[str, oc.NodeVerdict]:
    return {v.node_name: v for v in rep.verdicts}


def test_erf_alone_is_unsupported() -> None:
    """A standalone Erf is rejected by the QNN EP."""
    v = _check(unary("Erf")).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "rejected")
    assert "Erf" in (v.reason or "")
    assert "case Erf/float32" in (v.evidence or "")


@pytest.mark.parametrize("form", ["div", "mul"])
def test_erf_inside_gelu_pattern_is_supported(form: str) -> None:
    """Erf inside x*0.5*(1+erf(x/sqrt2)) is fused by the QNN EP into Gelu: supported."""
    first = node("Div", ["x", "k"], ["d"]) if form == "div" else node("Mul", ["x", "k"], ["d"], name="scale")
    k = 1.4142135 if form == "div" else 0.70710677
    m = model(
        [
            first,
            node("Erf", ["d"], ["e"]),
            node("Add", ["e", "one"], ["a"]),
            node("Mul", ["x", "a"], ["p"]),
            node("Mul", ["p", "half"], ["y"], name="half_mul"),
        ],
        [inp("x", [2, 8])],
        ["y"],
        [const("k", k), const("one", 1.0), const("half", 0.5)],
    )
    rep = _check(m)
    assert rep.supported
    assert _by_name(rep)["erf"].kind == "fused"


def test_erf_with_other_constant_is_not_gelu() -> None:
    """Erf(x/3) + 1 is not GELU: Erf stays unsupported."""
    m = model(
        [
            node("Div", ["x", "k"], ["d"]),
            node("Erf", ["d"], ["e"]),
            node("Add", ["e", "one"], ["a"]),
            node("Mul", ["x", "a"], ["p"]),
            node("Mul", ["p", "half"], ["y"], name="m2"),
        ],
        [inp("x", [2, 8])],
        ["y"],
        [const("k", 3.0), const("one", 1.0), const("half", 0.5)],
    )
    assert _by_name(_check(m))["erf"].status == "unsupported"


def test_gathernd_on_bool_is_unsupported() -> None:
    """GatherND on bool data (BERT's attention-mask path) is rejected."""
    m = model(
        [node("GatherND", ["x", "i"], ["y"])],
        [inp("x", [2, 3, 4], BOOL)],
        ["y"],
        [const("i", [[0, 1], [1, 2]], np.int64)],
    )
    v = _check(m).verdicts[0]
    assert v.status == "unsupported" and v.dtype == "bool"


def test_unsqueeze_int64_to_5d_crashes() -> None:
    """Unsqueeze of runtime int64 data to a 5-D output crashes the process: unsupported, kind crash."""
    m = model(
        [node("Unsqueeze", ["x", "ax"], ["y"])], [inp("x", [2, 3, 4, 5], I64)], ["y"], [const("ax", [2], np.int64)]
    )
    v = _check(m).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "crash")
    assert "crash" in (v.reason or "")


def test_unsqueeze_int64_to_4d_runs() -> None:
    """Unsqueeze of int64 data to 4-D runs on QNN (the crash needs a 5-D output), with the int64 caveat."""
    m = model([node("Unsqueeze", ["x", "ax"], ["y"])], [inp("x", [2, 3, 4], I64)], ["y"], [const("ax", [1], np.int64)])
    rep = _check(m)
    assert rep.supported
    assert rep.verdicts[0].kind == "caveat"


def test_unsqueeze_int64_on_constants_is_folded() -> None:
    """Shape arithmetic on int64 constants is folded by ORT before QNN sees it: supported."""
    m = model(
        [
            node("Unsqueeze", ["shp", "ax"], ["u"]),
            node("Squeeze", ["u", "ax"], ["u2"]),
            node("Reshape", ["x", "u2"], ["y"]),
        ],
        [inp("x", [2, 3, 4, 5])],
        ["y"],
        [const("shp", [6, 20], np.int64), const("ax", [0], np.int64)],
    )
    rep = _check(m)
    assert rep.supported
    assert _by_name(rep)["unsqueeze"].kind == "constant_folded"


def test_group_normalization_opset21_matches_probe() -> None:
    """GroupNormalization (opset 21) is reported as the 2.7.0 probe found it: it runs with soc_model 60.

    An earlier probe (onnxruntime-qnn 2.7.0) saw a session-creation failure; this probe's
    shapes and the live re-check in test_live_tables.py do not reproduce it.
    """
    m = model(
        [node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
        [inp("x", [1, 4, 4, 4])],
        [_vi("y", [1, 4, 4, 4])],
        [const("s", np.ones(4)), const("b", np.zeros(4))],
    )
    v = _check(m).verdicts[0]
    table, _ = oc.load_table("htp", "2.7.0", 60)
    plain = next(x for x in table.entry("", "GroupNormalization")["variants"] if not x["when"])
    expected = "supported" if plain["dtypes"]["float32"]["status"] == "supported" else "unsupported"
    assert v.status == expected


def _vi(name: str, shape: list[int]) -> object:
    from onnx import helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_resize_on_int32_fails_session_creation() -> None:
    """Resize on integer data fails session creation even with CPU fallback (layout transformer)."""
    m = model(
        [node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
        [inp("x", [1, 4, 4, 4], I32)],
        ["y"],
        [const("sc", [1, 1, 2, 2])],
    )
    v = _check(m).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "session_error")


def test_slice_step2_int32_fails_finalize_but_step1_runs() -> None:
    """Strided Slice on int32 fails at finalize; the same Slice with step 1 is supported."""

    def sl(step: int) -> object:
        return model(
            [node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
            [inp("x", [2, 3, 4], I32)],
            ["y"],
            [
                const("s", [0], np.int64),
                const("e", [4], np.int64),
                const("a", [2], np.int64),
                const("st", [step], np.int64),
            ],
        )

    assert _check(sl(2)).verdicts[0].kind == "finalize_error"
    assert _check(sl(1)).verdicts[0].status == "supported"


def _add_ln(batch: int, const_shape: tuple[int, ...], op: str = "Add") -> object:
    rng = np.random.default_rng(0)
    return model(
        [
            node(op, ["x", "pos"], ["a"], name="embed_add"),
            node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1, name="ln"),
        ],
        [inp("x", [batch, 16, 64])],
        ["y"],
        [const("pos", rng.standard_normal(const_shape)), const("g", np.ones(64)), const("b", np.zeros(64))],
    )


def test_add_broadcast_const_into_layernorm_is_wrong_result() -> None:
    """Add(x[4,...], const[1,...]) -> LayerNormalization computes wrongly on HTP: the Add is unsupported."""
    rep = _check(_add_ln(4, (1, 16, 64)))
    v = _by_name(rep)["embed_add"]
    assert (v.status, v.kind) == ("unsupported", "wrong_result")
    assert "tile" in (v.reason or "").lower()
    assert _by_name(rep)["ln"].status == "supported"


@pytest.mark.parametrize(("batch", "shape"), [(1, (1, 16, 64)), (4, (64,)), (4, (4, 16, 64))])
def test_add_const_layernorm_safe_forms(batch: int, shape: tuple[int, ...]) -> None:
    """Batch 1, a rank-1 constant, or a full-batch constant are not the bug: supported."""
    assert _check(_add_ln(batch, shape)).supported


def test_rmsnorm_weight_first_fails_finalize() -> None:
    """RMSNorm as Mul(weight, x * 1/sqrt(mean(x^2)+eps)) fails at finalize: the weight Mul is unsupported."""
    rng = np.random.default_rng(0)
    m = model(
        [
            node("Pow", ["x", "two"], ["p"]),
            node("ReduceMean", ["p", "axes"], ["mean"], keepdims=1),
            node("Add", ["mean", "eps"], ["a"]),
            node("Sqrt", ["a"], ["s"]),
            node("Reciprocal", ["s"], ["r"]),
            node("Mul", ["x", "r"], ["n"], name="norm_mul"),
            node("Mul", ["w", "n"], ["y"], name="weight_mul"),
        ],
        [inp("x", [2, 8, 32])],
        ["y"],
        [const("two", 2.0), const("axes", [-1], np.int64), const("eps", 1e-6), const("w", rng.uniform(0.5, 1.5, 32))],
    )
    rep = _check(m)
    assert [v.node_name for v in rep.unsupported] == ["weight_mul"]
    assert rep.unsupported[0].kind == "finalize_error"


def test_symbolic_input_dims_are_unsupported() -> None:
    """Nodes on a tensor with a symbolic batch dim are rejected (QNN needs static shapes); the reason and a note
    name the opcheck flag that fixes it."""
    rep = _check(unary("Relu", shape=("batch", 8)))  # type: ignore[arg-type]
    assert not rep.supported
    assert "symbolic" in (rep.verdicts[0].reason or "")
    assert "--dim" in (rep.verdicts[0].reason or "")
    assert any("--dim" in n and "free_dims" in n for n in rep.notes)


def test_rank6_is_unsupported() -> None:
    """A rank-6 elementwise node is rejected by QNN HTP (rank <= 5)."""
    v = _check(unary("Relu", shape=(1, 2, 1, 2, 1, 3))).verdicts[0]
    assert v.status == "unsupported"


def test_non_default_domain_is_unsupported_unless_listed() -> None:
    """A com.microsoft op not in the table is unsupported, with a reason naming the domain."""
    m = model(
        [node("FusedGelu", ["x"], ["y"], domain="com.microsoft")],
        [inp("x", [2, 3])],
        [_vi("y", [2, 3])],
        extra_opsets=[("com.microsoft", 1)],
    )
    v = _check(m).verdicts[0]
    assert v.status == "unsupported" and v.domain == "com.microsoft"
    assert "com.microsoft" in (v.reason or "")


def test_gpu_lists_com_microsoft_matmulnbits() -> None:
    """The GPU table lists com.microsoft::MatMulNBits (documented GPU op); HTP does not."""
    t, _ = oc.load_table("gpu", "2.7.0")
    assert t.entry("com.microsoft", "MatMulNBits") is not None
    t, _ = oc.load_table("htp", "2.7.0", 60)
    assert t.entry("com.microsoft", "MatMulNBits") is None


def test_int64_arithmetic_is_a_hazard() -> None:
    """int64 Add runs on HTP but saturates at int32: hazard, not unsupported."""
    m = model([node("Add", ["x", "z"], ["y"])], [inp("x", [4], I64), inp("z", [4], I64)], ["y"])
    rep = _check(m)
    assert rep.supported
    assert [v.kind for v in rep.hazards] == ["caveat"]
    assert "int32" in (rep.hazards[0].reason or "")


def test_cast_float_to_int64_is_rejected() -> None:
    """Cast float32 -> int64 is declined by the QNN EP."""
    v = _check(unary("Cast", to=TensorProto.INT64)).verdicts[0]
    assert v.status == "unsupported"


def test_qdq_relu_is_supported_as_quantized_op() -> None:
    """DQ(uint8) -> Relu -> Q uses the table's qdq_uint8 entry and is supported."""
    m = model(
        [
            node("DequantizeLinear", ["x", "s", "z"], ["d"]),
            node("Relu", ["d"], ["r"]),
            node("QuantizeLinear", ["r", "s", "z"], ["y"]),
        ],
        [inp("x", [2, 8], TensorProto.UINT8)],
        ["y"],
        [const("s", 0.02), const("z", 128, np.uint8)],
    )
    rep = _check(m)
    assert rep.supported
    assert _by_name(rep)["relu"].dtype == "qdq_uint8"


def test_qdq_erf_is_unsupported() -> None:
    """DQ -> Erf -> Q is unsupported (Erf has no QNN builder), and its DQ and Q go to the CPU EP with it."""
    m = model(
        [
            node("DequantizeLinear", ["x", "s", "z"], ["d"]),
            node("Erf", ["d"], ["r"]),
            node("QuantizeLinear", ["r", "s", "z"], ["y"]),
        ],
        [inp("x", [2, 8], TensorProto.UINT8)],
        ["y"],
        [const("s", 0.02), const("z", 128, np.uint8)],
    )
    rep = _check(m)
    assert [v.op_type for v in rep.unsupported] == ["DequantizeLinear", "Erf", "QuantizeLinear"]
    assert _by_name(rep)["erf"].kind == "rejected"
    assert all("node unit of Erf 'erf'" in (v.reason or "") for v in rep.unsupported if v.op_type != "Erf")


def test_dropout_in_inference_graph_is_removed() -> None:
    """An inference Dropout (mask unused) is removed by ORT before partitioning: supported."""
    m = model(
        [node("Relu", ["x"], ["a"]), node("Dropout", ["a"], ["b"]), node("Sigmoid", ["b"], ["y"])],
        [inp("x", [2, 8])],
        ["y"],
    )
    rep = _check(m)
    assert rep.supported
    assert _by_name(rep)["dropout"].kind == "removed"


def test_unknown_dtype_is_decided_from_the_table() -> None:
    """With an untyped input: Erf (never supported) is unsupported; Relu (float only) is a hazard, not unsupported."""
    from onnx import helper

    m = model(
        [node("Custom", ["x"], ["c"], domain="my.ops"), node("Relu", ["c"], ["r"]), node("Erf", ["c"], ["e"])],
        [inp("x", [2, 3])],
        [_vi("r", [2, 3]), _vi("e", [2, 3])],
        extra_opsets=[("my.ops", 1)],
    )
    del helper  # only the builder's import side effect is needed
    rep = _by_name(_check(m))
    assert rep["relu"].status == "hazard" and rep["relu"].kind == "unknown_dtype"
    assert rep["erf"].status == "unsupported"
    assert rep["custom"].status == "unsupported"


def test_every_unsupported_verdict_has_a_reason() -> None:
    """Unsupported and hazard verdicts always carry a reason; table-backed ones carry evidence."""
    m = model(
        [node("Erf", ["x"], ["a"]), node("Softsign", ["a"], ["b"]), node("Celu", ["b"], ["y"])],
        [inp("x", [2, 3])],
        ["y"],
    )
    for v in _check(m).verdicts:
        assert v.status == "unsupported" and v.reason and v.evidence


def test_numpy_helper_roundtrip_unused() -> None:
    """Constants built by the test helpers are real initializers (guards the helpers themselves)."""
    m = unary("Relu")
    assert not m.graph.initializer
    t = const("c", [1.0, 2.0])
    assert numpy_helper.to_array(t).tolist() == [1.0, 2.0]


# fp16 semantics and attribute-dependent defects (measured 2026-12-01 against ORT's CPU EP) ------------------------


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round"])
def test_discontinuous_float_ops_are_refused(op: str) -> None:
    """Floor/Ceil/Round on a float input are refused: fp16 rounding of the input flips whole steps."""
    v = _check(unary(op)).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "wrong_result")
    assert "fp16" in (v.reason or "")


def test_discontinuous_ops_on_integers_stay_supported() -> None:
    """ArgMax on int32 and a Cast int32 -> float are exact on HTP: no fp16 rule applies."""
    assert _check(unary("ArgMax", dtype=I32)).supported
    cast = model([node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], [inp("x", [2, 3], I32)], ["y"])
    assert _check(cast).supported


@pytest.mark.parametrize(("to", "refused"), [(TensorProto.INT32, True), (TensorProto.FLOAT16, False)])
def test_cast_from_float_refused_only_to_integers(to: int, refused: bool) -> None:
    """Cast float -> int32 truncates an fp16-rounded value (refused); float -> float16 is fine."""
    m = model([node("Cast", ["x"], ["y"], to=to)], [inp("x", [2, 3])], ["y"])
    assert _check(m).supported is not refused


def test_topk_on_float_is_refused_and_argmax_is_not() -> None:
    """TopK on float is refused (values equal in fp16 reorder the indices); ArgMax stays on the NPU (a different
    pick only happens between values within fp16 noise of each other)."""
    m = model([node("TopK", ["x", "k"], ["v", "i"])], [inp("x", [2, 8])], ["v", "i"], [const("k", [3], np.int64)])
    v = _by_name(_check(m))["topk"]
    assert (v.status, v.kind) == ("unsupported", "wrong_result")
    assert _check(unary("ArgMax")).supported


@pytest.mark.parametrize(("exponent", "refused"), [(2.0, False), ([2.0, 3.0, 1.0], False), (0.5, True), (None, True)])
def test_pow_exponent_must_be_whole_constant(exponent: object, refused: bool) -> None:
    """Pow with a runtime or fractional exponent is refused (HTP returns numbers where PyTorch gives NaN)."""
    inputs = [inp("x", [2, 3])]
    inits = []
    if exponent is None:
        inputs.append(inp("e", [2, 3]))
    else:
        inits.append(const("e", exponent))
    m = model([node("Pow", ["x", "e"], ["y"])], inputs, ["y"], inits)
    v = _by_name(_check(m))["pow"]
    assert (v.status == "unsupported") is refused
    if refused:
        assert v.kind == "wrong_result"


def _resize(shape: list[int], scales: list[float] | None, sizes: list[int] | None = None, **attrs: object) -> object:
    ins = ["x", "", "scales" if scales else "", "sizes" if sizes else ""]
    inits = [const("scales", scales)] if scales else []
    if sizes:
        inits.append(const("sizes", sizes, np.int64))
    return model([node("Resize", ins, ["y"], **attrs)], [inp("x", shape)], ["y"], inits)


@pytest.mark.parametrize(
    ("shape", "scales", "sizes", "attrs", "refused"),
    [
        ([1, 2, 4, 4], [1, 1, 2, 2], None, {"mode": "nearest"}, False),
        ([1, 2, 4, 4], [1, 1, 1.7, 1.7], None, {"mode": "nearest"}, True),
        ([1, 2, 4, 4], [1, 1, 1.7, 1.7], None, {"mode": "linear"}, True),
        (
            [1, 2, 4, 4],
            [1, 1, 1.7, 1.7],
            None,
            {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
            False,
        ),
        ([1, 2, 4, 4], None, [1, 2, 6, 6], {"mode": "linear"}, False),
        ([1, 2, 4, 4, 4], [1, 1, 2, 2, 2], None, {"mode": "linear"}, True),
    ],
    ids=["x2-nearest", "x1.7-nearest", "x1.7-linear", "x1.7-align-corners", "sizes", "trilinear"],
)
def test_resize_scale_conditions(
    shape: list[int], scales: list[float] | None, sizes: list[int] | None, attrs: dict[str, object], refused: bool
) -> None:
    """Resize is vouched for only where HTP's output/input scale equals ONNX's (and never trilinear)."""
    v = _check(_resize(shape, scales, sizes, **attrs)).verdicts[0]
    assert (v.status == "unsupported") is refused, v.reason
    if refused:
        assert v.kind == "wrong_result"


@pytest.mark.parametrize(
    ("shape", "attrs", "refused"),
    [
        ([1, 2, 7, 7], {"kernel_shape": [3, 3], "strides": [2, 2]}, False),
        ([1, 2, 7, 7], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]}, False),
        ([1, 2, 7, 7], {"kernel_shape": [3, 3], "ceil_mode": 1, "count_include_pad": 1, "pads": [1, 1, 1, 1]}, True),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, True),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}, True),
        ([1, 2, 4, 4, 4], {"kernel_shape": [2, 2, 2]}, False),
        ([1, 2, 3, 4, 4], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "count_include_pad": 1}, True),
    ],
    ids=[
        "plain",
        "ceil-whole-windows",
        "ceil-and-count-pad",
        "ceil-partial-window",
        "pad-half-kernel",
        "3d",
        "3d-count-pad",
    ],
)
def test_averagepool_conditions(shape: list[int], attrs: dict[str, object], refused: bool) -> None:
    """AveragePool is refused under the measured defects: a ceil_mode window hanging over the end, padding with
    count_include_pad (or count_include_pad at rank 5), a pad of half the kernel."""
    v = _check(model([node("AveragePool", ["x"], ["y"], **attrs)], [inp("x", shape)], ["y"])).verdicts[0]
    assert (v.status == "unsupported") is refused, v.reason


_PAD_ENDS = st.integers(1, 5).flatmap(
    lambda rank: st.tuples(
        st.lists(st.integers(0, 2), min_size=rank, max_size=rank),
        st.lists(st.integers(0, 2), min_size=rank, max_size=rank),
    )
)


@given(_PAD_ENDS, st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]), st.integers(1, 40))
def test_a_float_pad_is_refused_exactly_where_htp_leaves_its_ends_unwritten(
    pads: tuple[list[int], list[int]], dtype: int, last: int
) -> None:
    """Property: a constant float Pad is refused as a wrong result exactly when it pads the end of the last axis (or
    is a float16 Pad of rank 5), whatever its last dim and the other pads; every other Pad stays vouched for."""
    begin, end = pads
    rank = len(end)
    shape = [2] * (rank - 1) + [last]
    value = np.array(0.5, np.float16 if dtype == TensorProto.FLOAT16 else np.float32)
    inits = [const_init("pads", np.array(begin + end, np.int64), np.int64), numpy_helper.from_array(value, "v")]
    m = model([node("Pad", ["x", "pads", "v"], ["y"], mode="constant")], [inp("x", shape, dtype)], ["y"], inits)
    v = _check(m).verdicts[0]
    class_ = end[-1] > 0
    if dtype == TensorProto.FLOAT16 and rank >= 5:
        class_ = any(begin + end)
    if class_:
        assert (v.status, v.kind) == ("unsupported", "wrong_result") and "end of the last axis" in (v.reason or "")
    else:
        assert v.status == "supported", v.reason


def test_pad_unwritten_ends_names_its_fix() -> None:
    """F.pad(x, (0, 2, 0, 1)) as torch.onnx writes it: refused with the pass that rewrites it named."""
    inits = [const_init("pads", np.array([0, 0, 1, 2], np.int64), np.int64), const_init("v", 0.5)]
    m = model([node("Pad", ["x", "pads", "v"], ["y"])], [inp("x", [1, 3])], ["y"], inits)
    v = _check(m).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "wrong_result")
    assert "float_pad_ends_as_concat" in (v.reason or "") and "2026-12-07" in (v.evidence or "")


def test_tan_is_refused() -> None:
    """Tan on HTP is off by 1.6e-2 of the scale even away from its poles: refused."""
    v = _check(unary("Tan")).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "wrong_result")


@pytest.mark.parametrize(
    ("const", "negative", "refused"), [(True, False, False), (True, True, True), (False, False, True)]
)
def test_gather_elements_indices(const: bool, negative: bool, refused: bool) -> None:
    """GatherElements is vouched for only with constant, non-negative indices (runtime negatives are wrong)."""
    idx = np.array([[0, 2], [1, 0]], np.int64) - (3 if negative else 0)
    inputs = [inp("x", [2, 3])]
    inits = [const_init("i", idx)] if const else []
    if not const:
        inputs.append(inp("i", [2, 2], I64))
    m = model([node("GatherElements", ["x", "i"], ["y"], axis=1)], inputs, ["y"], inits)
    assert (_check(m).verdicts[0].status == "unsupported") is refused


def _position_ids_gather(steps: list[str]) -> onnx.ModelProto:
    """GatherElements of a [1, 8] buffer by indices computed from token ids as RoBERTa-style models count positions:
    ``Cast(ids != pad)``, then ``steps`` (each an op applied to the running value), then ``+ pad``."""
    nodes = [
        node("Equal", ["ids", "pad"], ["is_pad"]),
        node("Not", ["is_pad"], ["mask_b"]),
        node("Cast", ["mask_b"], ["v0"], to=TensorProto.INT64),
    ]
    for k, op in enumerate(steps):
        ins = {
            "CumSum": [f"v{k}", "axis"],
            "Mul": [f"v{k}", "v0"],
            "Sub": [f"v{k}", "one"],
            "Neg": [f"v{k}"],
            "Where": ["mask_b", f"v{k}", "one"],
        }[op]
        nodes.append(node(op, ins, [f"v{k + 1}"], name=f"step{k}"))
    nodes += [
        node("Add", [f"v{len(steps)}", "pad"], ["pos"]),
        node("GatherElements", ["buf", "pos"], ["y"], axis=1),
    ]
    inits = [
        const_init("pad", np.array(1, np.int64), np.int64),
        const_init("one", np.array(1, np.int64), np.int64),
        const_init("axis", np.array(1, np.int64), np.int64),
    ]
    return model(nodes, [inp("ids", [1, 8], I64), inp("buf", [1, 16])], ["y"], inits)


@pytest.mark.parametrize(
    ("steps", "refused"),
    [
        (["CumSum", "Mul"], False),  # RoBERTa / XLM-R: (cumsum(mask) * mask) + pad
        (["CumSum", "Where"], False),
        (["CumSum", "Sub"], True),
        (["Neg"], True),
    ],
)
def test_gather_elements_by_position_ids_counted_from_a_mask(steps: list[str], refused: bool) -> None:
    """Indices computed from a comparison (0/1), a running sum and products of values >= 0 cannot be negative, so
    GatherElements by them is vouched for (RoBERTa's token type ids gathered by position ids); a Sub or Neg on the
    way may make them negative: refused."""
    verdicts = _by_name(_check(_position_ids_gather(steps)))
    assert (verdicts["gatherelements"].status == "unsupported") is refused, verdicts["gatherelements"].reason


@pytest.mark.parametrize(("op", "refused"), [("ArgMax", False), ("ArgMin", False), ("Neg", True)])
def test_gather_elements_by_an_argmax_is_vouched_for(op: str, refused: bool) -> None:
    """GatherElements by an ArgMax/ArgMin of the same scores (a router's ``scores.gather(-1, max_ind)``) is vouched
    for: positions are never negative; indices negated on the way still are refused."""
    pick = [node(op, ["x"], ["i"], axis=1, keepdims=1)]
    if op == "Neg":
        pick = [node("ArgMax", ["x"], ["p"], axis=1, keepdims=1), node("Neg", ["p"], ["i"])]
    m = model([*pick, node("GatherElements", ["x", "i"], ["y"], axis=1)], [inp("x", [2, 5])], ["y"])
    verdicts = _by_name(_check(m))
    assert (verdicts["gatherelements"].status == "unsupported") is refused, verdicts["gatherelements"].reason


@given(steps=st.lists(st.sampled_from(["CumSum", "Mul", "Where", "Sub", "Neg"]), max_size=5))
def test_position_ids_are_vouched_for_exactly_when_no_step_can_go_negative(steps: list[str]) -> None:
    """Over random chains of steps from a mask to GatherElements' indices: vouched for exactly when no step can
    make a value negative (Sub, Neg), whatever the order."""
    verdicts = _by_name(_check(_position_ids_gather(steps)))
    assert (verdicts["gatherelements"].status == "unsupported") is any(s in ("Sub", "Neg") for s in steps)


@pytest.mark.parametrize("runtime", [False, True])
def test_slice_parameters_must_be_constant(runtime: bool) -> None:
    """Slice with runtime starts is refused (QNN declines it); with constants it is supported."""
    inputs = [inp("x", [4, 6])]
    inits = [const_init(n, np.array([v], np.int64)) for n, v in (("e", 3), ("a", 1))]
    if runtime:
        inputs.append(inp("s", [1], I64))
    else:
        inits.append(const_init("s", np.array([1], np.int64)))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])
    m = model([node("Slice", ["x", "s", "e", "a"], ["y"])], inputs, [out], inits)
    assert (_check(m).verdicts[0].status == "unsupported") is runtime


@pytest.mark.parametrize(("value", "refused"), [(-np.inf, True), (-1e4, False)])
def test_comparison_with_infinity_is_refused(value: float, refused: bool) -> None:
    """Equal(x, -inf) is refused (HTP saturates -inf); a finite constant is fine."""
    m = model([node("Equal", ["x", "c"], ["y"])], [inp("x", [2, 3])], ["y"], [const_init("c", value)])
    assert (_check(m).verdicts[0].status == "unsupported") is refused


def test_infinity_mask_before_softmax_is_supported() -> None:
    """A -inf mask added before Softmax (attention) is not refused: the saturated value still masks."""
    m = model(
        [node("Where", ["c", "ninf", "x"], ["w"]), node("Softmax", ["w"], ["y"])],
        [inp("x", [2, 3]), inp("c", [2, 3], BOOL)],
        ["y"],
        [const_init("ninf", -np.inf)],
    )
    assert _check(m).supported


@pytest.mark.parametrize(
    ("reader", "refused"),
    [
        ([node("ArgMax", ["w"], ["y"], axis=1, keepdims=0)], False),
        ([node("TopK", ["w", "k"], ["v", "i"], axis=1), node("GatherElements", ["x", "i"], ["y"], axis=1)], False),
        ([node("ReduceMax", ["w", "ax"], ["y"], keepdims=0)], True),
    ],
    ids=["argmax", "topk-indices", "reducemax"],
)
def test_an_infinity_mask_read_only_through_indices_is_supported(reader: list, refused: bool) -> None:
    """A router's -inf mask (Where(c, -inf, x)) whose only path to the output is integer indices (ArgMax, TopK's
    indices gathering unmasked values) is not refused: indices hold no infinity; its maximum, a float that can be
    -inf, still is."""
    m = model(
        [node("Where", ["c", "ninf", "x"], ["w"], name="mask"), *reader],
        [inp("x", [2, 4]), inp("c", [2, 4], BOOL)],
        ["y"],
        [const_init("ninf", -np.inf), const_init("k", [2], np.int64), const_init("ax", [1], np.int64)],
    )
    assert (_by_name(_check(m))["mask"].status == "unsupported") is refused


@pytest.mark.parametrize(("then", "refused"), [("Greater", False), ("Identity", True)])
def test_a_clamp_by_a_masked_maximum_is_refused_only_where_an_infinity_reaches_the_output(
    then: str, refused: bool
) -> None:
    """Max(|x|, max(x masked with -inf)) (Phi-MoE's router) computes PyTorch's value saturated on HTP: vouched for
    when the result feeds a comparison through a Div, refused when it can carry the -inf to a graph output."""
    tail = [node("Div", ["x", "clamp"], ["d"]), node("Greater", ["d", "eps"], ["y"])]
    if then == "Identity":
        tail = [node("Identity", ["clamp"], ["y"])]
    m = model(
        [
            node("Where", ["c", "ninf", "x"], ["w"]),
            node("ReduceMax", ["w", "ax"], ["m"], keepdims=1),
            node("Abs", ["x"], ["a"]),
            node("Max", ["a", "m"], ["clamp"], name="clamp"),
            *tail,
        ],
        [inp("x", [2, 4]), inp("c", [2, 4], BOOL)],
        ["y"],
        [const_init("ninf", -np.inf), const_init("ax", [1], np.int64), const_init("eps", 0.01)],
    )
    assert (_by_name(_check(m))["clamp"].status == "unsupported") is refused


@pytest.mark.parametrize(("dilations", "refused"), [([1, 1], False), ([2, 2], True)])
def test_convtranspose_dilation(dilations: list[int], refused: bool) -> None:
    """ConvTranspose with a dilation above 1 is refused (QNN declines it); pads and strides are fine."""
    w = const_init("w", np.ones((2, 3, 3, 3), np.float32))
    m = model(
        [
            node(
                "ConvTranspose",
                ["x", "w"],
                ["y"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                dilations=dilations,
            )
        ],
        [inp("x", [1, 2, 5, 5])],
        ["y"],
        [w],
    )
    assert (_check(m).verdicts[0].status == "unsupported") is refused


@given(
    strides=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    pads=st.lists(st.integers(0, 1), min_size=6, max_size=6),
)
def test_convtranspose_3d_defects(strides: list[int], pads: list[int]) -> None:
    """A 3-D ConvTranspose is refused exactly when QNN HTP computes it wrongly: its first two spatial axes padded
    differently, or its last two strided differently; a 2-D one with the same attributes on its axes is not."""
    w = const_init("w", np.ones((2, 3, 3, 3, 3), np.float32))
    conv = node("ConvTranspose", ["x", "w"], ["y"], strides=strides, pads=pads)
    m = model([conv], [inp("x", [1, 2, 3, 3, 3])], ["y"], [w])
    wrong = (pads[0], pads[3]) != (pads[1], pads[4]) or strides[1] != strides[2]
    verdict = _check(m).verdicts[0]
    assert (verdict.status == "unsupported") is wrong, verdict.reason
    flat = model(
        [node("ConvTranspose", ["x", "w2"], ["y"], strides=strides[1:], pads=[pads[1], pads[2], pads[4], pads[5]])],
        [inp("x", [1, 2, 3, 3])],
        ["y"],
        [const_init("w2", np.ones((2, 3, 3, 3), np.float32))],
    )
    assert _check(flat).verdicts[0].status != "unsupported"


@pytest.mark.parametrize(("output_padding", "refused"), [([0, 0], False), ([1, 1], True), ([0, 1], True)])
def test_convtranspose_output_padding(output_padding: list[int], refused: bool) -> None:
    """A ConvTranspose with output_padding is refused, equal strides included (HTP gets some classes wrong)."""
    w = const_init("w", np.ones((2, 3, 4, 4), np.float32))
    conv = node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_padding=output_padding)
    m = model([conv], [inp("x", [1, 2, 4, 4])], ["y"], [w])
    assert (_check(m).verdicts[0].status == "unsupported") is refused


@pytest.mark.parametrize(("rank", "groups", "refused"), [(3, 1, False), (3, 2, True), (2, 2, False)])
def test_grouped_convtranspose_3d(rank: int, groups: int, refused: bool) -> None:
    """A grouped 3-D ConvTranspose is refused (HTP gets it wrong); one group, or a grouped 2-D one, is not."""
    w = const_init("w", np.ones((4, 3, *[2] * rank), np.float32))
    conv = node("ConvTranspose", ["x", "w"], ["y"], group=groups)
    m = model([conv], [inp("x", [1, 4, *[3] * rank])], ["y"], [w])
    assert (_check(m).verdicts[0].status == "unsupported") is refused


@pytest.mark.parametrize(
    ("a", "b", "refused"),
    [
        ([1, 3, 2, 4, 3], [3, 3, 2, 3, 4], True),
        ([3, 3, 2, 4, 3], [1, 3, 2, 3, 4], True),
        ([3, 3, 1, 4, 3], [3, 3, 2, 3, 4], False),
        ([3, 3, 2, 4, 3], [3, 3, 2, 3, 4], False),
        ([1, 3, 2, 4, 3], [3, 2, 3, 4], False),
        ([1, 2, 4, 3], [3, 2, 3, 4], False),
    ],
)
def test_matmul_rank5_broadcast_on_the_first_axis_is_a_crash(a: list[int], b: list[int], refused: bool) -> None:
    """A MatMul of two rank-5 inputs broadcast on the first axis stops the process inside QNN HTP: refused as a crash;
    broadcasting elsewhere, or between ranks 5 and 4, is not."""
    m = model([node("MatMul", ["a", "b"], ["y"])], [inp("a", a), inp("b", b)], ["y"])
    v = _check(m).verdicts[0]
    assert (v.status == "unsupported") is refused
    if refused:
        assert v.kind == "crash"


@pytest.mark.parametrize(
    ("op", "shapes", "refused"),
    [
        ("Where", [[1, 3, 1, 2, 3], [2, 3, 4, 2, 3], [2, 3, 4, 2, 3]], True),
        ("Where", [[3, 1, 2, 3], [2, 3, 4, 2, 3], [2, 3, 4, 2, 3]], False),
        ("Where", [[2, 3, 4, 2, 3], [], [2, 3, 4, 2, 3]], False),
        ("Where", [[2, 3, 4, 2], [1, 3, 1, 2], [2, 3, 4, 2]], False),
        ("Pow", [[2, 3, 4, 2, 3], [1, 3, 1, 1, 3]], True),
        ("Pow", [[2, 3, 4, 2, 3], [1]], False),
    ],
)
def test_rank5_broadcasting_where_and_pow(op: str, shapes: list[list[int]], refused: bool) -> None:
    """A rank-5 Where (wrong) or Pow (a crash) with a rank-5 input that broadcasts is refused; lower-rank inputs,
    scalars, the output's shape and rank 4 are not."""
    names = ["c", "a", "b"][-len(shapes) :]
    inputs = [inp(n, s, BOOL) if n == "c" else inp(n, s) for n, s in zip(names, shapes, strict=True)]
    inits = []
    if op == "Pow":  # a constant whole exponent: vouched for whatever the base's sign
        inputs, inits = inputs[:1], [const_init("b", np.full(shapes[1], 2.0, np.float32))]
    m = model([node(op, names, ["y"])], inputs, ["y"], inits)
    v = _check(m).verdicts[0]
    assert (v.status == "unsupported") is refused, v.reason


@pytest.mark.parametrize(
    ("data", "indices", "refused"),
    [
        ([3, 4, 2, 3], [1, 2], True),
        ([2, 3, 4], [1, 1, 2], True),
        ([2, 3, 4, 2, 3], [2], False),
        ([3, 4, 2], [1, 2], False),
    ],
)
def test_gather_by_2d_indices_into_rank5(data: list[int], indices: list[int], refused: bool) -> None:
    """A Gather by indices of rank >= 2 into a rank-5 output is refused (HTP gets it wrong); rank-1 indices, or a
    rank-4 output, are not."""
    m = model(
        [node("Gather", ["x", "i"], ["y"], axis=1)],
        [inp("x", data)],
        ["y"],
        [const_init("i", np.zeros(indices, np.int64))],
    )
    assert (_check(m).verdicts[0].status == "unsupported") is refused


def test_outputs_typed_without_shape_are_accepted() -> None:
    """A graph output with a dtype but no shape (ONNX Runtime runs such models) is checked, not refused."""
    m = unary("Relu")
    m.graph.output[0].type.tensor_type.ClearField("shape")
    rep = _check(m)
    assert rep.supported


def test_infinity_reaching_an_output_through_where_is_refused() -> None:
    """Where(x < 0, -inf, Log(x)) then another Where to the output (special.entr's form): refused."""
    m = model(
        [
            node("Less", ["x", "zero"], ["c"]),
            node("Log", ["x"], ["l"]),
            node("Where", ["c", "ninf", "l"], ["w"], name="where_inf"),
            node("IsNaN", ["x"], ["n"]),
            node("Where", ["n", "x", "w"], ["y"], name="where_nan"),
        ],
        [inp("x", [2, 3])],
        ["y"],
        [const_init("ninf", -np.inf), const_init("zero", 0.0)],
    )
    assert _by_name(_check(m))["where_inf"].kind == "wrong_result"


@pytest.mark.parametrize(
    ("base_nodes", "refused"),
    [
        ([], True),  # Pow(x, 0.5) on a graph input: x may be negative
        ([node("Mul", ["x", "x"], ["sq"]), node("ReduceSum", ["sq", "ax"], ["b"], keepdims=1)], False),  # L2 norm
        ([node("Abs", ["x"], ["b"])], False),
        ([node("Neg", ["x"], ["b"])], True),
        (  # a p-norm's root: the sum of fractional powers of |x|
            [
                node("Abs", ["x"], ["a"]),
                node("Pow", ["a", "half"], ["pw"]),
                node("ReduceSum", ["pw", "ax"], ["b"], keepdims=1),
            ],
            False,
        ),
        ([node("Pow", ["x", "half"], ["b"])], True),  # a power of a value that may be negative
    ],
    ids=["input", "sum-of-squares", "abs", "neg", "sum-of-powers-of-abs", "power-of-input"],
)
def test_pow_with_fractional_exponent_of_a_non_negative_base(base_nodes: list, refused: bool) -> None:
    """Pow(b, 0.5) is refused only when b may be negative (HTP gives numbers where PyTorch gives NaN)."""
    base = base_nodes[-1].output[0] if base_nodes else "x"
    m = model(
        [*base_nodes, node("Pow", [base, "half"], ["y"], name="pow")],
        [inp("x", [2, 3])],
        ["y"],
        [const_init("half", 0.5), const_init("ax", [1], np.int64)],
    )
    assert (_by_name(_check(m))["pow"].status == "unsupported") is refused


def test_a_node_with_an_empty_tensor_is_refused_as_a_crash() -> None:
    """A zero-element input or output (QNN stops the process on them) makes the node unsupported, kind crash."""
    m = model([node("Relu", ["x"], ["y"])], [inp("x", [2, 0])], ["y"])
    v = _check(m).verdicts[0]
    assert (v.status, v.kind) == ("unsupported", "crash")


@pytest.mark.parametrize(
    ("producer", "vouched"),
    [
        ([], False),  # a graph input: exact in float32 on the CPU EP, rounded to fp16 on QNN
        ([node("Softmax", ["x"], ["p"], axis=-1)], True),  # an MoE router's probabilities, computed on QNN
        ([node("Mul", ["x", "x"], ["p"])], True),
        ([node("Tan", ["x"], ["p"])], False),  # refused itself (imprecise in fp16): computed on the CPU EP
        ([node("Dropout", ["x"], ["p"])], False),  # removed by ONNX Runtime: TopK reads the graph input
        ([node("Relu", ["x"], ["d"]), node("Dropout", ["d"], ["p"])], True),  # removed, over a QNN node
    ],
    ids=["input", "softmax", "mul", "refused-producer", "removed-over-input", "removed-over-relu"],
)
def test_topk_is_vouched_for_when_qnn_computes_its_input(producer: list, vouched: bool) -> None:
    """A float TopK reads fp16-rounded values wherever it runs when a QNN node computes its input, and HTP's TopK of
    fp16 values returns the CPU EP's values: it stays on the NPU (an MoE router). Of a graph input, of a node on the
    CPU EP, or of a constant it is refused, since there the CPU EP would see float32 values."""
    src = producer[-1].output[0] if producer else "x"
    m = model(
        [*producer, node("TopK", [src, "k"], ["v", "i"], name="topk")],
        [inp("x", [4, 8])],
        ["v", "i"],
        [const("k", [2], np.int64)],
    )
    v = _by_name(_check(m))["topk"]
    assert (v.status == "supported") is vouched, v.reason
    if not vouched:
        assert v.kind == "wrong_result"


@pytest.mark.parametrize(
    ("op", "vouched"),
    [("Softmax", True), ("Sigmoid", True), ("Tanh", True), ("Exp", False), ("Relu", False), (None, False)],
)
def test_isnan_is_vouched_for_only_on_a_bounded_qnn_value(op: str | None, vouched: bool) -> None:
    """HTP reads a value that overflowed fp16 inside the graph (Exp or Mul of large values) as NaN, although it
    leaves QNN clamped to a finite number; the softmax, sigmoid or tanh of a QNN node cannot overflow, so IsNaN of
    it (torch.onnx's guard after an attention softmax) stays on the NPU."""
    nodes = [node(op, ["x"], ["p"])] if op else []
    src = "p" if op else "x"
    m = model([*nodes, node("IsNaN", [src], ["n"], name="isnan")], [inp("x", [2, 8])], ["n"])
    v = _by_name(_check(m))["isnan"]
    assert (v.status == "supported") is vouched, v.reason


_STEPS = {
    "Neg": lambda i, src: node("Neg", [src], [f"s{i}"]),
    "Abs": lambda i, src: node("Abs", [src], [f"s{i}"]),
    "Mul": lambda i, src: node("Mul", [src, "two"], [f"s{i}"]),
    "Add": lambda i, src: node("Add", [src, "x"], [f"s{i}"]),
    "Identity": lambda i, src: node("Identity", [src], [f"s{i}"]),
}


@given(
    fill=st.sampled_from([np.inf, -np.inf, np.nan]),
    steps=st.lists(st.sampled_from(sorted(_STEPS)), max_size=4),
    compared=st.booleans(),
    range_checked=st.booleans(),
)
def test_an_infinity_reaching_an_output_is_refused_unless_the_caller_checks_the_range(
    fill: float, steps: list[str], compared: bool, range_checked: bool
) -> None:
    """Where(c, inf or NaN, x) carried to a graph output by elementwise steps is refused, unless the caller checks
    every output for values beyond float16's range (HTP writes the constant there as 65536 or 98304, which such a
    check sees); a comparison with the constant is refused either way (HTP's comparison is never true)."""
    nodes = [node("Where", ["c", "fill", "x"], ["s"], name="fill")]
    nodes += [_STEPS[step](i, nodes[-1].output[0]) for i, step in enumerate(steps)]
    if compared:
        nodes.append(node("Equal", ["x", "fill"], ["eq"], name="compare"))
        nodes.append(node("Where", ["eq", "x", nodes[-2].output[0]], ["w"]))
    nodes.append(node("Identity", [nodes[-1].output[0]], ["y"]))
    m = model(
        nodes,
        [inp("x", [2, 3]), inp("c", [2, 3], BOOL)],
        ["y"],
        [const_init("fill", fill), const_init("two", 2.0)],
    )
    rep = oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60, outputs_range_checked=range_checked)
    verdicts = _by_name(rep)
    assert (verdicts["fill"].status == "unsupported") is not range_checked
    if compared:
        assert verdicts["compare"].status == "unsupported"


@given(rank=st.integers(1, 5), source=st.sampled_from([TensorProto.INT32, TensorProto.FLOAT, TensorProto.BOOL]))
def test_a_cast_to_int64_at_rank_5_is_refused_as_a_crash(rank: int, source: int) -> None:
    """Property: a Cast to int64 with a 5-D output is refused (QNN HTP stops the process while the session is
    created, measured for int32 sources: refused as a crash; the EP rejects the others); at ranks 1-4 an int32 source
    is not a crash."""
    shape = [2, 1, 3, 1, 2][:rank]
    m = model(
        [node("Cast", ["x"], ["y"], to=TensorProto.INT64)],
        [inp("x", shape, source)],
        [helper.make_tensor_value_info("y", TensorProto.INT64, shape)],
    )
    verdict = _check(m).verdicts[0]
    if source == TensorProto.INT32:
        assert (verdict.kind == "crash") is (rank == 5)
    if rank == 5:
        assert verdict.status == "unsupported"
