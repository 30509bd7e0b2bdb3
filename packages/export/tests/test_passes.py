"""Each QNN-safety pass: removes its pattern, keeps results (ORT CPU), and leaves other graphs alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_onnx_builders import (
    add_layernorm,
    avgpool,
    conv_transpose,
    einsum,
    erf_gelu,
    gathernd,
    gathernd_runtime,
    make_model,
    merged_heads_matmul,
    pool,
    projection_into_heads,
    rmsnorm,
    to_bytes,
    to_ir,
    unsqueeze_int64,
)
from export_qnn_helpers import cpu_session
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto

import qnnx_export._passes
from qnnx_clikit import htp_averages_wrongly
from qnnx_export._pass_names import declared_passes
from qnnx_export._passes import DEFAULT_PASSES, PASS_REGISTRY, QnnPass, pass_table, register, run_passes
from qnnx_testkit.strategies import pool_windows, seeds, shapes


def _run(model_bytes: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return cpu_session(model_bytes).run(None, feeds)


def _apply(model: onnx.ModelProto, name: str) -> tuple[bytes, bool, object]:
    m = to_ir(model)
    ((_, changed),) = run_passes(m, (name,))
    return to_bytes(m), changed, m


def _ops(model_bytes: bytes) -> list[str]:
    return [n.op_type for n in onnx.load_from_string(model_bytes).graph.node]


def _assert_same(before: bytes, after: bytes, feeds: dict[str, np.ndarray], exact: bool = True) -> None:
    for a, b in zip(_run(before, feeds), _run(after, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_registry_and_table() -> None:
    """Every registered pass has a name, a defect sentence and a docstring; the default runs them all."""
    assert set(DEFAULT_PASSES) == set(PASS_REGISTRY)
    for row in pass_table():
        assert row["name"] and row["defect"] and row["doc"]


def test_the_declarations_are_the_registry_and_the_default_order() -> None:
    """The names the options read from the source (no import) are the registered classes, in their ``order``."""
    assert declared_passes() == tuple(PASS_REGISTRY) == DEFAULT_PASSES
    orders = [cls.order for cls in PASS_REGISTRY.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    for cls in PASS_REGISTRY.values():
        assert getattr(qnnx_export._passes, cls.__name__) is cls and cls.__name__ in qnnx_export._passes.__all__


def test_register_refuses_a_taken_order_or_name() -> None:
    taken = PASS_REGISTRY["fuse_erf_gelu"]
    for name, order in (("qnnx_test_new", taken.order), ("fuse_erf_gelu", 99_999)):
        cls = type("Clash", (QnnPass,), {"name": name})
        with pytest.raises(TypeError, match="cannot register pass Clash"):
            register(order=order)(cls)
    assert tuple(PASS_REGISTRY) == DEFAULT_PASSES


def test_the_options_read_the_pass_names_without_onnx_ir() -> None:
    """ExportOptions validates and resolves pass names from the declarations without importing the passes."""
    code = (
        "import sys, qnnx_export\n"
        "o = qnnx_export.ExportOptions(passes=('int64_to_int32',))\n"
        "assert qnnx_export.ExportOptions().resolved_passes()[-1] == 'int64_to_int32'\n"
        "print(sorted(m for m in ('onnx_ir', 'torch', 'qnnx_export._passes') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@given(
    batch=st.integers(2, 4),
    seq=st.integers(2, 6),
    hidden=st.sampled_from([4, 8, 16]),
    op=st.sampled_from(["Add", "Mul", "Sub", "Div"]),
    rank2=st.booleans(),
    dynamic=st.booleans(),
    seed=seeds(),
)
def test_tile_layernorm_broadcast_preserves_results(
    batch: int, seq: int, hidden: int, op: str, rank2: bool, dynamic: bool, seed: int
) -> None:
    """Batch-broadcast operands before LayerNorm are tiled (const) or Tile'd (computed), exactly."""
    shape = (seq, hidden) if rank2 else (1, seq, hidden)
    model, feeds = add_layernorm(batch, seq, hidden, op, shape, dynamic, seed)
    if op == "Div":
        feeds = {k: (np.abs(v) + 0.5 if k == "c" else v) for k, v in feeds.items()}
        if not dynamic:
            for init in model.graph.initializer:
                if init.name == "c":
                    init.CopyFrom(onnx.numpy_helper.from_array(np.abs(onnx.numpy_helper.to_array(init)) + 0.5, "c"))
    after, changed, m = _apply(model, "tile_layernorm_broadcast")
    assert changed
    assert PASS_REGISTRY["tile_layernorm_broadcast"]().find_defects(m.graph) == []
    if dynamic:
        assert "Tile" in _ops(after)
    # ORT's broadcast and same-shape kernels may differ in the last ulp.
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@pytest.mark.parametrize("shape", [(3, 1, 8), (8,), (1, 1, 8)])
def test_tile_layernorm_leaves_safe_broadcasts(shape: tuple[int, ...]) -> None:
    """Operands with the batch size or broadcasting only over channels are left alone."""
    model, _ = add_layernorm(3, 4, 8, "Add", shape, dynamic=False)
    _, changed, _ = _apply(model, "tile_layernorm_broadcast")
    assert not changed


def test_tile_layernorm_batch1_untouched() -> None:
    """At batch 1 there is nothing to tile."""
    model, _ = add_layernorm(1, 4, 8, "Add", (1, 4, 8), dynamic=False)
    assert not _apply(model, "tile_layernorm_broadcast")[1]


@given(batch=st.integers(1, 3), seq=st.integers(1, 5), hidden=st.sampled_from([4, 16]), seed=seeds(999))
def test_rmsnorm_weight_last_is_exact(batch: int, seq: int, hidden: int, seed: int) -> None:
    """Mul(w, normalized) becomes Mul(normalized, w) and results are bit-identical on CPU."""
    model, feeds = rmsnorm(batch, seq, hidden, weight_first=True, seed=seed)
    after, changed, _ = _apply(model, "rmsnorm_weight_last")
    assert changed
    last = onnx.load_from_string(after).graph.node[-1]
    assert last.op_type == "Mul" and last.input[1] == "w"
    _assert_same(model.SerializeToString(), after, feeds)


def test_rmsnorm_weight_last_ignores_other_muls() -> None:
    """A Mul(const, x) that is not an RMSNorm output is not touched."""
    model, _ = rmsnorm(1, 2, 4, weight_first=False)
    assert not _apply(model, "rmsnorm_weight_last")[1]


@given(
    shape=shapes(min_rank=1, max_side=5),
    form=st.sampled_from(["half_x_first", "mul_half_last", "div_two_last", "mul_inv_sqrt2"]),
    seed=seeds(999),
)
def test_fuse_erf_gelu(shape: list[int], form: str, seed: int) -> None:
    """Each Erf GELU form becomes one Gelu node (no Erf left) with the same values."""
    model, feeds = erf_gelu(shape, form, seed)
    after, changed, _ = _apply(model, "fuse_erf_gelu")
    assert changed
    ops = _ops(after)
    assert "Erf" not in ops and ops.count("Gelu") == 1
    assert [o.name for o in onnx.load_from_string(after).graph.output] == ["y", "r"]
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


def test_fuse_erf_gelu_ignores_plain_erf() -> None:
    """An Erf that is not part of GELU is left (it stays rejected by QNN, which is reported, not hidden)."""
    from export_onnx_builders import make_model
    from onnx import helper as h

    model = make_model(
        [h.make_node("Erf", ["x"], ["y"])], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], {}
    )
    assert not _apply(model, "fuse_erf_gelu")[1]


@st.composite
def _gathernd_case(draw: st.DrawFn) -> tuple[list[int], np.ndarray, int]:
    data_shape = draw(shapes(min_rank=1))
    m = draw(st.integers(1, len(data_shape)))
    batch = draw(shapes(min_rank=1, max_side=3))
    cols = [
        draw(st.lists(st.integers(-d, d - 1), min_size=int(np.prod(batch)), max_size=int(np.prod(batch))))
        for d in data_shape[:m]
    ]
    indices = np.stack([np.array(c, np.int64).reshape(batch) for c in cols], axis=-1)
    dtype = draw(st.sampled_from([TensorProto.BOOL, TensorProto.FLOAT, TensorProto.INT64]))
    return data_shape, indices, dtype


@given(case=_gathernd_case(), seed=seeds(999))
def test_gathernd_to_gather_exact(case: tuple[list[int], np.ndarray, int], seed: int) -> None:
    """GatherND with constant (also negative) indices becomes Reshape/Gather with identical results."""
    data_shape, indices, dtype = case
    model, feeds = gathernd(data_shape, indices, dtype, seed)
    after, changed, _ = _apply(model, "gathernd_to_gather")
    assert changed and "GatherND" not in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds)


@given(data_shape=shapes(min_rank=1, max_side=5), batch=shapes(min_rank=0, max_rank=3, max_side=12), seed=seeds(999))
def test_gathernd_runtime_indices_become_gather(data_shape: list[int], batch: list[int], seed: int) -> None:
    """GatherND by runtime indices of shape [..., 1] becomes a Gather along axis 0 with identical results (negative
    indices included); indices with a longer last axis are left alone, unless they have rank 4 and pick elements or
    rank-1 slices (then they are flattened, which test_qnn_defects.py proves)."""
    model, feeds = gathernd_runtime(data_shape, [*batch, 1], seed)
    after, changed, _ = _apply(model, "gathernd_to_gather")
    assert changed and "GatherND" not in _ops(after) and "Gather" in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds)
    if len(data_shape) >= 2:
        wider, _ = gathernd_runtime(data_shape, [*batch, 2], seed)
        flattened = len(batch) == 3 and len(data_shape) - 2 <= 1
        assert _apply(wider, "gathernd_to_gather")[1] == flattened


