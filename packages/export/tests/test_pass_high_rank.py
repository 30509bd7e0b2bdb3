"""Rank-6+ tensors brought to rank <= 5 (QNN HTP's limit): any Transpose as rank-4 moves, reductions and splits on
merged axes, and a softmax taken before the Reshape that feeds it. Exact on the CPU EP over generated graphs (here)
and built and right on QNN over shape classes (the Hiera-like graphs at the end)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import cpu_session, qnn_error_in_child, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

from qnnx_export._passes import run_passes
from qnnx_testkit.strategies import seeds, shapes

_HIGH_RANK = (
    "compose_high_rank_transposes",
    "fold_high_rank_transpose",
    "decompose_high_rank_transpose",
    "high_rank_reduce_on_merged_axes",
    "high_rank_split_on_merged_axes",
    "reshape_of_high_rank_reshape",
)


def _rewritten(model: onnx.ModelProto, passes: tuple[str, ...]) -> tuple[bytes, dict[str, bool], int]:
    """The model after ``passes``: its bytes, which passes changed it, and the largest rank of any node's output."""
    m = to_ir(onnx.shape_inference.infer_shapes(model))
    report = dict(run_passes(m, passes))
    ranks = [len(v.shape) for n in m.graph for v in n.outputs if v.shape is not None]
    return to_bytes(m), report, max(ranks, default=0)


