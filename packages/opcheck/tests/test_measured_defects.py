"""Gather, Conv and ArrayFeatureExtractor classes QNN HTP computes wrongly: opcheck refuses them, vouches for their right neighbours, and the
live simulator agrees on a few of each (the sweeps behind the table's evidence are wider)."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from opcheck_graphs import feature_extractor

import qnnx_opcheck as oc


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, tuple[int, ...]]], inits: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _verdict(m: onnx.ModelProto, name: str) -> oc.NodeVerdict:
    report = oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return next(v for v in report.verdicts if v.node_name == name)


def _indexed(
    node: onnx.NodeProto, inputs: dict, inits: dict, index_shape: tuple[int, ...], index_dtype: type, runtime: bool
) -> onnx.ModelProto:
    """``node`` reading indices ``ids`` of ``index_shape``: a graph input (runtime) or a constant."""
    if runtime:
        inputs["ids"] = (helper.np_dtype_to_tensor_dtype(np.dtype(index_dtype)), index_shape)
    else:
        inits["ids"] = np.zeros(index_shape, index_dtype)
    return _model([node], inputs, inits)


def _gather(shape: tuple[int, ...], axis: int, index_shape: tuple[int, ...], runtime: bool = True) -> onnx.ModelProto:
    node = helper.make_node("Gather", ["x", "ids"], ["y"], axis=axis, name="gather")
    return _indexed(node, {"x": (TensorProto.FLOAT, shape)}, {}, index_shape, np.int32, runtime)


def _conv(shape: tuple[int, ...], cout: int, kernel: int, stride: int, pads: tuple[int, int]) -> onnx.ModelProto:
    rank = len(shape) - 2
    weights = np.random.default_rng(0).standard_normal((cout, shape[1], *[kernel] * rank)).astype(np.float32)
    node = helper.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        kernel_shape=[kernel] * rank,
        strides=[stride] * rank,
        pads=[pads[0]] * rank + [pads[1]] * rank,
        name="conv",
    )
    return _model([node], {"x": (TensorProto.FLOAT, shape)}, {"w": weights})


GATHERS = [
    # (data shape, axis, index shape, runtime indices, refused)
    ((2, 16, 64), 1, (4,), True, True),
    ((3, 3, 5), 1, (2,), True, True),
    ((2, 5, 8, 3), 2, (), True, True),
    ((2, 5, 8, 3), 3, (2, 2), True, True),
    ((4, 3, 8), 0, (2, 3), True, False),
    ((1, 16, 64), 1, (4,), True, False),
    ((4, 3, 8), 2, (5,), True, False),
    ((2, 16, 64), 1, (4,), False, False),
]


@pytest.mark.parametrize(("shape", "axis", "index_shape", "runtime", "refused"), GATHERS)
def test_gather_by_runtime_indices_along_an_inner_axis_is_refused(
    shape: tuple[int, ...], axis: int, index_shape: tuple[int, ...], runtime: bool, refused: bool
) -> None:
    """Runtime indices along an inner axis after a dim > 1 (or along the last by indices of rank >= 2) are refused
    as wrong; axis 0, a leading unit dim, the last axis by 1-D indices and constant indices are vouched for."""
    v = _verdict(_gather(shape, axis, index_shape, runtime), "gather")
    assert (v.status == "unsupported") == refused, v
    if refused:
        # a rank-5 output (2-D indices into rank-4 data) has a wrong class of its own, which may be named first
        assert v.kind == "wrong_result" and ("inner axis" in (v.reason or "") or "rank-5 output" in (v.reason or ""))


GATHERNDS = [
    # (data shape, index shape, refused): the first three are wrong on the simulator, the rest right
    ((4, 16, 32), (32, 1), True),
    ((4, 5, 6), (9, 1), True),
    ((4, 3, 5, 6), (16, 2), True),
    ((4, 16, 32), (8, 1), False),
    ((4, 16, 32), (16, 4, 1), False),
    ((4, 16), (32, 1), False),
    ((4, 6, 5), (32, 2), False),
    ((4, 6, 5), (12, 3), False),
    ((5, 5, 5), (9, 2, 2, 3), True),  # runtime indices of rank 4: wrong with a first axis longer than 8
    ((8, 8), (9, 2, 2, 2), True),
    ((5, 5, 5), (2, 2, 2, 2, 3), True),  # rank 5: stops the process
    ((5, 5, 5), (9, 2, 3), False),
]


def _gathernd(data_shape: tuple[int, ...], index_shape: tuple[int, ...], runtime: bool = True) -> onnx.ModelProto:
    node = helper.make_node("GatherND", ["x", "ids"], ["y"], name="gathernd")
    return _indexed(node, {}, {"x": np.zeros(data_shape, np.float32)}, index_shape, np.int64, runtime)


@given(
    data_shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    tuples=st.integers(1, 20),
    outer=st.sampled_from([(), (2,)]),
    last=st.integers(1, 4),
)
def test_gathernd_refusal_follows_its_class(
    data_shape: list[int], tuples: int, outer: tuple[int, ...], last: int
) -> None:
    """Over random shapes: by runtime indices, refused exactly when more than 8 tuples each pick a slice of rank
    >= 2; by constant indices never refused by the class."""
    last = min(last, len(data_shape))
    index_shape = (*outer, tuples, last)
    wrong_class = len(data_shape) - last >= 2 and tuples > 8
    v = _verdict(_gathernd(tuple(data_shape), index_shape), "gathernd")
    assert (v.status == "unsupported" and v.kind == "wrong_result") == wrong_class, v
    assert _verdict(_gathernd(tuple(data_shape), index_shape, runtime=False), "gathernd").status == "supported"


@pytest.mark.parametrize(("data_shape", "index_shape", "refused"), GATHERNDS)
def test_gathernd_by_many_runtime_indices_of_matrix_slices_is_refused(
    data_shape: tuple[int, ...], index_shape: tuple[int, ...], refused: bool
) -> None:
    """GatherND by runtime indices with more than 8 tuples along their second-to-last axis, each picking a slice of
    rank >= 2, is refused as wrong; at most 8 tuples there, rank-1 or scalar slices, and constant indices are
    vouched for."""
    v = _verdict(_gathernd(data_shape, index_shape), "gathernd")
    assert (v.status == "unsupported") == refused, v
    if refused:
        assert v.kind == "wrong_result" and "k % 8" in (v.reason or "")
    assert _verdict(_gathernd(data_shape, index_shape, runtime=False), "gathernd").status == "supported"


def test_a_scaled_embedding_is_refused_and_its_parts_are_not() -> None:
    """Mul(Gather(constant table, runtime int32 ids), one-element constant) is refused (the Mul); with a vector
    factor, or a runtime table, it is vouched for."""
    table = np.zeros((128, 64), np.float32)

    def build(factor: np.ndarray, runtime_table: bool) -> onnx.ModelProto:
        nodes = [
            helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather"),
            helper.make_node("Mul", ["rows", "c"], ["y"], name="scale"),
        ]
        inputs = {"ids": (TensorProto.INT32, (2, 16))}
        inits = {"c": factor}
        if runtime_table:
            inputs["table"] = (TensorProto.FLOAT, table.shape)
        else:
            inits["table"] = table
        return _model(nodes, inputs, inits)

    scalar = np.array(8.0, np.float32)
    v = _verdict(build(scalar, runtime_table=False), "scale")
    assert (v.status, v.kind) == ("unsupported", "wrong_result") and "scaled embedding" in (v.reason or "")
    assert _verdict(build(np.full(64, 8.0, np.float32), runtime_table=False), "scale").status == "supported"
    assert _verdict(build(scalar, runtime_table=True), "scale").status == "supported"


CONVS = [
    # (input shape, out channels, kernel, stride, pads, refused)
    ((1, 1, 8), 1, 2, 3, (0, 0), True),
    ((1, 3, 8, 8), 1, 2, 3, (0, 0), True),
    ((1, 8, 3, 3), 8, 3, 3, (1, 1), True),
    ((1, 8, 3), 4, 3, 2, (1, 0), True),
    ((1, 8, 1, 1), 8, 3, 1, (1, 1), False),
    ((1, 8, 2, 2), 16, 3, 2, (1, 1), False),
    ((1, 3, 8, 8), 8, 2, 3, (0, 0), False),
    ((1, 1, 6), 1, 3, 2, (0, 0), False),
]


@pytest.mark.parametrize(("shape", "cout", "kernel", "stride", "pads", "refused"), CONVS)
def test_conv_defect_classes_are_refused(
    shape: tuple[int, ...], cout: int, kernel: int, stride: int, pads: tuple[int, int], refused: bool
) -> None:
    """One output channel with a stride >= 3, or padding on an axis whose one window leaves input out, is refused;
    a 3x3 Conv with pad 1 on a 1x1 or 2x2 input, or many output channels at stride 3, is vouched for."""
    v = _verdict(_conv(shape, cout, kernel, stride, pads), "conv")
    assert (v.status == "unsupported") == refused, v


@given(
    size=st.integers(1, 12),
    cout=st.sampled_from([2, 4, 16]),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
)
def test_unpadded_convs_with_small_strides_and_several_outputs_stay_vouched(
    size: int, cout: int, kernel: int, stride: int
) -> None:
    """Outside the two classes (no padding, stride 1-2, several output channels) every Conv is vouched for: the
    refusal does not spread to the Convs CNNs are made of."""
    kernel = min(kernel, size)
    assert _verdict(_conv((1, 3, size, size), cout, kernel, stride, (0, 0)), "conv").status == "supported"


def _qnn_and_cpu(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The model's first output on the HTP simulator (CPU fallback disabled) and on the CPU EP."""
    import onnxruntime as ort
    import onnxruntime_qnn as oq

    ort.set_default_logger_severity(3)
    with contextlib.suppress(Exception):  # already registered in this process
        ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([device], {"backend_path": oq.get_qnn_htp_path(), "soc_model": "60"})
    got = ort.InferenceSession(m.SerializeToString(), sess_options=so).run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, want