def test_gathernd_identity_becomes_reshape() -> None:
    """The HF padding-mask GatherND (every element in order) becomes Reshape only."""
    b, s = 2, 5
    idx = np.stack(np.meshgrid(np.arange(b), np.arange(s), indexing="ij"), axis=-1).reshape(b, 1, 1, s, 2)
    model, feeds = gathernd([b, s], idx)
    after, changed, _ = _apply(model, "gathernd_to_gather")
    assert changed and set(_ops(after)) == {"Reshape"}
    _assert_same(model.SerializeToString(), after, feeds)


@given(
    shape=shapes(),
    n_axes=st.integers(1, 2),
    negative=st.booleans(),
    seed=seeds(999),
)
def test_unsqueeze_int64_to_reshape(shape: list[int], n_axes: int, negative: bool, seed: int) -> None:
    """Unsqueeze on int64 data becomes an exact Reshape; no int64 Unsqueeze is left."""
    rank = len(shape) + n_axes
    axes = list(range(n_axes)) if not negative else [-(i + 1) for i in range(n_axes)]
    assert all(-rank <= a < rank for a in axes)
    model, feeds = unsqueeze_int64(shape, axes, seed)
    after, changed, _ = _apply(model, "unsqueeze_int64_to_reshape")
    assert changed and "Unsqueeze" not in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds)


def test_int64_inputs_to_int32() -> None:
    """An int64 input used only as Gather indices becomes int32 without a Cast; other uses get a Cast."""
    from export_onnx_builders import make_model
    from onnx import helper as h

    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    nodes = [
        h.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        h.make_node("Add", ["pos", "one"], ["pos1"]),
    ]
    model = make_model(
        nodes,
        [("ids", TensorProto.INT64, [3]), ("pos", TensorProto.INT64, [3])],
        [("emb", TensorProto.FLOAT, [3, 2]), ("pos1", TensorProto.INT64, [3])],
        {"table": table, "one": np.array(1, np.int64)},
    )
    after, changed, _ = _apply(model, "int64_to_int32")
    assert changed
    proto = onnx.load_from_string(after)
    assert [i.type.tensor_type.elem_type for i in proto.graph.input] == [TensorProto.INT32, TensorProto.INT32]
    assert _ops(after).count("Cast") == 1
    ids, pos = np.array([5, 0, 2], np.int64), np.array([7, 8, 9], np.int64)
    before = _run(model.SerializeToString(), {"ids": ids, "pos": pos})
    now = _run(after, {"ids": ids.astype(np.int32), "pos": pos.astype(np.int32)})
    np.testing.assert_array_equal(before[0], now[0])
    np.testing.assert_array_equal(before[1], now[1])
    assert now[1].dtype == np.int64


@given(steps=st.lists(st.sampled_from(["Transpose", "Reshape", "Unsqueeze", "Slice", "Add"]), max_size=4))
def test_int64_indices_reach_gather_as_int32_through_layout_ops(steps: list[str]) -> None:
    """Token ids that reach a Gather's indices through ops that only move elements (XLNet transposes its ids) are
    int32 all the way, no Cast; any arithmetic on the way keeps one Cast back to int64; the gathered values are the
    same either way."""
    from export_onnx_builders import make_model
    from onnx import helper as h

    nodes, shape, name = [], [2, 3], "ids"
    inits: dict[str, np.ndarray] = {"table": np.arange(20, dtype=np.float32).reshape(10, 2)}
    for k, op in enumerate(steps):
        out = f"v{k}"
        if op == "Transpose":
            nodes.append(h.make_node("Transpose", [name], [out], perm=list(reversed(range(len(shape))))))
            shape = list(reversed(shape))
        elif op == "Reshape":
            inits[f"s{k}"] = np.array([-1], np.int64)
            nodes.append(h.make_node("Reshape", [name, f"s{k}"], [out]))
            shape = [int(np.prod(shape))]
        elif op == "Unsqueeze":
            inits[f"a{k}"] = np.array([0], np.int64)
            nodes.append(h.make_node("Unsqueeze", [name, f"a{k}"], [out]))
            shape = [1, *shape]
        elif op == "Slice":
            inits[f"b{k}"], inits[f"e{k}"], inits[f"x{k}"] = (np.array([v], np.int64) for v in (0, 2, -1))
            nodes.append(h.make_node("Slice", [name, f"b{k}", f"e{k}", f"x{k}"], [out]))
            shape = [*shape[:-1], min(shape[-1], 2)]
        else:
            inits[f"one{k}"] = np.array(1, np.int64)
            nodes.append(h.make_node("Add", [name, f"one{k}"], [out]))
        name = out
    nodes.append(h.make_node("Gather", ["table", name], ["emb"], axis=0))
    model = make_model(nodes, [("ids", TensorProto.INT64, [2, 3])], [("emb", TensorProto.FLOAT, None)], inits)
    after, changed, _ = _apply(model, "int64_to_int32")
    assert changed
    assert _ops(after).count("Cast") == (1 if "Add" in steps else 0)
    ids = np.array([[5, 0, 2], [1, 3, 4]], np.int64)
    before = _run(model.SerializeToString(), {"ids": ids})
    now = _run(after, {"ids": ids.astype(np.int32)})
    np.testing.assert_array_equal(before[0], now[0])


def test_default_pipeline_is_noop_on_clean_graph() -> None:
    """On a graph with none of the patterns, no pass reports a change."""
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w"], ["m"]),
        onnx.helper.make_node("Relu", ["m"], ["s"]),
        onnx.helper.make_node("Mul", ["m", "s"], ["y"]),
    ]
    w = np.ones((4, 4), np.float32)
    model = make_model(nodes, [("x", TensorProto.FLOAT, (2, 4))], [("y", TensorProto.FLOAT, (2, 4))], {"w": w})
    m = to_ir(model)
    assert not any(changed for _, changed in run_passes(m, DEFAULT_PASSES))


