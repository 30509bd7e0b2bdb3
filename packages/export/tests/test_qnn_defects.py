"""Regression tests on the real QNN HTP simulator: each defect shows without its pass and is gone with it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from export_onnx_builders import (
    add_layernorm,
    avgpool,
    erf_gelu,
    gathernd,
    gathernd_runtime,
    make_model,
    merged_heads_matmul,
    projection_into_heads,
    rmsnorm,
    to_bytes,
    to_ir,
    unsqueeze_int64,
)
from export_qnn_helpers import cpu_session, qnn_error_in_child, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

from qnnx_export._passes import run_passes


def _fixed(model: onnx.ModelProto, name: str) -> bytes:
    m = to_ir(model)
    ((_, changed),) = run_passes(m, (name,))
    assert changed
    return to_bytes(m)


def _ort_qnn_version() -> tuple[int, ...]:
    import importlib.metadata

    return tuple(int(p) for p in importlib.metadata.version("onnxruntime-qnn").split(".")[:2])


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_layernorm_batch_broadcast_defect(op: str, dynamic: bool) -> None:
    """LN(op(x[3,16,64], c[1,16,64])) is wrong for rows >= 1 on QNN; tiled it matches the CPU."""
    model, feeds = add_layernorm(3, 16, 64, op, (1, 16, 64), dynamic)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert _rel(broken[0], ref[0]) < 2e-2  # row 0 is right...
    if op == "Add" or _ort_qnn_version() >= (2, 6):
        # ...row 1 is silently wrong (the defect; the Mul form appeared in onnxruntime-qnn 2.6, per the opcheck probe)
        assert _rel(broken[1], ref[1]) > 0.2
    fixed = qnn_session(_fixed(model, "tile_layernorm_broadcast")).run(None, feeds)[0]
    for row in range(3):
        assert _rel(fixed[row], ref[row]) < 2e-2


def test_rmsnorm_finalize_defect() -> None:
    """RMSNorm with the weight first fails QNN finalize; with the weight last it runs and is right."""
    model, feeds = rmsnorm(1, 16, 64, weight_first=True)
    with pytest.raises(Exception, match=r"finalize|MEM_ALLOC"):
        qnn_session(model.SerializeToString())
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(_fixed(model, "rmsnorm_weight_last")).run(None, feeds)[0]
    assert _rel(out, ref) < 2e-2


@pytest.mark.parametrize("unflatten", [True, False])
def test_projection_into_heads_finalize_defect(unflatten: bool) -> None:
    """A Linear on x[4, 4, 24] exported flat and split into 4 heads of 6 fails QNN finalize; at the input's rank it
    builds and is right."""
    model, feeds = projection_into_heads([4, 4], 24, 4, 6, bias=True, trans_b=True, unflatten=unflatten, seed=0)
    with pytest.raises(Exception, match=r"finalize|MEM_ALLOC"):
        qnn_session(model.SerializeToString())
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(_fixed(model, "linear_heads_as_matmul")).run(None, feeds)[0]
    assert _rel(out, ref) < 2e-2


def test_gathernd_bool_defect() -> None:
    """GatherND on a bool mask is rejected by QNN; rewritten it runs and selects the same elements."""
    b, s = 2, 8
    idx = np.stack(np.meshgrid(np.arange(b), np.arange(s), indexing="ij"), axis=-1).reshape(b, 1, 1, s, 2)
    idx = idx[..., ::-1, :].copy()  # reversed order: a real Gather, not only a Reshape
    model, feeds = gathernd([b, s], idx)
    with pytest.raises(Exception, match=r"CPU EP|GatherND"):
        qnn_session(model.SerializeToString())
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(_fixed(model, "gathernd_to_gather")).run(None, feeds)[0]
    np.testing.assert_array_equal(out, ref)


def test_gathernd_runtime_indices_defect() -> None:
    """GatherND of [4, 16, 32] by 32 runtime indices (an MoE layer picking each token's expert weights) repeats the
    slices of the first 8 indices on QNN; as a Gather along axis 0 every slice is right."""
    model, feeds = gathernd_runtime([4, 16, 32], [32, 1])
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert _rel(broken[:8], ref[:8]) < 2e-2  # the first 8 slices are right...
    assert _rel(broken, ref) > 0.2  # ...the rest are silently wrong (the defect)
    fixed = qnn_session(_fixed(model, "gathernd_to_gather")).run(None, feeds)[0]
    assert _rel(fixed, ref) < 2e-2


def _gathernd_elements(
    data_shape: tuple[int, ...], index_shape: tuple[int, ...], seed: int = 0, negative: bool = False
):
    """``GatherND(const data, runtime int64 indices)`` with indices in range (PyTorch's ``x[i, j, k]`` by broadcast
    index tensors, as torch.onnx writes it), not negative unless ``negative`` (then counted from either end)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(data_shape).astype(np.float32)
    k = index_shape[-1]
    low = (lambda d: -d) if negative else (lambda d: 0)
    indices = np.stack([rng.integers(low(d), d, size=index_shape[:-1]) for d in data_shape[:k]], axis=-1)
    out_shape = [*index_shape[:-1], *data_shape[k:]]
    model = make_model(
        [h.make_node("GatherND", ["data", "idx"], ["y"])],
        [("idx", TensorProto.INT64, index_shape)],
        [("y", TensorProto.FLOAT, out_shape)],
        {"data": data},
    )
    return model, {"idx": indices.astype(np.int64)}


@pytest.mark.parametrize(
    ("data_shape", "index_shape"), [((5, 5, 5), (10, 10, 10, 3)), ((5, 5, 5), (9, 2, 2, 3)), ((8, 8), (9, 2, 2, 2))]
)
def test_gathernd_by_rank4_runtime_indices_defect(data_shape, index_shape) -> None:
    """GatherND of elements by runtime indices of rank 4 whose first axis is longer than 8 (``x[i, j, k]`` by
    broadcast index tensors) is silently wrong on QNN; flattened to [N, k] tuples and reshaped back it is right."""
    model, feeds = _gathernd_elements(data_shape, index_shape)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert _rel(broken, ref) > 0.2  # the defect
    fixed = qnn_session(_fixed(model, "gathernd_to_gather")).run(None, feeds)[0]
    assert _rel(fixed, ref) < 2e-2


@pytest.mark.parametrize("index_shape", [(10, 10, 10, 3), (4, 5, 5, 3)])
def test_flattened_gathernd_takes_negative_runtime_indices(index_shape) -> None:
    """Runtime indices counted from the end run on QNN after the rewrite and pick the CPU EP's elements (a flat
    GatherND by negative runtime indices failed at run time on HTP, so the rewrite makes them positive first), as
    [4, 5, 5, 3], which HTP got right unflattened, still does."""
    model, feeds = _gathernd_elements((5, 5, 5), index_shape, seed=3, negative=True)
    assert (feeds["idx"] < 0).any()
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    fixed = qnn_session(_fixed(model, "gathernd_to_gather")).run(None, feeds)[0]
    assert _rel(fixed, ref) < 2e-2


def test_gathernd_by_rank5_runtime_indices_stops_the_process_and_is_left_alone() -> None:
    """GatherND by runtime indices of rank 5 kills the process that runs it on QNN (a child here), and the Reshape
    that would flatten them fails QNN's finalize: the pass leaves the node (qnnx-opcheck refuses it, so it runs on
    the CPU EP)."""
    model, feeds = _gathernd_elements((5, 5, 5), (2, 2, 2, 2, 3))
    code, _, _ = qnn_error_in_child(model.SerializeToString(), feeds)
    assert code != 0
    assert run_passes(to_ir(model), ("gathernd_to_gather",)) == [("gathernd_to_gather", False)]


@settings(max_examples=40)
@given(
    data_shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
    lead=st.lists(st.integers(1, 12), min_size=3, max_size=3).map(tuple),
    sliced=st.integers(0, 1),
    negative=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_flattened_gathernd_selects_the_same_elements(data_shape, lead, sliced, negative, seed) -> None:
    """For any data, runtime indices of rank 4 picking elements or rank-1 slices, counted from either end: the pass
    leaves no GatherND by indices of rank 4, and the graph gives the CPU EP's output bit for bit."""
    k = len(data_shape) - sliced
    if k < 2:
        return
    model, feeds = _gathernd_elements(data_shape, (*lead, k), seed, negative)
    want = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    m = to_ir(model)
    run_passes(m, ("gathernd_to_gather",))
    assert all(len(n.inputs[1].shape) == 2 for n in m.graph if n.op_type == "GatherND")
    got = cpu_session(to_bytes(m)).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_scaled_embedding_defect() -> None:
    """A constant table gathered by int32 token ids [2, 16] and scaled by a constant scalar (Gemma's scaled
    embedding) is wrong on QNN for the second batch row; with the scale folded into the table every row is right."""
    rng = np.random.default_rng(0)
    table = (0.03 * rng.standard_normal((128, 64))).astype(np.float32)
    nodes = [h.make_node("Gather", ["table", "ids"], ["rows"]), h.make_node("Mul", ["rows", "scale"], ["y"])]
    model = make_model(
        nodes,
        [("ids", TensorProto.INT32, (2, 16))],
        [("y", TensorProto.FLOAT, (2, 16, 64))],
        {"table": table, "scale": np.array(8.0, np.float32)},
    )
    feeds = {"ids": rng.integers(0, 128, (2, 16)).astype(np.int32)}
    ref = table[feeds["ids"]] * np.float32(8.0)
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert _rel(broken[0], ref[0]) < 2e-2  # the first batch row is right...
    assert _rel(broken[1], ref[1]) > 0.2  # ...the second is silently wrong (the defect)
    fixed = qnn_session(_fixed(model, "fold_gather_scale")).run(None, feeds)[0]
    assert _rel(fixed, ref) < 2e-2


def test_erf_gelu_defect() -> None:
    """An Erf GELU the EP does not fuse itself ((x*(1+erf))/2) is rejected; fused into Gelu it runs."""
    model, feeds = erf_gelu((4, 32), "div_two_last")
    with pytest.raises(Exception, match=r"CPU EP|Erf"):
        qnn_session(model.SerializeToString())
    ref = cpu_session(model.SerializeToString()).run(None, feeds)
    out = qnn_session(_fixed(model, "fuse_erf_gelu")).run(None, feeds)
    for o, r in zip(out, ref, strict=True):
        assert _rel(o, r) < 2e-2


def test_unsqueeze_int64_rewritten_runs_exactly() -> None:
    """After the rewrite no int64 Unsqueeze reaches QNN and the graph runs exactly on the simulator.

    An early probe grid recorded a segfault for Unsqueeze on int64 data; the
    minimal forms tried here (graph input, constant, scalar, 1-2 axes) did not crash with 2.7.0, so
    this test checks the rewritten graph only and never hands QNN the risky form.
    """
    model, feeds = unsqueeze_int64([2, 8], [1])
    fixed = _fixed(model, "unsqueeze_int64_to_reshape")
    assert "Unsqueeze" not in [n.op_type for n in onnx.load_from_string(fixed).graph.node]
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(fixed).run(None, feeds)[0]
    np.testing.assert_array_equal(out, ref)


def test_int64_saturation_defect() -> None:
    """QNN saturates an int64 input beyond int32 silently; the legalized signature refuses it instead."""
    import torch
    from export_capture import capture, only
    from export_qnn_helpers import run_exported

    import qnnx_export as qe
    from qnnx_export.errors import SignatureError

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    big = torch.tensor([3_000_000_000, 5], dtype=torch.int64)
    with torch.no_grad():
        cap = only(capture(fn, big)[0])
        raw = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(passes=()))
        legal = qe.export(cap.gm, cap.example_inputs)
    out = run_exported(qnn_session(raw.model_bytes()), raw, cap.example_inputs)[0]
    assert out[0].item() != 3_000_000_001  # the defect: saturated, silently (2147483647 in 2.7.0)
    assert out[1].item() == 6
    with pytest.raises(SignatureError, match="int32"):
        legal.signature.onnx_inputs(cap.example_inputs)
    ok = [torch.tensor([7, 5], dtype=torch.int64)]
    assert run_exported(qnn_session(legal.model_bytes()), legal, ok)[0].tolist() == [8, 6]


_EFFICIENTNET_POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ([1, 8, 8, 8], {**_EFFICIENTNET_POOL, "count_include_pad": 0}),
        ([1, 8, 8, 8], {**_EFFICIENTNET_POOL, "count_include_pad": 1}),
        ([1, 4, 3, 3], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1] * 4, "ceil_mode": 1}),
        ([1, 4, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ([2, 4, 10], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
        (
            [1, 2, 5, 5, 5],
            {"kernel_shape": [3] * 3, "strides": [2] * 3, "pads": [1] * 6, "ceil_mode": 1, "count_include_pad": 1},
        ),
        ([1, 2, 5, 6, 7], {"kernel_shape": [3, 2, 2], "strides": [1] * 3, "pads": [1, 0, 0, 1, 0, 0]}),
    ],
    ids=[
        "efficientnet_exclude_pad",
        "efficientnet_include_pad",
        "ceil_window_in_end_padding",
        "pad_half_kernel",
        "1d_ceil",
        "3d_ceil_include_pad",
        "3d_first_axis_padded_alone",
    ],
)
def test_avgpool_whole_windows_defect(shape: list[int], attrs: dict[str, object]) -> None:
    """QNN HTP averages these pools wrongly; as zeros joined on, a pool of whole windows and a Mul by kernel area /
    divisor they agree with the CPU EP. Measured (max error / max |CPU EP|, onnxruntime-qnn 2.7.0, soc 60):
    EfficientNet's AvgPool2d(3, 2, padding=1, ceil_mode=True) of [1, 8, 8, 8]: 1.0 without count_include_pad, 0.21
    with it; kernel 2, stride 2, pad 1, ceil_mode on [1, 4, 3, 3]: a [1, 4, 3, 3] output where ONNX Runtime drops
    the window starting in the end padding ([1, 4, 2, 2]); pad 1 of kernel 2 on [1, 4, 7, 7]: 1.13; a 1-D ceil
    overhang: 1.0; 3-D ceil_mode with count_include_pad: 1.0; a 3-D pool padded on its first spatial axis alone: 0.33.
    Rewritten: 2.7e-4 to 6.3e-4."""
    model, feeds = avgpool(shape, **attrs)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert broken.shape != ref.shape or _rel(broken, ref) > 0.2  # the defect: silently wrong
    fixed = qnn_session(_fixed(model, "avgpool_whole_windows")).run(None, feeds)[0]
    assert fixed.shape == ref.shape
    assert _rel(fixed, ref) < 2e-3


@pytest.mark.parametrize(
    ("source", "merged"),
    [((4, 4, 4, 6), (4, 4, 24)), ((3, 3, 3, 5), (3, 3, 15)), ((2, 2, 2, 4), (1, 2, 2, 8)), ((6, 6, 6, 4), (6, 6, 24))],
)
@pytest.mark.parametrize("via", [None, (16, 24)], ids=["direct", "through_a_reshape"])
def test_merged_heads_matmul_defect(
    source: tuple[int, ...], merged: tuple[int, ...], via: tuple[int, ...] | None
) -> None:
    """QNN HTP computes MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W) silently wrong (measured 0.93-9082 of the
    output's max), also through a first Reshape (ONNX Runtime merges the two before QNN sees them); on the rank-2
    view it agrees with the CPU EP."""
    if via is not None:
        via = (source[0] * source[1], source[2] * source[3])
    model, feeds = merged_heads_matmul(source, merged, via=via)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert _rel(broken, ref) > 0.5  # the defect: silently wrong
    fixed = qnn_session(_fixed(model, "flatten_merged_heads_matmul")).run(None, feeds)[0]
    assert _rel(fixed, ref) < 2e-3


def test_bool_cast_to_int64_defect() -> None:
    """A padding mask cast to int64 (``(ids != pad).long()``, as BART, FlauBERT and XLM compute position ids) is
    refused by the QNN EP; through int32 it runs on QNN with the CPU EP's values."""
    nodes = [
        h.make_node("Equal", ["ids", "pad"], ["is_pad"]),
        h.make_node("Not", ["is_pad"], ["mask"]),
        h.make_node("Cast", ["mask"], ["y"], to=TensorProto.INT64),
    ]
    model = make_model(
        nodes, [("ids", TensorProto.INT32, (2, 8))], [("y", TensorProto.INT64, (2, 8))], {"pad": np.array(1, np.int32)}
    )
    feeds = {"ids": np.random.default_rng(0).integers(0, 4, (2, 8)).astype(np.int32)}
    with pytest.raises(Exception, match=r"CPU EP|Cast"):
        qnn_session(model.SerializeToString())
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(_fixed(model, "bool_cast_to_int64")).run(None, feeds)[0]
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


def test_reshape_of_high_rank_reshape_defect() -> None:
    """A tiny MaskFormer-Swin's one-window partition, ``[1, 4, 4, 8] -> [1, 1, 4, 1, 4, 8] -> [1, 4, 4, 8]`` (the
    permute between them moved only unit axes): qnnx-opcheck refuses the rank-6 view, which ONNX Runtime then fuses
    away before placement, so the node cannot be kept off QNN and the graph ran in PyTorch. As one Reshape opcheck
    vouches for every node, and it runs on QNN equal to the CPU EP."""
    from qnnx_opcheck import check_model

    nodes = [
        h.make_node("Mul", ["x", "two"], ["x2"]),
        h.make_node("Reshape", ["x2", "s6"], ["r"]),
        h.make_node("Reshape", ["r", "s4"], ["y"]),
    ]
    inits = {
        "two": np.array(2.0, np.float32),
        "s6": np.array([1, 1, 4, 1, 4, 8], np.int64),
        "s4": np.array([1, 4, 4, 8], np.int64),
    }
    model = onnx.shape_inference.infer_shapes(
        make_model(nodes, [("x", TensorProto.FLOAT, (1, 4, 4, 8))], [("y", TensorProto.FLOAT, (1, 4, 4, 8))], inits)
    )
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 4, 8)).astype(np.float32)}
    refused = [v for v in check_model(model, soc_model=60).verdicts if v.status != "supported"]
    assert refused and "rank" in (refused[0].reason or "")
    fixed = _fixed(model, "reshape_of_high_rank_reshape")
    assert all(v.status == "supported" for v in check_model(onnx.load_from_string(fixed), soc_model=60).verdicts)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(fixed).run(None, feeds)[0]
    assert _rel(out, ref) < 2e-2