def _qnn_error(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    got, want = _qnn_and_cpu(m, feeds)
    if got.shape != want.shape:  # another shape is wrong, whatever the values (and broadcasting would hide it)
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


@pytest.mark.parametrize(
    ("build", "refused"),
    [
        (lambda: _gather((2, 16, 64), 1, (4,)), True),
        (lambda: _gather((4, 3, 8), 0, (2, 3)), False),
        (lambda: _conv((1, 8, 3, 3), 8, 3, 3, (1, 1)), True),
        (lambda: _conv((1, 8, 2, 2), 16, 3, 2, (1, 1)), False),
    ],
)
def test_the_live_simulator_agrees(build: object, refused: bool) -> None:
    """On the HTP simulator the refused cases are wrong and the vouched neighbours right."""
    m = build()  # type: ignore[operator]
    rng = np.random.default_rng(0)
    feeds = {}
    for i in m.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == TensorProto.INT32:
            feeds[i.name] = rng.integers(0, 3, shape).astype(np.int32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    error = _qnn_error(m, feeds)
    assert (error > 0.1) == refused, error


@pytest.mark.parametrize(
    ("data_shape", "index_shape"),
    [((4, 16, 32), (32, 1)), ((4, 16, 32), (8, 1)), ((5, 5, 5), (9, 2, 2, 3)), ((5, 5, 5), (9, 2, 3))],
)
def test_the_live_simulator_agrees_on_gathernd(data_shape: tuple[int, ...], index_shape: tuple[int, ...]) -> None:
    """The refused GatherND class is wrong on the simulator and its vouched neighbour right."""
    m = _gathernd(data_shape, index_shape)
    rng = np.random.default_rng(0)
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(rng.standard_normal(data_shape).astype(np.float32), "x"))
    feeds = {"ids": rng.integers(0, data_shape[0], size=index_shape).astype(np.int64)}
    error = _qnn_error(m, feeds)
    assert (error > 0.1) == (_verdict(m, "gathernd").status == "unsupported"), error


def _einsum(equation: str, sizes: dict[str, int]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    terms = equation.split("->")[0].split(",")
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation, name="einsum")
    inputs = {n: (TensorProto.FLOAT, tuple(sizes[c] for c in t)) for n, t in zip("ab", terms, strict=True)}
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, (_, s) in inputs.items()}
    return _model([node], inputs, {}), feeds