@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 5),
    hidden=st.sampled_from([4, 16]),
    weight_first=st.booleans(),
    magnitude=st.sampled_from([1.0, 400.0, 3000.0]),
    seed=seeds(999),
)
def test_fuse_rmsnorm_keeps_results(
    batch: int, seq: int, hidden: int, weight_first: bool, magnitude: float, seed: int
) -> None:
    """The decomposed RMSNorm becomes one RMSNormalization (opset 23) of the rank-2 view of x (the one shape class
    QNN HTP computes right), computing the same values on the CPU EP."""
    model, feeds = rmsnorm(batch, seq, hidden, weight_first=weight_first, seed=seed)
    feeds = {"x": feeds["x"] * np.float32(magnitude)}
    after, changed, m = _apply(model, "fuse_rmsnorm")
    assert changed and _ops(after) == ["Reshape", "RMSNormalization", "Reshape"]
    (norm,) = [n for n in m.graph if n.op_type == "RMSNormalization"]
    assert norm.inputs[0] is not None and norm.inputs[0].shape is not None and len(norm.inputs[0].shape) == 2
    assert m.opset_imports[""] == 23
    for a, b in zip(_run(model.SerializeToString(), feeds), _run(after, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@given(depth=st.integers(2, 4), weighted=st.booleans(), rows=st.integers(1, 6), seed=seeds(999))
def test_fuse_rmsnorm_fuses_a_norm_of_a_norm(depth: int, weighted: bool, rows: int, seed: int) -> None:
    """RMSNorms applied one after another (``norm(norm(x))``, as an embedding norm before a block's pre-norm) all
    fuse: each outer norm reads the inner one's fused output, no decomposed norm is left (the pass's postcondition
    held, so the export does not give up), and the values are unchanged."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, rows, 8)) * 30).astype(np.float32)
    nodes, inits, src = [], {"eps": np.array(1e-6, np.float32), "axes": np.array([-1], np.int64)}, "x"
    for i in range(depth):
        nodes += [
            onnx.helper.make_node("Mul", [src, src], [f"p{i}"]),
            onnx.helper.make_node("ReduceMean", [f"p{i}", "axes"], [f"m{i}"], keepdims=1),
            onnx.helper.make_node("Add", [f"m{i}", "eps"], [f"a{i}"]),
            onnx.helper.make_node("Sqrt", [f"a{i}"], [f"s{i}"]),
            onnx.helper.make_node("Reciprocal", [f"s{i}"], [f"r{i}"]),
            onnx.helper.make_node("Mul", [src, f"r{i}"], [f"n{i}"]),
        ]
        src = f"n{i}"
        if weighted:
            inits[f"w{i}"] = (1 + 0.1 * rng.standard_normal(8)).astype(np.float32)
            nodes.append(onnx.helper.make_node("Mul", [src, f"w{i}"], [f"y{i}"]))
            src = f"y{i}"
    nodes.append(onnx.helper.make_node("Identity", [src], ["y"]))
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    after, changed, m = _apply(model, "fuse_rmsnorm")
    assert changed and [n.op_type for n in m.graph].count("RMSNormalization") == depth
    assert not PASS_REGISTRY["fuse_rmsnorm"]().find_defects(m.graph)
    np.testing.assert_allclose(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0], rtol=1e-4)


@given(
    shape=shapes(min_rank=1, max_side=6),
    data=st.data(),
    keepdims=st.booleans(),
    form=st.sampled_from(["reduce_l2", "sqrt_sum", "sqrt_mean", "std"]),
    scale=st.sampled_from([0.0, 1e-3, 1.0, 500.0]),
)
def test_l2_norm_prescaled_keeps_results(
    shape: list[int], data: st.DataObject, keepdims: bool, form: str, scale: float
) -> None:
    """ReduceL2, Sqrt(ReduceSum(x * x)), Sqrt(ReduceMean(x ** 2)) and torch.onnx's std (squares, mean, Bessel
    factor, root) become the same computation on x / m, scaled back by m (the largest |x| over the axes): the same
    values on the CPU EP (a row of zeros stays 0, not NaN), and a second run finds nothing left to rewrite."""
    axes = sorted({a % len(shape) for a in data.draw(st.sets(st.integers(-len(shape), len(shape) - 1), min_size=1))})
    n = int(np.prod([shape[a] for a in axes]))
    inits = {"axes": np.array(axes, np.int64), "two": np.array(2.0, np.float32)}
    k = int(keepdims)
    make = onnx.helper.make_node
    nodes = {
        "reduce_l2": [make("ReduceL2", ["x", "axes"], ["y"], keepdims=k)],
        "sqrt_sum": [make("Mul", ["x", "x"], ["p"]), make("ReduceSum", ["p", "axes"], ["s"], keepdims=k)],
        "sqrt_mean": [make("Pow", ["x", "two"], ["p"]), make("ReduceMean", ["p", "axes"], ["s"], keepdims=k)],
        "std": [
            make("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
            make("Sub", ["x", "mean"], ["d"]),
            make("Mul", ["d", "d"], ["p"]),
            make("ReduceMean", ["p", "axes"], ["v"], keepdims=k),
            make("Mul", ["v", "n"], ["vn"]),
            make("Div", ["vn", "n1"], ["s"]),
        ],
    }[form]
    if form != "reduce_l2":
        nodes.append(make("Sqrt", ["s"], ["y"]))
    inits["n"], inits["n1"] = np.array(n, np.float32), np.array(max(n - 1, 1), np.float32)
    model = make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], inits)
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype(np.float32)
    after, changed, m = _apply(model, "l2_norm_prescaled")
    assert changed
    (want,), (got,) = _run(model.SerializeToString(), {"x": x}), _run(after, {"x": x})
    assert got.shape == want.shape and not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
    ((_, again),) = run_passes(m, ("l2_norm_prescaled",))
    assert not again


@given(shape=shapes(min_rank=1, max_side=5), scale=st.sampled_from([1.0, 10.0, 1000.0]))
def test_exp_input_floor_keeps_every_float16_value(shape: list[int], scale: float) -> None:
    """Exp(x) becomes Exp(Clip(x, -87, log(65504))): on the CPU EP every result float16 can hold is unchanged
    (below 1.6e-38 the results are 0 or nearly so, above 65504 float16 saturates), and a second run changes nothing."""
    model = make_model(
        [onnx.helper.make_node("Exp", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, shape)],
        [("y", TensorProto.FLOAT, shape)],
        {},
    )
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype(np.float32)
    after, changed, m = _apply(model, "exp_input_floor")
    assert changed
    (want,), (got,) = _run(model.SerializeToString(), {"x": x}), _run(after, {"x": x})
    held = (want <= 65504) & (want >= 6e-8)
    np.testing.assert_allclose(got[held], want[held], rtol=1e-6)
    assert (got[want > 65504] <= 65504 * 1.0001).all() and (got[want < 6e-8] < 6e-8).all()
    ((_, again),) = run_passes(m, ("exp_input_floor",))
    assert not again


@given(shape=shapes(min_rank=1, max_side=5), data=st.data(), reduce=st.booleans(), keepdims=st.booleans())
def test_stable_log_sum_exp_keeps_results(shape: list[int], data: st.DataObject, reduce: bool, keepdims: bool) -> None:
    """LogSoftmax and ReduceLogSumExp written out with the maximum subtracted compute the same values on the CPU EP
    (rows spanning +-50, where every term is a float32 number)."""
    x = np.random.default_rng(len(shape)).uniform(-50, 50, shape).astype(np.float32)
    if reduce:
        axes = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1), label="axes"))
        node = onnx.helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=int(keepdims))
        inits = {"axes": np.array(axes, np.int64)}
    else:
        if max(shape) == 1:
            shape, x = [*shape[:-1], 2], np.resize(x, [*shape[:-1], 2])
        axis = data.draw(st.sampled_from([i for i, d in enumerate(shape) if d > 1]), label="axis")
        node, inits = onnx.helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis), {}
    model = make_model([node], [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], inits)
    after, changed, _ = _apply(model, "stable_log_sum_exp")
    assert changed
    (want,), (got,) = _run(model.SerializeToString(), {"x": x}), _run(after, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@given(shape=shapes(min_rank=1, max_side=5), scale=st.sampled_from([1.0, 30.0]))
def test_mish_as_softplus_keeps_results(shape: list[int], scale: float) -> None:
    """Mish becomes x * tanh(softplus(x)), its definition: the same values on the CPU EP."""
    model = make_model(
        [onnx.helper.make_node("Mish", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, shape)],
        [("y", TensorProto.FLOAT, shape)],
        {},
    )
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype(np.float32)
    after, changed, _ = _apply(model, "mish_as_softplus")
    assert changed
    np.testing.assert_allclose(
        _run(after, {"x": x})[0], _run(model.SerializeToString(), {"x": x})[0], rtol=1e-5, atol=1e-6
    )


def test_fuse_rmsnorm_over_several_axes_reshapes() -> None:
    """RMSNorm over the last two axes is fused through a Reshape (QNN HTP normalizes the last axis only)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 500
    nodes = [
        onnx.helper.make_node("Mul", ["x", "x"], ["p"]),
        onnx.helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        onnx.helper.make_node("Add", ["m", "eps"], ["a"]),
        onnx.helper.make_node("Sqrt", ["a"], ["s"]),
        onnx.helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    inits = {"axes": np.array([-2, -1], np.int64), "eps": np.array(0.5, np.float32)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    after, changed, _ = _apply(model, "fuse_rmsnorm")
    assert changed and _ops(after) == ["Reshape", "RMSNormalization", "Reshape"]
    np.testing.assert_allclose(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0], rtol=1e-4)


def test_fuse_rmsnorm_skips_graph_with_group_norm() -> None:
    """A graph holding GroupNormalization (whose meaning changed at opset 21) is not moved to opset 23."""
    model, _ = rmsnorm(1, 2, 4, weight_first=False)
    gn = onnx.helper.make_node("GroupNormalization", ["x", "gs", "gb"], ["g"], num_groups=1)
    model.graph.node.append(gn)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("gs", "gb")])
    model.graph.output.append(onnx.helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    assert not _apply(model, "fuse_rmsnorm")[1]


@given(shape=shapes(min_rank=1, max_side=5), scale=st.sampled_from([1.0, 9.0, 30.0]))
def test_logsigmoid_to_softplus_keeps_results(shape: list[int], scale: float) -> None:
    """Log(Sigmoid(x)) becomes the overflow-free x - relu(x) - log(1 + exp(-|x|)) with the same values (and no -inf
    for large -x)."""
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype(np.float32)
    nodes = [onnx.helper.make_node("Sigmoid", ["x"], ["s"]), onnx.helper.make_node("Log", ["s"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, shape)], {})
    after, changed, _ = _apply(model, "logsigmoid_to_softplus")
    ops = _ops(after)
    assert changed and "Sigmoid" not in ops and "Softplus" not in ops
    assert ops.count("Reshape") == (2 if len(shape) == 5 else 0)  # rank 5 is computed on the 1-D view
    ref = -np.logaddexp(0, -x)
    np.testing.assert_allclose(_run(after, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)


@given(
    dims=shapes(min_rank=6, max_rank=7, max_side=3),
    perm=st.data(),
)
def test_fold_high_rank_transpose_is_exact(dims: list[int], perm: st.DataObject) -> None:
    """Reshape -> rank-6+ Transpose -> Reshape is rewritten at rank <= 5 when the permutation allows, exactly."""
    order = perm.draw(st.permutations(range(len(dims))))
    total = int(np.prod(dims))
    x = np.arange(total, dtype=np.float32).reshape(total // dims[-1], dims[-1])
    nodes = [
        onnx.helper.make_node("Reshape", ["x", "s6"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t"], perm=list(order)),
        onnx.helper.make_node("Reshape", ["t", "s2"], ["y"]),
    ]
    inits = {"s6": np.array(dims, np.int64), "s2": np.array(x.shape, np.int64)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    model = onnx.shape_inference.infer_shapes(model)
    after, changed, m = _apply(model, "fold_high_rank_transpose")
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])
    if changed:
        ranks = [len(v.shape) for n in m.graph for v in n.outputs if v.shape is not None]
        assert max(ranks) <= 5


@given(dims=shapes(min_rank=6, max_rank=7, max_side=3), perms=st.data())
def test_two_high_rank_transposes_compose_and_fold_exactly(dims: list[int], perms: st.DataObject) -> None:
    """Reshape -> two rank-6+ Transposes -> Reshape (einsum's lowering): composed into one Transpose, then folded at
    rank <= 5 when the permutation allows (axes of size 1 order nothing), the same elements in the same order."""
    first = perms.draw(st.permutations(range(len(dims))))
    second = perms.draw(st.permutations(range(len(dims))))
    total = int(np.prod(dims))
    x = np.arange(total, dtype=np.float32).reshape(total // dims[-1], dims[-1])
    nodes = [
        onnx.helper.make_node("Reshape", ["x", "s6"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t1"], perm=list(first)),
        onnx.helper.make_node("Transpose", ["t1"], ["t2"], perm=list(second)),
        onnx.helper.make_node("Reshape", ["t2", "s2"], ["y"]),
    ]
    inits = {"s6": np.array(dims, np.int64), "s2": np.array(x.shape, np.int64)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    model = onnx.shape_inference.infer_shapes(model)
    m = to_ir(model)
    report = dict(run_passes(m, ("compose_high_rank_transposes", "fold_high_rank_transpose")))
    assert report["compose_high_rank_transposes"]
    assert [n.op_type for n in m.graph].count("Transpose") == 1
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(to_bytes(m), {"x": x})[0])
    if report["fold_high_rank_transpose"]:
        assert max(len(v.shape) for n in m.graph for v in n.outputs if v.shape is not None) <= 5


@given(dims=shapes(min_rank=6, max_rank=7, max_side=3), extra=st.booleans(), zero=st.booleans())
def test_reshape_of_high_rank_reshape_is_exact(dims: list[int], extra: bool, zero: bool) -> None:
    """Reshape -> rank-6+ Reshape(s) -> Reshape reads the first input directly, with the same elements in the same
    order; a 0 (copy the input's dim) in the last target keeps its meaning, and the rank-6+ tensors are gone."""
    total = int(np.prod(dims))
    x = np.arange(total, dtype=np.float32).reshape(dims[0], total // dims[0])
    out = (dims[0], total // dims[0])
    nodes = [onnx.helper.make_node("Reshape", ["x", "s6"], ["r"])]
    if extra:  # a second rank-6+ view in the chain
        nodes.append(onnx.helper.make_node("Reshape", ["r", "s6b"], ["r2"]))
    nodes.append(onnx.helper.make_node("Reshape", ["r2" if extra else "r", "s2"], ["y"]))
    inits = {
        "s6": np.array(dims, np.int64),
        "s6b": np.array([*dims[:-1], 1, dims[-1]], np.int64),
        "s2": np.array([0 if zero else out[0], -1], np.int64),
    }
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, out)], inits)
    model = onnx.shape_inference.infer_shapes(model)
    after, changed, m = _apply(model, "reshape_of_high_rank_reshape")
    assert changed
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])
    assert max(len(v.shape) for n in m.graph for v in n.outputs if v.shape is not None) <= 5


def test_fold_high_rank_transpose_swin_partition() -> None:
    """Swin's window partition (B, H/w, w, W/w, w, C) with perm (0,1,3,2,4,5) folds to rank 4."""
    b, h, w, c, ws = 2, 4, 6, 3, 2
    x = np.random.default_rng(0).standard_normal((b, h, w, c)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Reshape", ["x", "s6"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
        onnx.helper.make_node("Reshape", ["t", "s4"], ["y"]),
    ]
    inits = {
        "s6": np.array([b, h // ws, ws, w // ws, ws, c], np.int64),
        "s4": np.array([-1, ws, ws, c], np.int64),
    }
    out_shape = (b * (h // ws) * (w // ws), ws, ws, c)
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, out_shape)], inits)
    model = onnx.shape_inference.infer_shapes(model)
    after, changed, _ = _apply(model, "fold_high_rank_transpose")
    assert changed
    inferred = onnx.shape_inference.infer_shapes(onnx.load_from_string(after))
    assert all(len(v.type.tensor_type.shape.dim) <= 5 for v in inferred.graph.value_info)
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])


@given(
    batch=st.integers(1, 2),
    grid=st.integers(1, 4),
    window=st.integers(2, 7),
    channels=st.integers(1, 40),
    reverse=st.booleans(),
)
def test_fold_high_rank_transpose_keeps_channels_axis(
    batch: int, grid: int, window: int, channels: int, reverse: bool
) -> None:
    """Swin's window partition and reverse fold to rank <= 5 with the same values, and channels of 4 or more stay
    an axis of their own (merged into the window's columns, QNN HTP fails the reverse's graph finalize) unless the
    window's side equals them ([..., C, C] after a projection to C kills the process in QNN)."""
    side = grid * window
    x = np.random.default_rng(channels).standard_normal((batch, side, side, channels)).astype(np.float32)
    six = [batch, grid, grid, window, window, channels] if reverse else [batch, grid, window, grid, window, channels]
    nodes = [
        onnx.helper.make_node("Reshape", ["x", "s6"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
        onnx.helper.make_node("Reshape", ["t", "s4"], ["y"]),
    ]
    inits = {"s6": np.array(six, np.int64), "s4": np.array(x.shape, np.int64)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    after, changed, m = _apply(model, "fold_high_rank_transpose")
    assert changed
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])
    (moved,) = [n.outputs[0].shape for n in m.graph if n.op_type == "Transpose"]
    assert moved is not None and len(moved) <= 5
    assert (moved[-1] == channels) == (channels >= 4 and window != channels)


@given(
    rank=st.sampled_from([3, 4, 5]),
    kernel=st.integers(1, 3),
    size=st.integers(3, 6),
    ceil=st.booleans(),
    pad=st.booleans(),
)
def test_avgpool_count_include_pad_cleared_only_when_inert(
    rank: int, kernel: int, size: int, ceil: bool, pad: bool
) -> None:
    """count_include_pad is cleared only without pads and ceil_mode, and the CPU EP gives the same values."""
    spatial = rank - 2
    pads = [1 if pad and kernel > 1 else 0] * (2 * spatial)
    node = onnx.helper.make_node(
        "AveragePool",
        ["x"],
        ["y"],
        kernel_shape=[kernel] * spatial,
        pads=pads,
        ceil_mode=int(ceil),
        count_include_pad=1,
    )
    x = np.random.default_rng(size).standard_normal((1, 2) + (size,) * spatial).astype(np.float32)
    model = make_model([node], [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, None)], {})
    after, changed, _ = _apply(model, "avgpool_count_include_pad")
    assert changed is (not any(pads) and not ceil)
    np.testing.assert_allclose(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0], rtol=1e-6)


@given(scale=st.sampled_from([1.0, 9.0, 40.0]), one_first=st.booleans())
def test_fuse_softplus_keeps_results(scale: float, one_first: bool) -> None:
    """Log(Exp(z) + 1) becomes the overflow-free relu(z) + log(1 + exp(-|z|)), with the same values (and no
    overflow for large z); a second run finds nothing to rewrite (its own log(1 + exp(-|z|)) cannot overflow)."""
    z = (np.random.default_rng(1).standard_normal((3, 5)) * scale).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Exp", ["z"], ["e"]),
        onnx.helper.make_node("Add", ["one", "e"] if one_first else ["e", "one"], ["a"]),
        onnx.helper.make_node("Log", ["a"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("z", TensorProto.FLOAT, z.shape)],
        [("y", TensorProto.FLOAT, z.shape)],
        {"one": np.array(1.0, np.float32)},
    )
    after, changed, m = _apply(model, "fuse_softplus")
    assert changed and _ops(after) == ["Abs", "Mul", "Exp", "Add", "Log", "Relu", "Add"]
    assert run_passes(m, ("fuse_softplus",)) == [("fuse_softplus", False)]
    np.testing.assert_allclose(_run(after, {"z": z})[0], np.logaddexp(0, z), rtol=1e-5, atol=1e-5)


def test_safe_softmax_threshold_keeps_results() -> None:
    """Equal(ReduceMax(x), -inf) becomes LessOrEqual(ReduceMax(x), -32768): same rows zeroed on the CPU EP."""
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x[0] = -np.inf  # fully masked row
    x[1, :2] = -np.inf  # partly masked row
    nodes = [
        onnx.helper.make_node("Softmax", ["x"], ["s"], axis=1),
        onnx.helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1),
        onnx.helper.make_node("Equal", ["m", "ninf"], ["e"]),
        onnx.helper.make_node("Where", ["e", "zero", "s"], ["y"]),
    ]
    inits = {"axes": np.array([1], np.int64), "ninf": np.array(-np.inf, np.float32), "zero": np.array(0, np.float32)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    after, changed, _ = _apply(model, "safe_softmax_without_inf")
    assert changed and "Equal" not in _ops(after) and "LessOrEqual" in _ops(after)
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])