def _transposed_window_gather(indices: np.ndarray, *, runtime: bool = False) -> onnx.ModelProto:
    """``as_strided`` windows of a transposed tensor as the exporters write them (Longformer's sliding-window
    attention): Transpose -> Reshape to rank 1 -> Gather by multi-dim indices -> Transpose of the last two axes."""
    rank = indices.ndim
    perm = [*range(rank - 2), rank - 1, rank - 2]
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0, 3]),
        h.make_node("Reshape", ["t", "flat"], ["v"]),
        h.make_node("Gather", ["v", "ids"], ["g"], axis=0),
        h.make_node("Transpose", ["g"], ["y"], perm=perm),
    ]
    inits: dict[str, np.ndarray] = {"flat": np.array([256], np.int64)}
    inputs = [("x", TensorProto.FLOAT, (8, 1, 2, 16))]
    if runtime:
        inputs.append(("ids", TensorProto.INT64, indices.shape))
    else:
        inits["ids"] = indices
    out_shape = tuple(indices.shape[p] for p in perm)
    return onnx.shape_inference.infer_shapes(make_model(nodes, inputs, [("y", TensorProto.FLOAT, out_shape)], inits))


def test_gather_of_vector_by_flat_indices_defect() -> None:
    """Overlapping windows of a transposed tensor (``as_strided``, as Longformer's and LED's sliding-window attention
    is exported) stop the process when the QNN session is created: SIGABRT, seen in a child. qnnx-opcheck refuses
    the Reshape as a crash; rewritten (a Gather by flat indices, then a Reshape) opcheck vouches for every node and
    QNN gathers exactly the CPU EP's elements."""
    from qnnx_opcheck import check_model

    windows = (np.arange(16)[None, None, None, :] + 16 * np.arange(4)[None, None, :, None]) + 32 * np.arange(6).reshape(
        2, 3, 1, 1
    )
    model = _transposed_window_gather(windows.astype(np.int64))
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 1, 2, 16)).astype(np.float32)}
    status, _, last_line = qnn_error_in_child(model.SerializeToString(), feeds)
    assert status == -6, f"expected SIGABRT, got status {status}: {last_line}"
    refused = [v for v in check_model(model, soc_model=60).verdicts if v.status != "supported"]
    assert [(v.op_type, v.kind) for v in refused] == [("Reshape", "crash")]
    fixed = _fixed(model, "gather_of_vector_by_flat_indices")
    assert all(v.status == "supported" for v in check_model(onnx.load_from_string(fixed), soc_model=60).verdicts)
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    out = qnn_session(fixed).run(None, feeds)[0]
    assert out.shape == ref.shape and _rel(out, ref) < 1e-3  # the same elements, rounded to fp16