_SIZES = {c: 2 + i for i, c in enumerate("bhijkmnqwcd")}
EINSUMS = [
    # (equation, refused): the MatMul forms onnxruntime-qnn translates, and others it declines
    ("ij,jk->ik", False),
    ("bij,bjk->bik", False),
    ("bhqd,bhkd->bhqk", False),
    ("bij,bkj->bik", False),
    ("bchq,bkhc->bkhq", False),
    ("bhwc,hkc->bhwk", False),
    ("bind,bjnd->bnij", True),
    ("binh,tnh->bnit", True),
    ("ij,jk->k", True),
    ("i,j->ij", True),
    ("ii,ij->ij", True),
    ("ij,jj->ij", True),
]


@pytest.mark.parametrize(("equation", "refused"), EINSUMS)
def test_einsum_is_vouched_for_only_in_the_matmul_forms_the_ep_translates(equation: str, refused: bool) -> None:
    """An Einsum whose equation is not one of the EP's MatMul forms (XLNet's bind,bjnd->bnij) is refused with the
    fix; the MatMul forms are vouched for."""
    sizes = {**_SIZES, "t": 5, "s": 3}
    v = _verdict(_einsum(equation, sizes)[0], "einsum")
    assert (v.status == "unsupported") is refused, v.reason
    diagonal = any(len(set(t)) != len(t) for t in equation.split("->")[0].split(","))
    if refused and not diagonal:
        assert "einsum_as_matmul" in v.reason or "einsum_as_matmul" in str(getattr(v, "fix", "")), v


@given(
    letters=st.permutations("bhijkn"),
    split=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    data=st.data(),
)
def test_a_vouched_einsum_runs_right_on_the_simulator(
    letters: list[str], split: tuple[int, int, int], data: st.DataObject
) -> None:
    """Over random two-operand equations: whenever opcheck vouches for the Einsum, the live simulator builds it and
    matches the CPU EP within fp16 tolerance (never a vouched refusal or wrong result)."""
    a = "".join(data.draw(st.permutations(letters))[: split[0]])
    b = "".join(data.draw(st.permutations(letters))[: split[1]])
    present = sorted(set(a) | set(b))
    out = "".join(data.draw(st.permutations(present))[: min(split[2], len(present))])
    m, feeds = _einsum(f"{a},{b}->{out}", _SIZES)
    if _verdict(m, "einsum").status == "supported":
        assert _qnn_error(m, feeds) < 1e-2


@pytest.mark.parametrize("equation", ["ii,ij->ij", "ij,jj->ij", "bii,bij->bij"])
def test_an_einsum_diagonal_is_wrong_on_the_simulator_and_refused(equation: str) -> None:
    """The QNN EP builds an Einsum with a repeated letter as a MatMul and runs it without an error, silently wrong:
    opcheck refuses it as a wrong result."""
    sizes = {"b": 2, "i": 3, "j": 4}
    m, feeds = _einsum(equation, sizes)
    assert _qnn_error(m, feeds) > 0.5
    v = _verdict(m, "einsum")
    assert (v.status, v.kind) == ("unsupported", "wrong_result"), v