def test_drop_empty_concat_inputs_is_exact() -> None:
    """Concat([a, empty]) loses its zero-width input (Phi-3's partial rotary); the result is the same."""
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Slice", ["x", "s", "e", "ax"], ["empty"]),
        onnx.helper.make_node("Concat", ["x", "empty"], ["y"], axis=1),
    ]
    inits = {"s": np.array([4], np.int64), "e": np.array([4], np.int64), "ax": np.array([1], np.int64)}
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits)
    model = onnx.shape_inference.infer_shapes(model)
    after, changed, _ = _apply(model, "drop_empty_concat_inputs")
    assert changed and "Slice" not in _ops(after) and "Concat" not in _ops(after)
    np.testing.assert_array_equal(_run(model.SerializeToString(), {"x": x})[0], _run(after, {"x": x})[0])


@given(
    table=st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple),
    index_shape=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
    data=st.data(),
)
def test_gather_runtime_indices_as_rows_exact_or_untouched(
    table: tuple[int, ...], index_shape: tuple[int, ...], data: st.DataObject
) -> None:
    """A Gather by runtime indices along an inner axis after a dim > 1 becomes the row form with identical results
    (negative indices too); along the leading axis, or the last by indices of rank <= 1, it is left as it is."""
    axis = data.draw(st.integers(-len(table), len(table) - 1), label="axis")
    a = axis % len(table)
    out = (*table[:a], *index_shape, *table[a + 1 :])
    node = onnx.helper.make_node("Gather", ["x", "ids"], ["y"], axis=axis)
    model = make_model(
        [node],
        [("x", TensorProto.FLOAT, table), ("ids", TensorProto.INT64, index_shape)],
        [("y", TensorProto.FLOAT, out)],
        {},
    )
    rng = np.random.default_rng(len(out))
    ids = rng.integers(-table[a], table[a], index_shape)
    feeds = {"x": rng.standard_normal(table).astype(np.float32), "ids": ids}
    after, changed, _ = _apply(model, "gather_runtime_indices_as_rows")
    applies = int(np.prod(table[:a])) > 1 and not (a == len(table) - 1 and len(index_shape) <= 1)
    assert changed == applies
    _assert_same(model.SerializeToString(), after, feeds)
    np.testing.assert_array_equal(_run(after, feeds)[0], feeds["x"].take(ids, axis=a))


