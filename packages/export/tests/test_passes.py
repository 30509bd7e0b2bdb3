"""Each QNN-safety pass: removes its pattern, keeps results (ORT CPU), and leaves other graphs alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx_builders import add_layernorm, erf_gelu, gathernd, rmsnorm, to_bytes, to_ir, unsqueeze_int64
from qnn_helpers import cpu_session

from qnnx_export._passes import DEFAULT_PASSES, PASS_REGISTRY, pass_table, run_passes


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


@given(
    batch=st.integers(2, 4),
    seq=st.integers(2, 6),
    hidden=st.sampled_from([4, 8, 16]),
    op=st.sampled_from(["Add", "Mul", "Sub", "Div"]),
    rank2=st.booleans(),
    dynamic=st.booleans(),
    seed=st.integers(0, 2**16),
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


@given(batch=st.integers(1, 3), seq=st.integers(1, 5), hidden=st.sampled_from([4, 16]), seed=st.integers(0, 999))
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
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    form=st.sampled_from(["half_x_first", "mul_half_last", "div_two_last", "mul_inv_sqrt2"]),
    seed=st.integers(0, 999),
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
    from onnx import helper as h
    from onnx_builders import make_model

    model = make_model(
        [h.make_node("Erf", ["x"], ["y"])], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], {}
    )
    assert not _apply(model, "fuse_erf_gelu")[1]


@st.composite
def _gathernd_case(draw: st.DrawFn) -> tuple[list[int], np.ndarray, int]:
    data_shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    m = draw(st.integers(1, len(data_shape)))
    batch = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    cols = [
        draw(st.lists(st.integers(-d, d - 1), min_size=int(np.prod(batch)), max_size=int(np.prod(batch))))
        for d in data_shape[:m]
    ]
    indices = np.stack([np.array(c, np.int64).reshape(batch) for c in cols], axis=-1)
    dtype = draw(st.sampled_from([TensorProto.BOOL, TensorProto.FLOAT, TensorProto.INT64]))
    return data_shape, indices, dtype


@given(case=_gathernd_case(), seed=st.integers(0, 999))
def test_gathernd_to_gather_exact(case: tuple[list[int], np.ndarray, int], seed: int) -> None:
    """GatherND with constant (also negative) indices becomes Reshape/Gather with identical results."""
    data_shape, indices, dtype = case
    model, feeds = gathernd(data_shape, indices, dtype, seed)
    after, changed, _ = _apply(model, "gathernd_to_gather")
    assert changed and "GatherND" not in _ops(after)
    _assert_same(model.SerializeToString(), after, feeds)


def test_gathernd_identity_becomes_reshape() -> None:
    """The HF padding-mask GatherND (every element in order) becomes Reshape only."""
    b, s = 2, 5
    idx = np.stack(np.meshgrid(np.arange(b), np.arange(s), indexing="ij"), axis=-1).reshape(b, 1, 1, s, 2)
    model, feeds = gathernd([b, s], idx)
    after, changed, _ = _apply(model, "gathernd_to_gather")
    assert changed and set(_ops(after)) == {"Reshape"}
    _assert_same(model.SerializeToString(), after, feeds)


@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    n_axes=st.integers(1, 2),
    negative=st.booleans(),
    seed=st.integers(0, 999),
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
    from onnx import helper as h
    from onnx_builders import make_model

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


def test_default_pipeline_is_noop_on_clean_graph() -> None:
    """On a graph with none of the patterns, no pass reports a change."""
    model, _ = rmsnorm(1, 2, 4, weight_first=False)
    m = to_ir(model)
    assert not any(changed for _, changed in run_passes(m, DEFAULT_PASSES))