def test_softmax_input_floor_defect() -> None:
    """Attention scores plus an additive float32-min mask, one query row fully masked (a left-padded prompt's
    padding): eager's row is uniform; on QNN it is a softmax of fp16 rounding noise, far off. Floored, every row is
    eager's."""
    rng = np.random.default_rng(0)
    shape = (1, 2, 4, 8)
    scores = (3 * rng.standard_normal(shape)).astype(np.float32)
    mask = np.zeros(shape, np.float32)
    mask[..., 0, :] = np.finfo(np.float32).min  # the first query sees no key
    mask[..., 1, 3:] = np.finfo(np.float32).min  # the second sees three
    nodes = [h.make_node("Add", ["x", "m"], ["s"]), h.make_node("Softmax", ["s"], ["y"], axis=-1)]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, shape), ("m", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, shape)], {}
    )
    feeds = {"x": scores, "m": mask}
    ref = cpu_session(model.SerializeToString()).run(None, feeds)[0]
    assert np.allclose(ref[..., 0, :], 1 / 8)
    broken = qnn_session(model.SerializeToString()).run(None, feeds)[0]
    assert float(np.abs(broken[..., 0, :] - ref[..., 0, :]).max()) > 0.05  # the defect: silently wrong
    fixed = qnn_session(_fixed(model, "softmax_input_floor")).run(None, feeds)[0]
    assert float(np.abs(fixed - ref).max()) < 2e-3


def test_bool_where_as_logic_defect() -> None:
    """A Where on bool builds neither on QNN (declined) nor with the CPU EP beside it (no kernel): the graph could
    not run outside PyTorch. As And/Or/Not it runs on QNN with the reference's values."""
    shape = (2, 6, 8)
    nodes = [h.make_node("Where", ["c", "x", "t"], ["y"])]
    model = make_model(
        nodes,
        [("c", TensorProto.BOOL, shape), ("x", TensorProto.BOOL, shape)],
        [("y", TensorProto.BOOL, shape)],
        {"t": np.array(True)},
    )
    rng = np.random.default_rng(0)
    feeds = {"c": rng.random(shape) < 0.5, "x": rng.random(shape) < 0.5}
    with pytest.raises(Exception, match=r"CPU EP|Where"):
        qnn_session(model.SerializeToString())
    with pytest.raises(Exception, match=r"implementation for Where"):
        cpu_session(model.SerializeToString())
    out = qnn_session(_fixed(model, "bool_where_as_logic")).run(None, feeds)[0]
    np.testing.assert_array_equal(out, np.where(feeds["c"], feeds["x"], True))