@given(
    rows=st.integers(1, 6),
    width=st.integers(1, 5),
    index_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
    factor=st.floats(-100, 100, allow_nan=False, width=32),
    between=st.sampled_from(["none", "Reshape", "Transpose"]),
    shared=st.booleans(),
)
def test_fold_gather_scale_exact(
    rows: int, width: int, index_shape: tuple[int, ...], factor: float, between: str, shared: bool
) -> None:
    """Mul(Gather(E, ids), c) (with a reshape or transpose between) becomes Gather(E * c, ids), bit for bit; when
    the gathered rows are also used unscaled, nothing is folded."""
    table = np.random.default_rng(rows * width).standard_normal((rows, width)).astype(np.float32)
    out = (*index_shape, width)
    nodes = [onnx.helper.make_node("Gather", ["E", "ids"], ["g"])]
    inits = {"E": table, "c": np.array(factor, np.float32)}
    scaled = "g"
    if between == "Reshape":
        out = (int(np.prod(index_shape)), width)
        inits["s"] = np.array(out, np.int64)
        nodes.append(onnx.helper.make_node("Reshape", ["g", "s"], ["m"]))
        scaled = "m"
    elif between == "Transpose":
        out = out[::-1]
        nodes.append(onnx.helper.make_node("Transpose", ["g"], ["m"], perm=list(range(len(out)))[::-1]))
        scaled = "m"
    nodes.append(onnx.helper.make_node("Mul", [scaled, "c"], ["y"]))
    outputs = [("y", TensorProto.FLOAT, out)]
    if shared:
        outputs.append(("g", TensorProto.FLOAT, (*index_shape, width)))
    model = make_model(nodes, [("ids", TensorProto.INT64, index_shape)], outputs, inits)
    feeds = {"ids": np.random.default_rng(1).integers(0, rows, index_shape)}
    after, changed, _ = _apply(model, "fold_gather_scale")
    assert changed == (not shared)
    if changed:
        assert "Mul" not in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds)


# --------------------------------------------------------------------------------------- avgpool_whole_windows