def _projection_into_heads(
    lead: tuple[int, int], k: int, heads: int, head_dim: int, unflatten: bool
) -> onnx.ModelProto:
    """A Linear on x[*lead, k] as exported (Reshape -> Gemm -> Reshape), split into ``heads`` of ``head_dim``."""
    n = heads * head_dim
    inits = {
        "w": np.random.default_rng(0).standard_normal((n, k)).astype(np.float32),
        "b": np.zeros(n, np.float32),
        "flat": np.array([lead[0] * lead[1], k], np.int64),
        "back": np.array([*lead, n], np.int64),
        "split": np.array([*lead, heads, head_dim], np.int64),
    }
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["x2"]),
        helper.make_node("Gemm", ["x2", "w", "b"], ["g"], name="project", transB=1),
    ]
    if unflatten:
        nodes += [
            helper.make_node("Reshape", ["g", "back"], ["g3"]),
            helper.make_node("Reshape", ["g3", "split"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("Reshape", ["g", "split"], ["y"]))
    return _model(nodes, {"x": (TensorProto.FLOAT, (*lead, k))}, inits)


@given(
    a=st.integers(1, 5),
    b=st.integers(1, 5),
    heads=st.integers(1, 5),
    head_dim=st.integers(1, 4),
    unflatten=st.booleans(),
)
def test_a_flat_projection_into_heads_refusal_follows_its_class(
    a: int, b: int, heads: int, head_dim: int, unflatten: bool
) -> None:
    """The flattened Gemm is refused (finalize_error, naming the rewrite) exactly when x[A, A, K] is split into
    [A, A, A, D] with A > 1 and D > 1."""
    v = _verdict(_projection_into_heads((a, b), 8, heads, head_dim, unflatten), "project")
    refused = a == b == heads > 1 and head_dim > 1
    assert (v.status == "unsupported") == refused, v
    if refused:
        assert v.kind == "finalize_error" and "linear_heads_as_matmul" in (v.reason or ""), v


@pytest.mark.parametrize(("lead", "heads", "head_dim", "refused"), [((4, 4), 4, 6, True), ((4, 4), 2, 12, False)])
def test_the_live_simulator_agrees_on_flat_projections(
    lead: tuple[int, int], heads: int, head_dim: int, refused: bool
) -> None:
    """On the HTP simulator the refused projection fails graph finalize and the vouched neighbour builds."""
    report = oc.live_check(_projection_into_heads(lead, 24, heads, head_dim, True), soc_model=60, fallback=False)
    assert (report.session_error is not None and "MEM_ALLOC" in report.session_error) == refused, report.summary()


@pytest.mark.parametrize(
    ("shape", "indices", "runtime", "declared"),
    [((2, 1, 5), (4, 0, 2, 2), True, False), ((1, 2, 1, 5), (3,), False, True), ((5,), (3,), False, False)],
)
def test_the_live_simulator_agrees_on_array_feature_extractor(
    shape: tuple[int, ...], indices: tuple[int, ...], runtime: bool, declared: bool
) -> None:
    """A vouched ArrayFeatureExtractor class is right on the simulator; in the refused rank-1 class, with the output
    shape left to inference, QNN returns a scalar where onnxruntime's CPU kernel returns [1, 1]."""
    m = feature_extractor(shape, indices, runtime=runtime, declared=declared)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    if runtime:
        feeds["y"] = np.array(indices, np.int64)
    vouched = _verdict(m, "afe").status == "supported"
    error = _qnn_error(m, feeds)
    assert (error <= 1e-2) == vouched, error


def _reshape(dtype: int, source: tuple[int, ...], target: tuple[int, ...]) -> onnx.ModelProto:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", dtype, list(source))],
        [helper.make_tensor_value_info("y", dtype, None)],
        [numpy_helper.from_array(np.array(target, np.int64), "shape")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


@given(
    dims=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    out_rank=st.integers(1, 5),
    dtype=st.sampled_from([TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT]),
)
def test_a_reshape_of_int64_data_to_five_dims_is_refused_as_a_crash(dims: list[int], out_rank: int, dtype: int) -> None:
    """A Reshape of int64 data to a 5-D output stops the process inside the QNN EP: opcheck refuses exactly that
    class (any source shape), as a crash; int32 and float32 data, and int64 data to fewer dims, stay vouched for."""
    n = int(np.prod(dims))
    target = (n, *[1] * (out_rank - 1))
    v = _verdict(_reshape(dtype, tuple(dims), target), "reshape")
    if dtype == TensorProto.INT64 and out_rank == 5:
        assert (v.status, v.kind) == ("unsupported", "crash"), v
    else:
        assert v.kind != "crash", v


_RESHAPE_CHILD = """
import sys, contextlib, numpy as np, onnx, onnxruntime as ort, onnxruntime_qnn as oq
ort.set_default_logger_severity(3)
with contextlib.suppress(Exception):
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
device = next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
so = ort.SessionOptions()
so.add_provider_for_devices([device], {"backend_path": oq.get_qnn_htp_path(), "soc_model": "60"})
session = ort.InferenceSession(sys.stdin.buffer.read(), sess_options=so)
print(session.run(None, {"x": np.zeros((1, 4, 3, 2), np.int64)})[0].shape)
"""


def test_the_int64_reshape_to_five_dims_still_stops_the_process() -> None:
    """The measured crash behind the refusal, in a child process: if a QNN release fixes it, this fails and the
    rule can go. The same Reshape to four dims runs."""
    import subprocess
    import sys

    codes = []
    for target in ((1, 4, 3, 2, 1), (1, 4, 6, 1)):
        m = _reshape(TensorProto.INT64, (1, 4, 3, 2), target)
        child = subprocess.run(
            [sys.executable, "-c", _RESHAPE_CHILD], input=m.SerializeToString(), capture_output=True, timeout=300
        )
        codes.append(child.returncode)
    assert codes[0] < 0 and codes[1] == 0, codes


def _blocked_matmul(k: int, block: int) -> onnx.ModelProto:
    """x[4, k] @ DequantizeLinear(int4 W[k, 8], scales per ``block`` rows along k) (opset 21)."""
    blocks = -(-k // block)
    inits = [
        numpy_helper.from_array(np.zeros((k, 8), np.int8), "wq"),
        numpy_helper.from_array(np.full((blocks, 8), 0.05, np.float32), "ws"),
    ]
    inits[0].data_type = TensorProto.INT4
    inits[0].raw_data = b""
    inits[0].int32_data[:] = [0] * ((k * 8 + 1) // 2)
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0, block_size=block, name="dq"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@given(k=st.integers(16, 300), block=st.sampled_from([16, 32, 64, 128]))
def test_block_wise_weights_with_a_short_last_block_are_refused(k: int, block: int) -> None:
    """Block-wise weights whose blocked dim is not a multiple of block_size come back wrong from QNN HTP without an
    error (measured: K = 200 in blocks of 16 or 32, -9.7 dB against 22 on the CPU EP): opcheck refuses exactly that
    class as a wrong result; blocks that divide the dim are not refused by this rule."""
    v = _verdict(_blocked_matmul(k, block), "dq")
    if k % block:
        assert (v.status, v.kind) == ("unsupported", "wrong_result"), v
        assert "short last block" in (v.reason or ""), v
    else:
        assert "short last block" not in (v.reason or ""), v


def _projection_regrouped(
    lead: tuple[int, ...], n: int, target: tuple[int, ...], *, bias: bool, via: tuple[int, ...] | None = None
) -> onnx.ModelProto:
    """``Reshape(MatMul(x[*lead, 2], W[2, n]) [+ b] -> target)``, optionally through a first Reshape to ``via``."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((2, n)).astype(np.float32), "to": np.array(target, np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    last = "p"
    if bias:
        inits["b"] = rng.standard_normal(n).astype(np.float32)
        nodes.append(helper.make_node("Add", [last, "b"], ["pb"]))
        last = "pb"
    if via is not None:
        inits["via"] = np.array(via, np.int64)
        nodes.append(helper.make_node("Reshape", [last, "via"], ["v"]))
        last = "v"
    nodes.append(helper.make_node("Reshape", [last, "to"], ["y"], name="regroup"))
    return _model(nodes, {"x": (TensorProto.FLOAT, (*lead, 2))}, inits)


@given(
    n=st.integers(1, 6),
    split=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    k=st.integers(1, 3),
    bias=st.booleans(),
    through_reshape=st.booleans(),
)
def test_a_projection_regrouped_at_rank5_is_refused_by_its_class(
    n: int, split: list[int], k: int, bias: bool, through_reshape: bool
) -> None:
    """A Reshape of a projection's [..., N] product is refused (crash, naming the fix) exactly when it is rank 5
    and ends [..., N, k] with k > 1, also with a bias added and through a Reshape ONNX Runtime merges into it."""
    lead = (*split[:-1], split[-1] * k)  # rows of the product; the target regroups k of them
    target = (*split[:-1], split[-1], n, k)
    rows = int(np.prod(lead))
    via = (rows, n) if through_reshape else None
    v = _verdict(_projection_regrouped(lead, n, target, bias=bias, via=via), "regroup")
    refused = len(target) == 5 and k > 1
    assert (v.status == "unsupported") == refused, (target, v)
    if refused:
        assert v.kind == "crash" and "last axis last" in (v.reason or ""), v


@pytest.mark.parametrize(
    ("lead", "n", "target", "refused"),
    [((4, 4), 2, (2, 2, 2, 2, 2), True), ((4, 4), 4, (2, 2, 2, 4, 2), True), ((4, 4), 4, (2, 2, 4, 2, 2), False)],
)
def test_the_live_simulator_agrees_on_regrouped_projections(
    lead: tuple[int, ...], n: int, target: tuple[int, ...], refused: bool
) -> None:
    """On the HTP simulator (in a child process) the refused Reshape kills the process at its first run and the
    vouched neighbour runs right."""
    m = _projection_regrouped(lead, n, target, bias=False)
    assert (_verdict(m, "regroup").status == "unsupported") == refused
    report = oc.live_check(m, soc_model=60, fallback=False)
    if refused:
        assert report.crashed is not None and "SIGSEGV" in report.crashed, report.summary()
    else:
        assert report.crashed is None and all(o["match"] for o in report.outputs.values()), report.summary()


_INTS = {"int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32, "int64": TensorProto.INT64}


def _int_model(
    nodes: list[onnx.NodeProto], dtype: int, out_type: int, inits: dict | None = None, size: int = 12
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dtype, [size])],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _cast(dtype: int, to: int) -> onnx.ModelProto:
    return _int_model([helper.make_node("Cast", ["x"], ["y"], to=to, name="cast")], dtype, to)


@given(src=st.sampled_from(sorted(_INTS)), to=st.sampled_from([TensorProto.BOOL, TensorProto.UINT8]))
def test_an_integer_cast_to_bool_or_uint8_is_refused(src: str, to: int) -> None:
    """HTP casts a negative integer to bool as False (and to uint8 as 0, saturating above 255): opcheck refuses a
    Cast of int32 or int64 to bool or uint8 as a wrong result and names the comparison that is right (int8 and
    int16 inputs are refused already: the probe's Cast took neither)."""
    v = _verdict(_cast(_INTS[src], to), "cast")
    assert v.status == "unsupported", v
    if src in ("int32", "int64"):
        assert v.kind == "wrong_result" and "Not(Equal(x, 0))" in (v.reason or ""), v


@given(
    case=st.sampled_from(
        [
            (TensorProto.INT32, TensorProto.FLOAT),
            (TensorProto.INT64, TensorProto.INT32),
            (TensorProto.INT32, TensorProto.INT64),
            (TensorProto.UINT8, TensorProto.BOOL),
            (TensorProto.BOOL, TensorProto.INT32),
        ]
    )
)
def test_the_integer_casts_measured_right_stay_vouched(case: tuple[int, int]) -> None:
    """Casts of integers to float and between int32 and int64, uint8 to bool and bool to int32 gave the CPU EP's
    values on the simulator: still vouched for (int64 with the int32-range caveat)."""
    assert _verdict(_cast(*case), "cast").status in ("supported", "hazard")


def _mod(dtype: int, divisor: int) -> onnx.ModelProto:
    div = np.array(divisor, helper.tensor_dtype_to_np_dtype(dtype))
    return _int_model([helper.make_node("Mod", ["x", "d"], ["y"], name="mod")], dtype, dtype, {"d": div})


@given(src=st.sampled_from(sorted(_INTS)), divisor=st.sampled_from([3, 7, -7, 256]))
def test_an_integer_mod_is_refused(src: str, divisor: int) -> None:
    """HTP computes an integer Mod in fp16 (wrong beyond 2048, and for int8 below it): refused as a wrong result."""
    if src == "int8" and divisor == 256:
        divisor = 100
    v = _verdict(_mod(_INTS[src], divisor), "mod")
    assert (v.status, v.kind) == ("unsupported", "wrong_result"), v


_SIGNED = np.array([0, 1, -1, 2, -2, 255, 256, -256, 70000, -70000, 2**31 - 1, -(2**31)])


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
def test_the_live_simulator_agrees_on_integer_casts_to_bool(dtype: int) -> None:
    """On the simulator a Cast of negative integers to bool gives False (the CPU EP: True), and Not(Equal(x, 0)),
    which opcheck vouches for, gives every value right."""
    x = _SIGNED.astype(helper.tensor_dtype_to_np_dtype(dtype))
    got, want = _qnn_and_cpu(_cast(dtype, TensorProto.BOOL), {"x": x})
    assert not np.array_equal(got, want) and not got[x < 0].any() and want.all() == bool((x != 0).all())
    zero = {"z": np.array(0, x.dtype)}
    nodes = [helper.make_node("Equal", ["x", "z"], ["e"], name="eq"), helper.make_node("Not", ["e"], ["y"], name="n")]
    compare = _int_model(nodes, dtype, TensorProto.BOOL, zero)
    assert all(_verdict(compare, n).status in ("supported", "hazard") for n in ("eq", "n"))
    got, want = _qnn_and_cpu(compare, {"x": x})
    assert np.array_equal(got, want) and np.array_equal(got, x != 0)


@pytest.mark.parametrize(
    "x",
    [
        [2049, 4097, 10001, -10001, 40000, 70000, 1000003, -1000003, 5000, 3001, 2500, 9999],
        [0, 5, -5, 100, -100, 1000, 2047, -2047, 7, -7, 3, 13],
    ],
)
def test_the_live_simulator_agrees_on_integer_mod(x: list[int]) -> None:
    """On the simulator an int32 Mod by 7 is wrong for dividends beyond 2048, and already for -2047."""
    got, want = _qnn_and_cpu(_mod(TensorProto.INT32, 7), {"x": np.array(x, np.int32)})
    assert not np.array_equal(got, want) and np.array_equal(want, np.mod(x, 7))


def _wrapped_gather(
    d: int, gather_axis_size: int, op: str, dtype: int, extra_use: bool, source: str = "input"
) -> onnx.ModelProto:
    """torch.onnx's take_along_dim: ``Gather[Elements](x, Mod(i, d))`` along axis 1 of x[3, gather_axis_size]; the
    dividend is the input ``i``, its Reshape, the ArgMax of a float input (positions), or ``i * 31`` (a hash)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    dividend = {"input": "i", "view": "iv", "argmax": "ia", "hash": "ih"}[source]
    nodes = [
        helper.make_node("Reshape", ["i", "shape"], ["iv"], name="view"),
        helper.make_node("ArgMax", ["x"], ["ia64"], axis=1, keepdims=1, name="argmax"),
        helper.make_node("Cast", ["ia64"], ["ia"], to=dtype, name="cast"),
        helper.make_node("Mul", ["i", "prime"], ["ih"], name="hash"),
        helper.make_node("Mod", [dividend, "d"], ["w"], name="mod"),
        helper.make_node(op, ["x", "w"], ["y"], axis=1, name="gather"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Add", ["w", "w"], ["w2"], name="add"))
        outputs.append(helper.make_tensor_value_info("w2", dtype, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, gather_axis_size]),
            helper.make_tensor_value_info("i", dtype, [3, 2]),
        ],
        outputs,
        [
            numpy_helper.from_array(np.array(d, np_dtype), "d"),
            numpy_helper.from_array(np.array([3, 2], np.int64), "shape"),
            numpy_helper.from_array(np.array(31, np_dtype), "prime"),
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


@given(
    d=st.sampled_from([1, 5, 1000, 1024, 1025, 4096]),
    same_size=st.booleans(),
    op=st.sampled_from(["Gather", "GatherElements"]),
    dtype=st.sampled_from([TensorProto.INT32, TensorProto.INT64]),
    extra_use=st.booleans(),
    source=st.sampled_from(["input", "view", "argmax", "hash"]),
)
def test_an_integer_mod_wrapping_gather_indices_is_vouched_for(
    d: int, same_size: bool, op: str, dtype: int, extra_use: bool, source: str
) -> None:
    """The Mod torch.onnx writes to wrap take_along_dim's indices (by the gathered axis's size d <= 1024, used only
    as the indices, of indices as PyTorch checks them) is vouched for; by another divisor, a larger d, with another
    use, or of a dividend that arithmetic computes (a hash into a table of d rows, any size) it is refused."""
    v = _verdict(_wrapped_gather(d, d if same_size else d + 1, op, dtype, extra_use, source), "mod")
    vouched = d <= 1024 and same_size and not extra_use and source != "hash"
    assert (v.status != "unsupported") == vouched, v


@pytest.mark.parametrize("d", [7, 1000, 1024])
def test_the_live_simulator_wraps_every_valid_index_right(d: int) -> None:
    """On the simulator Mod(i, d) is right for every index i in [-d, d) up to d = 1024, the range the vouched wrap
    of gather indices takes."""
    x = np.arange(-d, d, dtype=np.int32)
    mod = helper.make_node("Mod", ["x", "d"], ["y"])
    m = _int_model([mod], TensorProto.INT32, TensorProto.INT32, {"d": np.array(d, np.int32)}, size=2 * d)
    got, want = _qnn_and_cpu(m, {"x": x})
    assert np.array_equal(got, want)


def _int_div(dtype: int, divisor: int | list[int], dividend: str = "input") -> onnx.ModelProto:
    """``Div(v, d)`` of x[12] by a constant d, where v is the input x, its ``Abs``, the sign-select
    ``Where(x < 0, k - x, x)`` (qnnx-export's floor division), ``x + 5`` or a ``Range`` from 0."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits = {
        "d": np.array(divisor, np_dtype),
        "zero": np.array(0, np_dtype),
        "k": np.array(max(int(np.max(divisor)) - 1, 0), np_dtype),
        "five": np.array(5, np_dtype),
        "n": np.array(12, np_dtype),
        "one": np.array(1, np_dtype),
    }
    nodes = [
        helper.make_node("Abs", ["x"], ["abs"], name="abs"),
        helper.make_node("Less", ["x", "zero"], ["neg"], name="less"),
        helper.make_node("Sub", ["k", "x"], ["flip"], name="flip"),
        helper.make_node("Where", ["neg", "flip", "x"], ["select"], name="where"),
        helper.make_node("Add", ["x", "five"], ["shift"], name="add"),
        helper.make_node("Range", ["zero", "n", "one"], ["range"], name="range"),
        helper.make_node("Div", [{"input": "x", "abs": "abs", "select": "select", "shift": "shift",
                                  "range": "range"}[dividend], "d"], ["q"], name="div"),
        helper.make_node("Add", ["q", "x"], ["y"], name="use"),
    ]  # fmt: skip
    return _int_model(nodes, dtype, dtype, inits)


@given(
    dtype=st.sampled_from([TensorProto.INT32, TensorProto.INT64]),
    divisor=st.sampled_from([1, 2, 4, 64, 16384, 3, 12, 100, -2, -64, [8], [8] * 12, [3, 4] * 6]),
    dividend=st.sampled_from(["input", "abs", "select", "shift", "range"]),
)
def test_an_integer_division_by_a_constant_power_of_two_is_refused_unless_its_dividend_is_not_negative(
    dtype: int, divisor: int | list[int], dividend: str
) -> None:
    """HTP rounds an integer Div by a one-element constant power of two down (ONNX truncates): refused as a wrong
    result when the dividend may be negative; vouched for by any other divisor (1, not a power of two, negative, a
    vector) or for a dividend >= 0 by construction (an Abs, the sign-select of qnnx-export's floor division, a Range
    from 0). ``x + 5`` may still be negative."""
    v = _verdict(_int_div(dtype, divisor, dividend), "div")
    one = np.asarray(divisor).size == 1
    value = int(np.asarray(divisor).reshape(-1)[0])
    refused = one and value >= 2 and value & (value - 1) == 0 and dividend in ("input", "shift")
    assert (v.status == "unsupported") == refused, v
    if refused:
        assert v.kind == "wrong_result" and "rounding down" in (v.reason or ""), v


def _floor_mod(dtype: int, b: int, *, second_use: bool = False) -> onnx.ModelProto:
    """qnnx-export's integer Mod: ``r = x - (x / b) * b; y = (r + b) - ((r + b) / b) * b`` (with ``second_use``,
    the first remainder is also an output of its own, which the construction does not cancel)."""
    nodes = [
        helper.make_node("Div", ["x", "b"], ["q1"], name="div1"),
        helper.make_node("Mul", ["q1", "b"], ["m1"], name="mul1"),
        helper.make_node("Sub", ["x", "m1"], ["r1"], name="sub1"),
        helper.make_node("Add", ["r1", "b"], ["s"], name="shift"),
        helper.make_node("Div", ["s", "b"], ["q2"], name="div2"),
        helper.make_node("Mul", ["q2", "b"], ["m2"], name="mul2"),
        helper.make_node("Sub", ["s", "m2"], ["y"], name="sub2"),
    ]
    m = _int_model(nodes, dtype, dtype, {"b": np.array(b, helper.tensor_dtype_to_np_dtype(dtype))})
    if second_use:
        m.graph.output.append(helper.make_tensor_value_info("r1", dtype, None))
    return m


@given(dtype=st.sampled_from([TensorProto.INT32, TensorProto.INT64]), b=st.sampled_from([2, 64, 1024]))
def test_the_floor_remainder_of_qnnx_exports_integer_mod_is_vouched_for(dtype: int, b: int) -> None:
    """Both quotients of ``x - (x / b) * b`` taken twice (qnnx-export's integer Mod) are vouched for by a power of
    two: the result does not depend on how HTP rounds them. The first quotient with its remainder used elsewhere too
    is refused (that remainder does depend on the rounding)."""
    m = _floor_mod(dtype, b)
    assert _verdict(m, "div1").status != "unsupported" and _verdict(m, "div2").status != "unsupported"
    assert _verdict(_floor_mod(dtype, b, second_use=True), "div1").status == "unsupported"


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
def test_the_live_simulator_agrees_on_integer_division_by_a_power_of_two(dtype: int) -> None:
    """On the simulator ``x / 16`` rounds negative quotients down (the CPU EP truncates), while the sign-select
    dividend and the floor remainder, which opcheck vouches for, give the CPU EP's values."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    x = np.array([-70001, -33, -17, -16, -15, -1, 0, 1, 15, 16, 17, 70001], np_dtype)
    got, want = _qnn_and_cpu(_int_div(dtype, 16), {"x": x})
    assert not np.array_equal(got, want) and np.array_equal(got[x >= 0], want[x >= 0])
    for m in (_int_div(dtype, 16, "select"), _floor_mod(dtype, 16)):
        got, want = _qnn_and_cpu(m, {"x": x})
        assert np.array_equal(got, want)
    assert np.array_equal(want, np.mod(x, 16))


def _scaled_softmax(
    shape: tuple[int, ...], c: float, axis: int, *, factor_shape: tuple[int, ...] = (), dtype: int = TensorProto.FLOAT,
    first: bool = False, reused: bool = False,
) -> onnx.ModelProto:  # fmt: skip
    """``Softmax(Mul(x, c), axis)``; ``first``: ``Mul(c, x)``; ``reused``: the product is a graph output too."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["c", "x"] if first else ["x", "c"], ["t"], name="mul"),
        helper.make_node("Softmax", ["t"], ["z"], axis=axis, name="softmax"),
    ]
    outputs = [helper.make_tensor_value_info("z", dtype, shape)]
    if reused:
        outputs.append(helper.make_tensor_value_info("t", dtype, shape))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dtype, shape)],
        outputs,
        [numpy_helper.from_array(np.full(factor_shape, c, np_dtype), "c")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple),
    c=st.sampled_from([-2.0, -0.5, 0.25, 3.0]),
    last=st.booleans(),
    factor_shape=st.sampled_from([(), (1,)]),
    dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]),
    first=st.booleans(),
    reused=st.booleans(),
)
def test_a_softmax_the_qnn_ep_fuses_with_a_scalar_factor_is_refused_for_a_negative_one_or_another_axis(
    shape: tuple[int, ...], c: float, last: bool, factor_shape: tuple[int, ...], dtype: int, first: bool, reused: bool
) -> None:
    """The QNN EP folds a float32 factor of rank 0 that only a Softmax reads into the HTP Softmax: refused as a wrong
    result for a negative factor over the last axis, as a finalize error over another axis; vouched for when the
    factor is positive over the last axis, of shape [1], float16, or the product has another reader."""
    axis = -1 if last or len(shape) == 1 else 0
    v = _verdict(
        _scaled_softmax(shape, c, axis, factor_shape=factor_shape, dtype=dtype, first=first, reused=reused), "softmax"
    )
    fused = factor_shape == () and dtype == TensorProto.FLOAT and not reused
    is_last = axis == -1
    if fused and is_last and c < 0:
        assert (v.status, v.kind) == ("unsupported", "wrong_result"), v
    elif fused and not is_last:
        assert (v.status, v.kind) == ("unsupported", "finalize_error"), v
    else:
        assert v.status != "unsupported", v