def _outputs(model: bytes | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return cpu_session(data).run(None, feeds)


def _chain(
    dims: list[int],
    middle: list[onnx.NodeProto],
    out: str,
    out_shape: tuple[int, ...],
    inits: dict[str, np.ndarray] | None = None,
    out_type: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """x[total / last, last] -> Reshape to ``dims`` (rank 6+) -> ``middle`` (reading "r") -> ``out``, flattened."""
    total = int(np.prod(dims))
    nodes = [h.make_node("Reshape", ["x", "s6"], ["r"]), *middle, h.make_node("Reshape", [out, "s2"], ["y"])]
    consts = {"s6": np.array(dims, np.int64), "s2": np.array(out_shape, np.int64), **(inits or {})}
    return make_model(
        nodes, [("x", TensorProto.FLOAT, (total // dims[-1], dims[-1]))], [("y", out_type, out_shape)], consts
    )


@settings(max_examples=40, deadline=None)
@given(dims=shapes(min_rank=6, max_rank=7, max_side=3), perm=st.data())
def test_any_high_rank_transpose_comes_to_rank_5_exactly(dims: list[int], perm: st.DataObject) -> None:
    """Reshape -> rank-6+ Transpose (any permutation) -> Reshape: after the passes no tensor has rank > 5 and the
    output is the same, element for element."""
    order = list(perm.draw(st.permutations(range(len(dims)))))
    total = int(np.prod(dims))
    model = _chain(dims, [h.make_node("Transpose", ["r"], ["t"], perm=order)], "t", (total,))
    x = np.arange(total, dtype=np.float32).reshape(total // dims[-1], dims[-1])
    after, _, rank = _rewritten(model, _HIGH_RANK)
    assert rank <= 5
    np.testing.assert_array_equal(_outputs(model, {"x": x})[0], _outputs(after, {"x": x})[0])


@settings(max_examples=40, deadline=None)
@given(
    dims=shapes(min_rank=6, max_rank=7, max_side=3),
    op=st.sampled_from(["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ArgMax", "ArgMin"]),
    keep=st.booleans(),
    data=st.data(),
    seed=seeds(),
)
def test_a_high_rank_reduction_on_merged_axes_is_the_same(
    dims: list[int], op: str, keep: bool, data: st.DataObject, seed: int
) -> None:
    """A reduction over some axes of a rank-6+ tensor (one axis for ArgMax/ArgMin) gives the same values when it is
    taken on the merged view; when the reduced axes form at most two runs it has rank <= 5."""
    rank = len(dims)
    if op.startswith("Arg"):
        axes = [data.draw(st.integers(0, rank - 1))]
        node = h.make_node(op, ["r"], ["t"], axis=axes[0], keepdims=int(keep))
        inits: dict[str, np.ndarray] = {}
    else:
        axes = sorted(data.draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
        node = h.make_node(op, ["r", "axes"], ["t"], keepdims=int(keep))
        inits = {"axes": np.array(axes, np.int64)}
    reduced = [1 if a in axes else d for a, d in enumerate(dims)]
    out = int(np.prod(reduced))
    out_type = TensorProto.INT64 if op.startswith("Arg") else TensorProto.FLOAT
    model = _chain(dims, [node], "t", (out,), inits, out_type)
    total = int(np.prod(dims))
    x = np.random.default_rng(seed).standard_normal((total // dims[-1], dims[-1])).astype(np.float32)
    after, report, _ = _rewritten(model, ("high_rank_reduce_on_merged_axes", "reshape_of_high_rank_reshape"))
    want, got = _outputs(model, {"x": x})[0], _outputs(after, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    wide = [a for a in axes if dims[a] > 1]
    runs = sum(1 for a in wide if a - 1 not in axes)
    if wide and runs <= 1 and len(wide) == len(axes):
        assert report["high_rank_reduce_on_merged_axes"]  # one run of reduced axes: rank 3 at most


@settings(max_examples=30, deadline=None)
@given(dims=shapes(min_rank=6, max_rank=7, max_side=4), data=st.data())
def test_a_high_rank_split_on_merged_axes_is_the_same(dims: list[int], data: st.DataObject) -> None:
    """Splitting a rank-6+ tensor along any axis into any sizes gives the same parts on the merged view."""
    axis = data.draw(st.integers(0, len(dims) - 1))
    cut = data.draw(st.integers(0, dims[axis]))
    sizes = [cut, dims[axis] - cut] if 0 < cut < dims[axis] else [dims[axis]]
    outs = [f"p{k}" for k in range(len(sizes))]
    total = int(np.prod(dims))
    nodes = [
        h.make_node("Reshape", ["x", "s6"], ["r"]),
        h.make_node("Split", ["r", "sizes"], outs, axis=axis),
        *[h.make_node("Reshape", [o, "flat"], [f"y{k}"]) for k, o in enumerate(outs)],
    ]
    inits = {"s6": np.array(dims, np.int64), "sizes": np.array(sizes, np.int64), "flat": np.array([-1], np.int64)}
    part = [total // dims[axis] * s for s in sizes]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, (total // dims[-1], dims[-1]))],
        [(f"y{k}", TensorProto.FLOAT, (n,)) for k, n in enumerate(part)],
        inits,
    )
    x = np.arange(total, dtype=np.float32).reshape(total // dims[-1], dims[-1])
    after, report, rank = _rewritten(model, ("high_rank_split_on_merged_axes", "reshape_of_high_rank_reshape"))
    assert report["high_rank_split_on_merged_axes"] and rank <= 5
    for got, want in zip(_outputs(after, {"x": x}), _outputs(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=30, deadline=None)
@given(lead=shapes(min_rank=3, max_rank=3, max_side=3), side=st.integers(2, 5), seed=seeds())
def test_a_softmax_of_a_products_rank_5_view_is_taken_first(lead: list[int], side: int, seed: int) -> None:
    """MatMul ``[B, N, N]`` -> Reshape to ``[*lead, N, N]`` (rank 5, the refused form) -> Softmax over the last axis
    equals MatMul -> Softmax -> Reshape; a view that does not have that form is left as it is."""
    batch = int(np.prod(lead))
    nodes = [
        h.make_node("MatMul", ["a", "b"], ["p"]),
        h.make_node("Reshape", ["p", "v"], ["r"]),
        h.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    model = make_model(
        nodes,
        [("a", TensorProto.FLOAT, (batch, side, 3)), ("b", TensorProto.FLOAT, (batch, 3, side))],
        [("y", TensorProto.FLOAT, (*lead, side, side))],
        {"v": np.array([*lead, side, side], np.int64)},
    )
    rng = np.random.default_rng(seed)
    feeds = {
        "a": rng.standard_normal((batch, side, 3)).astype(np.float32),
        "b": rng.standard_normal((batch, 3, side)).astype(np.float32),
    }
    after, report, _ = _rewritten(model, ("softmax_before_reshape",))
    assert report["softmax_before_reshape"]
    assert [n.op_type for n in onnx.load_from_string(after).graph.node] == ["MatMul", "Softmax", "Reshape"]
    np.testing.assert_allclose(_outputs(after, feeds)[0], _outputs(model, feeds)[0], rtol=1e-6, atol=1e-7)
    flat = model.graph.initializer[0]
    flat.CopyFrom(onnx.numpy_helper.from_array(np.array([batch, side, side], np.int64), "v"))
    model.graph.output[0].type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    assert not _rewritten(model, ("softmax_before_reshape",))[1]["softmax_before_reshape"]  # rank 3: left


# --- on QNN: Hiera-like shape classes -----------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "side", "unit", "channels"), [(1, 14, 2, 32), (4, 7, 2, 16), (1, 8, 4, 8)])
def test_a_mask_unit_unroll_builds_and_is_right_on_qnn(batch: int, side: int, unit: int, channels: int) -> None:
    """Hiera's unroll, ``[B, s*u, s*u, C] -> [B, s, u, s, u, C] -> (0, 2, 4, 1, 3, 5) -> [B*u*u, s, s, C]``, then a
    max over the units: every tensor of rank <= 5 after the passes, built on QNN (CPU fallback off), eager's
    values."""
    n = side * unit
    dims = [batch, side, unit, side, unit, channels]
    nodes = [
        h.make_node("Reshape", ["x", "s6"], ["r"]),
        h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 4, 1, 3, 5]),
        h.make_node("Reshape", ["t", "s4"], ["u"]),
        h.make_node("Reshape", ["u", "s6b"], ["v"]),
        h.make_node("ReduceMax", ["v", "axes"], ["y"], keepdims=0),
    ]
    units = [batch, unit * unit, side, side, channels]
    inits = {
        "s6": np.array(dims, np.int64),
        "s4": np.array([batch * unit * unit, side, side, channels], np.int64),
        "s6b": np.array([batch, unit, unit, side, side, channels], np.int64),
        "axes": np.array([1, 2], np.int64),
    }
    del units
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, (batch, n, n, channels))],
        [("y", TensorProto.FLOAT, (batch, side, side, channels))],
        inits,
    )
    x = np.random.default_rng(0).standard_normal((batch, n, n, channels)).astype(np.float32)
    after, _, rank = _rewritten(model, _HIGH_RANK)
    assert rank <= 5
    want = _outputs(model, {"x": x})[0]
    got = qnn_session(after).run(None, {"x": x})[0]
    assert float(np.abs(got - want).max()) <= 2e-3 * float(np.abs(want).max())


@pytest.mark.parametrize(("units", "tokens", "head_dim"), [(49, 64, 32), (16, 16, 8)])
def test_attention_normalized_on_a_rank_5_view_builds_and_is_right_on_qnn(
    units: int, tokens: int, head_dim: int
) -> None:
    """Scores ``q @ k^T`` at rank 3 viewed as ``[1, 1, units, tokens, tokens]`` for the softmax and back (Hiera's
    mask-unit attention): with the softmax taken first, no Reshape to rank 5 reads the product, and QNN (CPU fallback
    off) builds it and gives eager's values."""
    nodes = [
        h.make_node("MatMul", ["q", "k"], ["s"]),
        h.make_node("Reshape", ["s", "v5"], ["s5"]),
        h.make_node("Softmax", ["s5"], ["p5"], axis=-1),
        h.make_node("Reshape", ["p5", "v3"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("q", TensorProto.FLOAT, (units, tokens, head_dim)), ("k", TensorProto.FLOAT, (units, head_dim, tokens))],
        [("y", TensorProto.FLOAT, (units, tokens, tokens))],
        {"v5": np.array([1, 1, units, tokens, tokens], np.int64), "v3": np.array([units, tokens, tokens], np.int64)},
    )
    rng = np.random.default_rng(1)
    feeds = {
        "q": (rng.standard_normal((units, tokens, head_dim)) / np.sqrt(head_dim)).astype(np.float32),
        "k": rng.standard_normal((units, head_dim, tokens)).astype(np.float32),
    }
    after, report, _ = _rewritten(model, ("softmax_before_reshape",))
    assert report["softmax_before_reshape"]
    want = _outputs(model, feeds)[0]
    got = qnn_session(after).run(None, feeds)[0]
    assert float(np.abs(got - want).max()) <= 5e-3


def _product_view(lead: list[int], side: int, perm: list[int]) -> onnx.ModelProto:
    """``MatMul(a[B, side, k], b[B, k, side])`` viewed as ``[*lead, side, side]`` (rank 5), transposed by ``perm``
    and flattened: the refused Reshape to rank 5 of a product whose last axis is the view's second to last."""
    batch, k = int(np.prod(lead)), 3
    nodes = [
        h.make_node("MatMul", ["a", "b"], ["p"]),
        h.make_node("Reshape", ["p", "v5"], ["r"]),
        h.make_node("Transpose", ["r"], ["t"], perm=perm),
        h.make_node("Reshape", ["t", "flat"], ["y"]),
    ]
    return make_model(
        nodes,
        [("a", TensorProto.FLOAT, (batch, side, k)), ("b", TensorProto.FLOAT, (batch, k, side))],
        [("y", TensorProto.FLOAT, (batch * side * side,))],
        {"v5": np.array([*lead, side, side], np.int64), "flat": np.array([-1], np.int64)},
    )


@settings(max_examples=30, deadline=None)
@given(lead=shapes(min_rank=3, max_rank=3, max_side=3), side=st.integers(2, 4), data=st.data(), seed=seeds())
def test_a_product_viewed_at_rank_5_and_transposed_comes_to_rank_4_exactly(
    lead: list[int], side: int, data: st.DataObject, seed: int
) -> None:
    """The product's rank-5 view and its Transpose are rewritten at rank 4 whenever merging kept-together axes and
    dropping unit axes allows it; the output is the same, element for element, and no rank-5 view of the product
    is left."""
    perm = list(data.draw(st.permutations(range(5))))
    model = _product_view(lead, side, perm)
    rng = np.random.default_rng(seed)
    batch = int(np.prod(lead))
    feeds = {
        "a": rng.standard_normal((batch, side, 3)).astype(np.float32),
        "b": rng.standard_normal((batch, 3, side)).astype(np.float32),
    }
    after, report, _ = _rewritten(model, ("product_view_transposed_at_rank4",))
    np.testing.assert_array_equal(_outputs(after, feeds)[0], _outputs(model, feeds)[0])
    if report["product_view_transposed_at_rank4"]:
        views = [n for n in onnx.load_from_string(after).graph.node if n.op_type == "Transpose"]
        assert all(len(n.attribute[0].ints) <= 4 for n in views)


def test_hieras_head_move_of_an_attention_product_runs_on_qnn() -> None:
    """``probs @ v`` ``[8, 16, 16]`` viewed as ``[1, 2, 4, 16, 16]``, permuted ``(0, 3, 2, 1, 4)`` and flattened to
    ``[1, 64, 32]`` (Hiera's mask-unit attention output): after the rewrite it runs on QNN, in a child process in
    case it stops one, with eager's values."""
    model = _product_view([1, 2, 4], 16, [0, 3, 2, 1, 4])
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.standard_normal((8, 16, 3)).astype(np.float32),
        "b": rng.standard_normal((8, 3, 16)).astype(np.float32),
    }
    after, report, _ = _rewritten(model, ("product_view_transposed_at_rank4",))
    assert report["product_view_transposed_at_rank4"]
    status, error, last = qnn_error_in_child(after, feeds)
    assert status == 0 and error is not None, f"the child ended with status {status}: {last}"
    assert error < 5e-3, error


def _joined_views(lead: list[int], rows: int, left: int, left_from_product: bool) -> onnx.ModelProto:
    """A MatMul product ``[B, rows, left]`` and a square one ``[B, rows, rows]`` viewed at rank 5 as ``[*lead, rows,
    left]`` and ``[*lead, rows, rows]`` (the second is the refused form), joined on the last axis: Pegasus-X's global
    and local score blocks. With ``left_from_product`` False the first block is a plain input of its rank-5 shape."""
    batch = int(np.prod(lead))
    nodes = [h.make_node("MatMul", ["c", "d"], ["q"]), h.make_node("Reshape", ["q", "vr"], ["r2"])]
    inputs = [("c", TensorProto.FLOAT, (batch, rows, 3)), ("d", TensorProto.FLOAT, (3, rows))]
    if left_from_product:
        nodes += [h.make_node("MatMul", ["a", "b"], ["p"]), h.make_node("Reshape", ["p", "vl"], ["r1"])]
        inputs += [("a", TensorProto.FLOAT, (batch, rows, 3)), ("b", TensorProto.FLOAT, (3, left))]
    else:
        inputs += [("r1", TensorProto.FLOAT, (*lead, rows, left))]
    nodes.append(h.make_node("Concat", ["r1", "r2"], ["y"], axis=-1))
    return make_model(
        nodes,
        inputs,
        [("y", TensorProto.FLOAT, (*lead, rows, left + rows))],
        {"vl": np.array([*lead, rows, left], np.int64), "vr": np.array([*lead, rows, rows], np.int64)},
    )


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


@settings(max_examples=30, deadline=None)
@given(
    lead=shapes(min_rank=3, max_rank=3, max_side=3),
    rows=st.integers(2, 6),
    left=st.integers(1, 5),
    left_from_product=st.booleans(),
    seed=seeds(),
)
def test_views_of_products_joined_on_the_last_axis_are_joined_first(
    lead: list[int], rows: int, left: int, left_from_product: bool, seed: int
) -> None:
    """Rank-5 views of products (and plain rank-5 blocks) joined on the last axis equal their rows joined at rank 2
    and viewed once; the rewritten graph reshapes no product to rank 5."""
    model = _joined_views(lead, rows, left, left_from_product)
    feeds = _feeds(model, seed)
    after, report, _ = _rewritten(model, ("concat_before_product_view",))
    assert report["concat_before_product_view"]
    graph = onnx.load_from_string(after).graph
    producers = {o: n for n in graph.node for o in n.output}
    for n in graph.node:
        shape = (
            onnx.numpy_helper.to_array(next(i for i in graph.initializer if i.name == n.input[1]))
            if n.op_type == "Reshape"
            else None
        )
        if shape is not None and len(shape) == 5:
            assert producers[n.input[0]].op_type == "Concat"
    np.testing.assert_array_equal(_outputs(after, feeds)[0], _outputs(model, feeds)[0])


def test_pegasus_x_joined_score_blocks_run_on_qnn() -> None:
    """Global and local score blocks of Pegasus-X's shape class (``[1, 2, 2, 8, 4]`` and ``[1, 2, 2, 8, 8]`` from
    rank-3 products; the second stops QNN as it is), joined and softmaxed: after the rewrite the graph runs on QNN, in a child process in case it
    stops one, with eager's values."""
    model = _joined_views([1, 2, 2], 8, 4, True)
    model.graph.node.append(h.make_node("Softmax", ["y"], ["z"], axis=-1))
    model.graph.output[0].name = "z"
    feeds = _feeds(model, 0)
    after, report, _ = _rewritten(model, ("concat_before_product_view",))
    assert report["concat_before_product_view"]
    status, error, last = qnn_error_in_child(after, feeds)
    assert status == 0 and error is not None, f"the child ended with status {status}: {last}"
    assert error < 5e-3, error