_CEIL_PAD = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
# Each AveragePool QNN HTP gets wrong, by the condition: (input shape, attributes).
_POOL_DEFECTS: dict[str, tuple[list[int], dict[str, object]]] = {
    "efficientnet_ceil_include_pad": ([2, 3, 8, 8], {**_CEIL_PAD, "count_include_pad": 1}),
    "efficientnet_ceil_exclude_pad": ([2, 3, 8, 8], {**_CEIL_PAD, "count_include_pad": 0}),
    # The last ceil window would start in the end padding: ONNX Runtime and PyTorch drop it (3x3 -> 2x2, not 3x3).
    "ceil_window_starts_in_end_padding": (
        [1, 2, 3, 3],
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    ),
    "ceil_window_starts_past_the_end": ([1, 2, 4, 5], {"kernel_shape": [1, 1], "strides": [2, 2], "ceil_mode": 1}),
    "ceil_without_pads": ([1, 2, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    "pad_of_half_the_kernel": ([1, 2, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asymmetric_kernel_strides_pads": (
        [1, 2, 6, 5],
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 1], "ceil_mode": 1, "count_include_pad": 1},
    ),
    "1d_include_pad": ([2, 3, 9], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 1}),
    "1d_ceil_overhang": ([2, 3, 10], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
    "3d_ceil_include_pad": (
        [1, 2, 5, 4, 5],
        {
            "kernel_shape": [3, 3, 2],
            "strides": [2, 2, 2],
            "pads": [1, 1, 0, 1, 1, 1],
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
    ),
    "3d_include_pad_without_pads": (
        [2, 3, 4, 4, 4],
        {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "count_include_pad": 1},
    ),
}


def _pool_attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _assert_whole_windows(after: bytes) -> None:
    """Every AveragePool of ``after`` pools whole windows (no pads, ceil_mode or count_include_pad: HTP computes
    those right), and no Pad feeds one (ONNX Runtime's PadFusion would fold it back in as count_include_pad pads)."""
    graph = onnx.load_from_string(after).graph
    assert "Pad" not in _ops(after)
    for node in graph.node:
        if node.op_type == "AveragePool":
            attrs = _pool_attrs(node)
            assert not any(attrs.get("pads", ())) and not attrs.get("ceil_mode") and not attrs.get("count_include_pad")


def _assert_pool_equal(before: bytes, after: bytes, feeds: dict[str, np.ndarray], rtol: float = 1e-6) -> None:
    """The rewritten graph gives the node's values on the CPU EP, to ``rtol`` of the output's scale (the factor
    kernel / divisor is rounded once)."""
    (ref,), (out,) = _run(before, feeds), _run(after, feeds)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = float(np.abs(ref).max(initial=0.0)) or 1.0
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("case", sorted(_POOL_DEFECTS))
def test_avgpool_whole_windows_equals_the_node(case: str) -> None:
    """Each AveragePool condition HTP gets wrong becomes zeros joined on with Concat, a pool of whole windows and a
    Mul by kernel area / divisor, with the node's values on the CPU EP (its divisor, its dropped ceil windows)."""
    shape, attrs = _POOL_DEFECTS[case]
    model, feeds = avgpool(shape, **attrs)
    after, changed, m = _apply(model, "avgpool_whole_windows")
    assert changed and PASS_REGISTRY["avgpool_whole_windows"]().find_defects(m.graph) == []
    _assert_whole_windows(after)
    _assert_pool_equal(model.SerializeToString(), after, feeds)


def test_avgpool_whole_windows_writes_only_what_the_node_needs() -> None:
    """Without a ceil overhang count_include_pad divides by the kernel everywhere (no Mul); without pads nothing is
    joined on (no Concat): rank 5's count_include_pad alone is a plain pool."""
    for case, ops in (("1d_include_pad", ["Concat", "AveragePool"]), ("3d_include_pad_without_pads", ["AveragePool"])):
        shape, attrs = _POOL_DEFECTS[case]
        after, changed, _ = _apply(avgpool(shape, **attrs)[0], "avgpool_whole_windows")
        assert changed and _ops(after) == ops, case
    shape, attrs = _POOL_DEFECTS["efficientnet_ceil_exclude_pad"]
    after, _, _ = _apply(avgpool(shape, **attrs)[0], "avgpool_whole_windows")
    assert _ops(after) == ["Concat", "Concat", "AveragePool", "Mul"]
    factor = onnx.numpy_helper.to_array(onnx.load_from_string(after).graph.initializer[-1])
    # Output [5, 5]; along each axis the first window holds 2 input elements, the last 1 (then the end pad and the
    # ceil overhang), the others 3.
    axis = np.array([3 / 2, 1, 1, 1, 3])
    np.testing.assert_allclose(factor, np.outer(axis, axis)[None, None], rtol=1e-7)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ([1, 2, 8, 8], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ([1, 2, 7, 7], {**_CEIL_PAD, "count_include_pad": 0}),  # ceil_mode, every window whole: HTP is right
        ([1, 2, 8, 8], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "dilations": [2, 2]}),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1}),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "pads": [2, 2, 2, 2]}),  # a pad of the kernel: ORT refuses the node
        (["batch", 2, 8, 8], {**_CEIL_PAD, "count_include_pad": 1}),  # no static shape
    ],
    ids=["plain", "ceil_whole_windows", "dilated", "auto_pad", "pad_of_the_kernel", "dynamic_batch"],
)
def test_avgpool_whole_windows_leaves_other_pools(shape: list[object], attrs: dict[str, object]) -> None:
    """A pool HTP computes right, or one the pass does not handle (dilation, auto_pad, a node ONNX Runtime refuses,
    a shape that is not static), is left as it is."""
    model = avgpool([1, 2, 8, 8], **attrs)[0]
    model.graph.input[0].CopyFrom(onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
    assert not _apply(model, "avgpool_whole_windows")[1]


# ---------------------------------------------------------------------------------------- maxpool_padded_input

# Padded and ceil_mode MaxPools, by the condition: (input shape, attributes).
_MAXPOOLS: dict[str, tuple[list[int], dict[str, object]]] = {
    # The measured defect: the last column of 2-wide, 2-stride windows padded on both sides comes out 0 on HTP.
    "two_wide_padded_both_sides": ([1, 2, 4, 4], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "resnet_stem": ([2, 3, 9, 9], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "ceil_window_starts_in_end_padding": (
        [1, 2, 3, 3],
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "ceil_without_pads": ([1, 2, 3, 6], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "asymmetric_pads_1d": ([2, 3, 9], {"kernel_shape": [3], "strides": [2], "pads": [0, 2]}),
}


@pytest.mark.parametrize("case", sorted(_MAXPOOLS))
def test_maxpool_padded_input_equals_the_node(case: str) -> None:
    """A padded or ceil_mode MaxPool becomes -inf elements joined on with Concat and a MaxPool of whole windows (no
    pads, no ceil_mode) with the node's values and shape on the CPU EP, all-negative windows included."""
    shape, attrs = _MAXPOOLS[case]
    model, feeds = pool("MaxPool", shape, shift=-4.0, **attrs)
    after, changed, m = _apply(model, "maxpool_padded_input")
    assert changed and PASS_REGISTRY["maxpool_padded_input"]().find_defects(m.graph) == []
    (node,) = [n for n in onnx.load_from_string(after).graph.node if n.op_type == "MaxPool"]
    assert not any(_pool_attrs(node).get("pads", ())) and not _pool_attrs(node).get("ceil_mode")
    (ref,), (out,) = _run(model.SerializeToString(), feeds), _run(after, feeds)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ([1, 2, 8, 8], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ([1, 2, 8, 8], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "dilations": [2, 2]}),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}),
        ([1, 2, 7, 7], {"kernel_shape": [2, 2], "pads": [2, 2, 2, 2]}),
        (["batch", 2, 8, 8], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ],
    ids=["unpadded", "dilated", "auto_pad", "pad_of_the_kernel", "dynamic_batch"],
)
def test_maxpool_padded_input_leaves_other_pools(shape: list[object], attrs: dict[str, object]) -> None:
    """A MaxPool without pads or ceil_mode, or one the pass does not handle (dilation, auto_pad, a pad of the
    kernel, no static shape), is left as it is."""
    model = pool("MaxPool", [1, 2, 8, 8], **attrs)[0]
    model.graph.input[0].CopyFrom(onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
    assert not _apply(model, "maxpool_padded_input")[1]


def test_avgpool_whole_windows_leaves_a_declared_shape_it_does_not_compute() -> None:
    """ONNX's shape inference keeps a ceil window that would start in the end padding (a [1, 2, 3, 3] output where
    ONNX Runtime computes [1, 2, 2, 2]): with that shape declared, the pass leaves the node to qnnx-opcheck."""
    shape, attrs = _POOL_DEFECTS["ceil_window_starts_in_end_padding"]
    node = onnx.helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    model = make_model([node], [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], {})
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 2, 3, 3]
    assert not _apply(model, "avgpool_whole_windows")[1]


def test_avgpool_whole_windows_fp16() -> None:
    """In fp16 the zeros and the factor are fp16 (one rounding of kernel / divisor), the values the node's."""
    shape, attrs = _POOL_DEFECTS["efficientnet_ceil_exclude_pad"]
    model, feeds = avgpool(shape, TensorProto.FLOAT16, **attrs)
    after, changed, _ = _apply(model, "avgpool_whole_windows")
    assert changed
    graph = onnx.load_from_string(after).graph
    assert {init.data_type for init in graph.initializer} == {TensorProto.FLOAT16}
    _assert_pool_equal(model.SerializeToString(), after, feeds, rtol=2e-3)


@pytest.mark.parametrize("case", ["efficientnet_ceil_include_pad", "efficientnet_ceil_exclude_pad"])
def test_avgpool_whole_windows_survive_onnxruntime_optimizer(case: str, tmp_path: Path) -> None:
    """ONNX Runtime's optimizer (which runs before the QNN EP takes its nodes) keeps the pool's windows whole: it
    folds a Pad into a following AveragePool as pads with count_include_pad=1, one of the defects, but not a
    Concat."""
    import onnxruntime as ort

    shape, attrs = _POOL_DEFECTS[case]
    after, _, _ = _apply(avgpool(shape, **attrs)[0], "avgpool_whole_windows")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(after, so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(so.optimized_model_filepath)
    assert "AveragePool" in [n.op_type for n in optimized.graph.node]
    _assert_whole_windows(optimized.SerializeToString())


@given(window=pool_windows(), ceil=st.booleans(), count_pad=st.booleans(), seed=seeds(999))
def test_avgpool_whole_windows_property(
    window: tuple[list[int], dict[str, list[int]]], ceil: bool, count_pad: bool, seed: int
) -> None:
    """Over random shapes, kernels, strides, pads, ceil_mode and count_include_pad: the pass rewrites exactly the
    pools HTP gets wrong, the result has the node's values on the CPU EP, and every pool it writes pools whole
    windows."""
    shape, attrs = window
    model, feeds = avgpool(shape, seed=seed, **attrs, ceil_mode=int(ceil), count_include_pad=int(count_pad))
    after, changed, _ = _apply(model, "avgpool_whole_windows")
    assert changed == htp_averages_wrongly(
        tuple(shape), attrs["kernel_shape"], attrs["strides"], attrs["pads"], ceil=ceil, count_pad=count_pad
    )
    if changed:
        _assert_whole_windows(after)
    _assert_pool_equal(model.SerializeToString(), after, feeds)


# XLNet's and Funnel's relative attention, a plain batched matmul, a transposed one, a contraction over two letters,
# a letter summed in one operand only, an outer product.
_EINSUMS = {
    "bind,bjnd->bnij": [(2, 5, 3, 4), (2, 6, 3, 4)],
    "binh,tnh->bnit": [(2, 5, 3, 4), (7, 3, 4)],
    "bnij,bjnd->bind": [(2, 3, 5, 6), (2, 6, 3, 4)],
    "bij,bjk->bik": [(3, 4, 5), (3, 5, 2)],
    "bhqd,bhkd->bhqk": [(1, 2, 4, 8), (1, 2, 6, 8)],
    "abcd,cdf->abf": [(2, 3, 4, 5), (4, 5, 6)],
    "ij,jk->k": [(3, 4), (4, 5)],
    "i,j->ij": [(3,), (4,)],
}


@pytest.mark.parametrize("equation", sorted(_EINSUMS))
def test_einsum_as_matmul_keeps_results(equation: str) -> None:
    """Each equation becomes MatMul, Transpose, Reshape (and ReduceSum) with the Einsum's results on the CPU EP."""
    model, feeds = einsum(equation, _EINSUMS[equation])
    after, changed, _ = _apply(model, "einsum_as_matmul")
    assert changed and "Einsum" not in _ops(after) and "MatMul" in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("ii,ij->j", [(3, 3), (3, 4)]), ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)])],
)
def test_einsum_as_matmul_leaves_what_it_does_not_take(equation: str, shapes: list[tuple[int, ...]]) -> None:
    """A diagonal, an ellipsis and an implicit output are left to the Einsum node."""
    model, _ = einsum(equation, shapes)
    _, changed, _ = _apply(model, "einsum_as_matmul")
    assert not changed


@st.composite
def _einsum_cases(draw: st.DrawFn) -> tuple[str, list[tuple[int, ...]]]:
    letters = draw(st.permutations("abcdefg"))[: draw(st.integers(2, 7))]
    sizes = {c: draw(st.integers(1, 4)) for c in letters}
    a = draw(st.lists(st.sampled_from(letters), min_size=1, max_size=4, unique=True))
    b = draw(st.lists(st.sampled_from(letters), min_size=1, max_size=4, unique=True))
    present = sorted(set(a) | set(b))
    out = draw(st.permutations(present))[: draw(st.integers(0, len(present)))]
    equation = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
    return equation, [tuple(sizes[c] for c in a), tuple(sizes[c] for c in b)]


@given(case=_einsum_cases(), seed=seeds(999))
def test_einsum_as_matmul_property(case: tuple[str, list[tuple[int, ...]]], seed: int) -> None:
    """Any two-operand equation over random letters (batch, free, contracted, summed-alone; any output order, a
    scalar output too) is rewritten without an Einsum and computes the Einsum's values on the CPU EP."""
    equation, shapes = case
    model, feeds = einsum(equation, shapes, seed)
    after, changed, _ = _apply(model, "einsum_as_matmul")
    assert changed and "Einsum" not in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@given(
    side=st.integers(2, 6),
    k=st.integers(1, 12),
    head_dim=st.integers(2, 6),
    bias=st.booleans(),
    trans_b=st.booleans(),
    unflatten=st.booleans(),
    seed=seeds(999),
)
def test_linear_heads_as_matmul_keeps_results(
    side: int, k: int, head_dim: int, bias: bool, trans_b: bool, unflatten: bool, seed: int
) -> None:
    """A flattened projection of x[A, A, K] split into [A, A, A, D] becomes a MatMul (+ Add) at the input's rank,
    with no Gemm left and the same result to float rounding."""
    model, feeds = projection_into_heads(
        [side, side], k, side, head_dim, bias=bias, trans_b=trans_b, unflatten=unflatten, seed=seed
    )
    after, changed, _ = _apply(model, "linear_heads_as_matmul")
    assert changed and "Gemm" not in _ops(after)
    assert _ops(after)[:2] == (["MatMul", "Add"] if bias else ["MatMul", "Reshape"])
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@pytest.mark.parametrize(
    ("lead", "heads", "head_dim"),
    [([4, 4], 8, 4), ([4, 4], 3, 8), ([2, 4], 4, 6), ([4, 8], 4, 6), ([1, 16], 4, 6), ([4, 4], 4, 1), ([6], 2, 4)],
)
@pytest.mark.parametrize("unflatten", [True, False])
def test_linear_heads_as_matmul_leaves_the_shapes_qnn_builds(
    lead: list[int], heads: int, head_dim: int, unflatten: bool
) -> None:
    """Projections QNN builds as they are (other head counts, unequal leading dims, one channel per head, a rank-2
    input) are left alone."""
    model, _ = projection_into_heads(lead, 8, heads, head_dim, bias=True, trans_b=True, unflatten=unflatten, seed=0)
    _after, changed, _ = _apply(model, "linear_heads_as_matmul")
    assert not changed