@pytest.mark.parametrize("shape", [(3, 4), (1, 2, 4, 4), (8,)])
def test_the_live_simulator_agrees_on_a_negatively_scaled_softmax(shape: tuple[int, ...]) -> None:
    """On the simulator the refused form (a negative rank-0 factor) is far off, the vouched one (shape [1]) right."""
    x = np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)
    got, want = _qnn_and_cpu(_scaled_softmax(shape, -0.5, -1), {"x": x})
    assert np.abs(got - want).max() > 0.2 * np.abs(want).max()
    got, want = _qnn_and_cpu(_scaled_softmax(shape, -0.5, -1, factor_shape=(1,)), {"x": x})
    assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()


def _gelu_shaped(a: float, b: float, c: float, *, div: bool = True, half_first: bool = False) -> onnx.ModelProto:
    """``x * a * (b + erf(x / c))`` (``erf(x * (1 / c))`` unless ``div``); ``half_first``: ``(x * a) * (...)``."""
    nodes = [
        helper.make_node("Div" if div else "Mul", ["x", "c"], ["s"], name="scale"),
        helper.make_node("Erf", ["s"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "b"], ["t"], name="add"),
    ]
    if half_first:
        nodes += [helper.make_node("Mul", ["x", "a"], ["h"]), helper.make_node("Mul", ["h", "t"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "t"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    consts = {"a": a, "b": b, "c": c if div else 1 / c}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


@given(
    a=st.sampled_from([0.5, 0.4, 1.0]),
    b=st.sampled_from([1.0, 2.0]),
    c=st.sampled_from([math.sqrt(2.0), 2.0, 1.0]),
    div=st.booleans(),
    half_first=st.booleans(),
)
def test_an_erf_in_the_gelu_shape_is_fused_only_with_gelus_constants(
    a: float, b: float, c: float, div: bool, half_first: bool
) -> None:
    """The QNN EP fuses ``x * a * (b + erf(x / c))`` into a Gelu whatever a, b and c: opcheck vouches for the Erf
    with GELU's constants (fused) and refuses it as a wrong result with any others."""
    v = _verdict(_gelu_shaped(a, b, c, div=div, half_first=half_first), "erf")
    if (a, b, c) == (0.5, 1.0, math.sqrt(2.0)):
        assert (v.status, v.kind) == ("supported", "fused"), v
    else:
        assert (v.status, v.kind) == ("unsupported", "wrong_result"), v


def test_the_live_simulator_computes_gelu_whatever_the_constants_of_the_shape() -> None:
    """On the simulator the shape with a = 0.4 comes back as GELU (0.25 of the output's max off the CPU EP), and
    with GELU's own constants it is right."""
    x = np.random.default_rng(0).uniform(-3, 3, (4, 8)).astype(np.float32)
    got, want = _qnn_and_cpu(_gelu_shaped(0.4, 1.0, math.sqrt(2.0)), {"x": x})
    assert np.abs(got - want).max() > 0.2 * np.abs(want).max()
    gelu, _ = _qnn_and_cpu(_gelu_shaped(0.5, 1.0, math.sqrt(2.0)), {"x": x})
    assert np.abs(got - gelu).max() <= 5e-3 * np.abs(gelu).max()
    got, want = _qnn_and_cpu(_gelu_shaped(0.5, 1.0, math.sqrt(2.0)), {"x": x})
    assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()