@given(a=st.integers(2, 6), d=st.integers(1, 6), n=st.integers(1, 9), lead_one=st.booleans(), seed=seeds(999))
def test_flatten_merged_heads_matmul_keeps_results(a: int, d: int, n: int, lead_one: bool, seed: int) -> None:
    """MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W), with a leading 1 or not, becomes a MatMul of the rank-2
    view [A*A, A*D] reshaped back, with the same values to float rounding."""
    merged = (1,) * lead_one + (a, a, a * d)
    model, feeds = merged_heads_matmul((a, a, a, d), merged, n, seed)
    after, changed, _ = _apply(model, "flatten_merged_heads_matmul")
    assert changed
    mm = [node for node in onnx.load_from_string(after).graph.node if node.op_type == "MatMul"]
    assert len(mm) == 1
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@pytest.mark.parametrize(
    ("source", "merged"),
    [((4, 4, 5, 6), (4, 4, 30)), ((2, 4, 4, 6), (2, 4, 24)), ((4, 4, 4, 6), (4, 16, 6)), ((4, 4, 4, 6), (16, 24))],
)
def test_flatten_merged_heads_matmul_leaves_other_merges(source: tuple[int, ...], merged: tuple[int, ...]) -> None:
    """Merges QNN computes right (unequal leading dims, another split, the rank-2 view already) are left alone."""
    model, _ = merged_heads_matmul(source, merged)
    _, changed, _ = _apply(model, "flatten_merged_heads_matmul")
    assert not changed


def _cast_to_bool(shape: list[int], dtype: int, then: str | None) -> onnx.ModelProto:
    """x (int32/int64) cast to bool, returned as is or through Not / a Cast to float."""
    from onnx import helper as h

    nodes = [h.make_node("Cast", ["x"], ["b" if then else "y"], to=TensorProto.BOOL)]
    out_type = TensorProto.BOOL
    if then == "Not":
        nodes.append(h.make_node("Not", ["b"], ["y"]))
    elif then == "float":
        nodes.append(h.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT))
        out_type = TensorProto.FLOAT
    return make_model(nodes, [("x", dtype, shape)], [("y", out_type, shape)], {})


@given(
    shape=shapes(max_rank=4),
    dtype=st.sampled_from([TensorProto.INT32, TensorProto.INT64]),
    then=st.sampled_from([None, "Not", "float"]),
    seed=seeds(),
)
def test_int_cast_to_bool_keeps_results(shape: list[int], dtype: int, then: str | None, seed: int) -> None:
    """A Cast of int32/int64 to bool becomes Not(Equal(x, 0)), with the same values (negative, zero, positive and the
    extremes) and the same output dtype, whatever consumes it."""
    model = _cast_to_bool(shape, dtype, then)
    after, changed, _ = _apply(model, "int_cast_to_bool")
    assert changed and "Equal" in _ops(after) and _ops(after).count("Cast") == (1 if then == "float" else 0)
    np_dtype = np.int32 if dtype == TensorProto.INT32 else np.int64
    info = np.iinfo(np_dtype)
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([0, 1, -1, 255, -256, info.min, info.max], np_dtype), size=shape)
    _assert_same(model.SerializeToString(), after, {"x": x})


@pytest.mark.parametrize(
    ("dtype", "to"),
    [
        (TensorProto.UINT8, TensorProto.BOOL),
        (TensorProto.FLOAT, TensorProto.BOOL),
        (TensorProto.INT32, TensorProto.FLOAT),
    ],
)
def test_int_cast_to_bool_leaves_other_casts_alone(dtype: int, to: int) -> None:
    """uint8 -> bool (right on HTP), float -> bool (float_cast_to_bool's) and int -> float are not rewritten."""
    from onnx import helper as h

    model = make_model([h.make_node("Cast", ["x"], ["y"], to=to)], [("x", dtype, [3])], [("y", to, [3])], {})
    _, changed, _ = _apply(model, "int_cast_to_bool")
    assert not changed


@given(
    shape=shapes(max_rank=4),
    dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]),
    then=st.sampled_from([None, "Not", "float"]),
    seed=seeds(),
)
def test_float_cast_to_bool_keeps_results(shape: list[int], dtype: int, then: str | None, seed: int) -> None:
    """A Cast of float32/float16 to bool becomes Not(Equal(x, 0)), with the same values (zero, -0, tiny, large,
    infinite and NaN elements) and the same output dtype, whatever consumes it; an integer Cast is left to
    int_cast_to_bool."""
    model = _cast_to_bool(shape, dtype, then)
    after, changed, _ = _apply(model, "float_cast_to_bool")
    assert changed and "Equal" in _ops(after) and _ops(after).count("Cast") == (1 if then == "float" else 0)
    np_dtype = np.float32 if dtype == TensorProto.FLOAT else np.float16
    values = np.array([0.0, -0.0, 1e-7, -2.5, 60000.0, np.inf, -np.inf, np.nan], np_dtype)
    x = np.random.default_rng(seed).choice(values, size=shape)
    _assert_same(model.SerializeToString(), after, {"x": x})
    _, integer_changed, _ = _apply(_cast_to_bool(shape, TensorProto.INT32, then), "float_cast_to_bool")
    assert not integer_changed


@given(shape=shapes(max_rank=4), dtype=st.sampled_from([TensorProto.BOOL, TensorProto.UINT8]), seed=seeds())
def test_bool_cast_to_int64_keeps_results(shape: list[int], dtype: int, seed: int) -> None:
    """A Cast of bool or uint8 to int64 becomes Casts to int32 and to int64, with the same values and dtype; a Cast
    to int64 from float (which HTP would round through int32), to int32, or at rank 5 (where HTP's int32 -> int64
    Cast crashes) is left alone."""
    from onnx import helper as h

    model = make_model(
        [h.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)],
        [("x", dtype, shape)],
        [("y", TensorProto.INT64, shape)],
        {},
    )
    after, changed, _ = _apply(model, "bool_cast_to_int64")
    assert changed and _ops(after) == ["Cast", "Cast"]
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.random(shape) < 0.5 if dtype == TensorProto.BOOL else rng.integers(0, 256, shape), np.uint8)
    x = x.astype(bool) if dtype == TensorProto.BOOL else x
    _assert_same(model.SerializeToString(), after, {"x": x})
    for source, to, dims in (
        (TensorProto.FLOAT, TensorProto.INT64, [3]),
        (TensorProto.BOOL, TensorProto.INT32, [3]),
        (TensorProto.BOOL, TensorProto.INT64, [1, 2, 1, 2, 3]),
    ):
        other = make_model([h.make_node("Cast", ["x"], ["y"], to=to)], [("x", source, dims)], [("y", to, dims)], {})
        assert not _apply(other, "bool_cast_to_int64")[1]


@given(shape=shapes(max_rank=5), scale=st.sampled_from([1e-4, 0.5, 2.0, 50.0]), seed=seeds())
def test_erf_as_polynomial_keeps_results(shape: list[int], scale: float, seed: int) -> None:
    """A standalone Erf is written out in ops QNN has, within 1e-6 of erf on the CPU EP (the series and the
    Abramowitz & Stegun form are within 4.2e-7 of it), infinities included; an Erf inside GELU is left to
    fuse_erf_gelu."""
    from onnx import helper as h

    model = make_model(
        [h.make_node("Erf", ["x"], ["y"])], [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, shape)], {}
    )
    after, changed, _ = _apply(model, "erf_as_polynomial")
    assert changed and "Erf" not in _ops(after)
    x = np.asarray(scale * np.random.default_rng(seed).standard_normal(shape), np.float32)
    x.reshape(-1)[0] = np.inf
    (want,) = _run(model.SerializeToString(), {"x": x})
    (got,) = _run(after, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_erf_as_polynomial_leaves_gelu_to_its_fusion() -> None:
    """In the default pipeline an Erf inside GELU's pattern is computed as GELU: fuse_erf_gelu makes it one Gelu,
    which gelu_written_out writes out (erf_as_polynomial is not what removes its Erf), with the same values."""
    model, feeds = erf_gelu([2, 8], "half_x_first")
    m = to_ir(model)
    report = dict(run_passes(m, DEFAULT_PASSES))
    assert report["fuse_erf_gelu"] and report["gelu_written_out"] and not report["erf_as_polynomial"]
    ops = [n.op_type for n in m.graph]
    assert "Gelu" not in ops and "Erf" not in ops
    for got, want in zip(_run(to_bytes(m), feeds), _run(model.SerializeToString(), feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@given(
    shape=shapes(max_rank=5),
    op=st.sampled_from(["Sinh", "Cosh"]),
    scale=st.sampled_from([1e-4, 0.4, 2.0, 10.0]),
    seed=seeds(),
)
def test_sinh_cosh_from_exp_keeps_results(shape: list[int], op: str, scale: float, seed: int) -> None:
    """Sinh and Cosh are written with Exp (and sinh's series near 0), within 1e-6 of the op's value relative to it
    on the CPU EP at every rank 0-5, tiny inputs included."""
    from onnx import helper as h

    model = make_model(
        [h.make_node(op, ["x"], ["y"])], [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, shape)], {}
    )
    after, changed, _ = _apply(model, "sinh_cosh_from_exp")
    assert changed and op not in _ops(after)
    x = np.asarray(scale * np.random.default_rng(seed).standard_normal(shape), np.float32)
    (want,) = _run(model.SerializeToString(), {"x": x})
    (got,) = _run(after, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


@st.composite
def _conv_transposes(draw: st.DrawFn) -> dict[str, object]:
    """A ConvTranspose of rank 1-3 with at least one dilation above 1, its strides, pads and groups."""
    rank = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank).filter(lambda d: max(d) > 1))
    span = [(k - 1) * d for k, d in zip(kernel, dilations, strict=True)]
    begin = [draw(st.integers(0, s)) for s in span]
    end = [draw(st.integers(0, s - b)) for s, b in zip(span, begin, strict=True)]
    return {
        "spatial": draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)),
        "kernel": kernel,
        "strides": draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)),
        "pads": begin + end,
        "dilations": dilations,
        "groups": draw(st.integers(1, 2)),
        "weight_input": draw(st.booleans()),
    }


@given(case=_conv_transposes(), seed=seeds())
def test_convtranspose_dilated_kernel_keeps_results(case: dict[str, object], seed: int) -> None:
    """A ConvTranspose with a dilation above 1 becomes one at dilation 1 of the dilated kernel (at export for a
    constant weight, in the graph for a weight computed at run time), and computes the same output on the CPU EP at
    ranks 1-3, with strides, asymmetric pads and groups."""
    model, feeds = conv_transpose(**case, seed=seed)  # type: ignore[arg-type]  # the strategy's dict holds each argument's type
    after, changed, _ = _apply(model, "convtranspose_dilated_kernel")
    assert changed
    (node,) = [n for n in onnx.load_from_string(after).graph.node if n.op_type == "ConvTranspose"]
    assert all(a.ints == [1] * len(a.ints) for a in node.attribute if a.name == "dilations")
    _assert_same(model.SerializeToString(), after, feeds, exact=False)


@given(
    rank=st.integers(1, 3),
    data=st.data(),
    bias=st.booleans(),
    groups=st.integers(1, 2),
    weight_input=st.booleans(),
    seed=seeds(),
)
def test_convtranspose_normal_form_keeps_results(
    rank: int, data: st.DataObject, bias: bool, groups: int, weight_input: bool, seed: int
) -> None:
    """A ConvTranspose QNN HTP gets wrong (3-D with the first two spatial axes padded differently, the last two
    strided differently, or groups; output_padding) becomes one without pads, output_padding or bias, at stride 1 on
    the axes it spreads, one per group, and the exact steps after it; it computes the same output on the CPU EP, with
    a constant weight or one given at run time."""
    ints = st.lists(st.integers(1, 3), min_size=rank, max_size=rank)
    spatial = data.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    kernel, strides = data.draw(ints), data.draw(ints)
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
    op = [data.draw(st.integers(0, s - 1)) for s in strides]
    sizes = [
        (n - 1) * s + k + o - pads[a] - pads[rank + a]
        for a, (n, s, k, o) in enumerate(zip(spatial, strides, kernel, op))
    ]
    model, feeds = conv_transpose(spatial, kernel, strides, pads, [1] * rank, groups, weight_input, seed, op)
    if not bias:
        model.graph.node[0].input.pop()
    after, changed, _ = _apply(model, "convtranspose_normal_form")
    three_d = rank == 3 and ((pads[0], pads[3]) != (pads[1], pads[4]) or strides[1] != strides[2] or groups > 1)
    assert changed == (any(op) or three_d)
    if changed and min(sizes) >= 1:
        _assert_same(model.SerializeToString(), after, feeds, exact=False)


_OUT5 = (2, 3, 4, 2, 3)


def _rank5_operand() -> st.SearchStrategy[tuple[int, ...]]:
    """A shape that broadcasts to ``_OUT5``: the output's, a rank-5 broadcast, a lower-rank one or a scalar."""
    rank5 = st.tuples(*(st.sampled_from([1, d]) for d in _OUT5))
    lower = st.integers(1, 4).flatmap(lambda r: st.tuples(*(st.sampled_from([1, d]) for d in _OUT5[-r:])))
    return st.one_of(st.just(_OUT5), rank5, lower, st.just(()))


@given(op=st.sampled_from(["Where", "Pow"]), a=_rank5_operand(), b=_rank5_operand(), c=_rank5_operand(), seed=seeds())
def test_rank5_broadcast_expanded_keeps_results(
    op: str, a: tuple[int, ...], b: tuple[int, ...], c: tuple[int, ...], seed: int
) -> None:
    """A rank-5 Where or Pow keeps no rank-5 input that broadcasts (a Where's loses its leading 1s, else it is
    expanded; a bool condition whose first axis is not 1 stays) and computes the same output on the CPU EP."""
    from onnx import helper as h

    rng = np.random.default_rng(seed)
    b = _OUT5 if len(np.broadcast_shapes(a, b, c)) != 5 or np.broadcast_shapes(a, b, c) != _OUT5 else b
    feeds = {"a": np.asarray(rng.random(a) + 0.5, np.float32), "b": np.asarray(rng.standard_normal(b), np.float32)}
    inputs = [("a", TensorProto.FLOAT, a), ("b", TensorProto.FLOAT, b)]
    names = ["a", "b"]
    if op == "Where":
        feeds["c"] = np.asarray(rng.random(c) < 0.5)
        inputs.append(("c", TensorProto.BOOL, c))
        names = ["c", "a", "b"]
    model = make_model([h.make_node(op, names, ["y"])], inputs, [("y", TensorProto.FLOAT, _OUT5)], {})
    after, _, m = _apply(model, "rank5_broadcast_expanded")
    (node,) = [n for n in m.graph if n.op_type == op]
    for value in node.inputs:
        shape = tuple(value.shape or ())
        assert len(shape) != 5 or shape == _OUT5 or (value.dtype == 9 and shape[0] != 1)  # 9: BOOL
    _assert_same(model.SerializeToString(), after, feeds)


@given(
    data_shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    data=st.data(),
    runtime=st.booleans(),
    seed=seeds(),
)
def test_gather_into_rank5_by_flat_indices_keeps_results(
    data_shape: list[int], data: st.DataObject, runtime: bool, seed: int
) -> None:
    """A Gather by indices of rank >= 2 into a rank-5 output (constant indices, negative ones too, or indices given
    at run time) becomes a Gather by the flattened indices and a Reshape, with the same output on the CPU EP."""
    from onnx import helper as h

    index_rank = 6 - len(data_shape)
    axis = data.draw(st.integers(-len(data_shape), len(data_shape) - 1))
    size = data_shape[axis]
    index_shape = data.draw(st.lists(st.integers(1, 3), min_size=index_rank, max_size=index_rank))
    rng = np.random.default_rng(seed)
    indices = rng.integers(-size, size, index_shape).astype(np.int64)
    x = rng.standard_normal(data_shape).astype(np.float32)
    inputs, inits, feeds = [("x", TensorProto.FLOAT, data_shape)], {}, {"x": x}
    if runtime:
        inputs.append(("i", TensorProto.INT64, index_shape))
        feeds["i"] = indices
    else:
        inits["i"] = indices
    model = make_model(
        [h.make_node("Gather", ["x", "i"], ["y"], axis=axis)], inputs, [("y", TensorProto.FLOAT, None)], inits
    )
    after, changed, _ = _apply(model, "gather_of_vector_by_flat_indices")
    assert changed and _ops(after).count("Reshape") >= 1
    _assert_same(model.SerializeToString(), after, feeds)


@pytest.mark.parametrize("name", DEFAULT_PASSES)
def test_every_pass_takes_nodes_without_inputs(name: str) -> None:
    """A Constant node (no inputs) as a graph output and feeding an op, beside a float Pad of the last axis's end:
    each pass runs on it without raising, and the passes together keep the model's outputs on the CPU EP (a graph
    whose output is a constant, such as ``torch.sort`` of a 0-d tensor, failed export with an IndexError)."""
    nodes = [
        onnx.helper.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.array(2.0, np.float32))),
        onnx.helper.make_node("Constant", [], ["idx"], value=onnx.numpy_helper.from_array(np.array(0, np.int64))),
        onnx.helper.make_node("Mul", ["x", "k"], ["y"]),
        onnx.helper.make_node("Pad", ["y", "pads", "fill"], ["z"]),
    ]
    inits = {"pads": np.array([0, 0, 0, 2], np.int64), "fill": np.array(0.5, np.float32)}
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [2, 3])],
        [("z", TensorProto.FLOAT, [2, 5]), ("idx", TensorProto.INT64, [])],
        inits,
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = cpu_session(model.SerializeToString()).run(None, {"x": x})
    m = to_ir(model)
    run_passes(m, (name,))
    if name == DEFAULT_PASSES[-1]:
        run_passes(m, DEFAULT_PASSES)
    got = cpu_session(to_bytes(m)).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
