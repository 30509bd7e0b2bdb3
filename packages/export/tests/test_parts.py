"""Splitting an ONNX model under a weight budget: where the planner cuts, and that the parts compose to the whole."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qnnx_export import extract_parts, plan_parts, stored_weight_bytes, weight_bytes
from qnnx_export.errors import ExportError


def _decoder(blocks: int, hidden: int, seq: int = 3, seed: int = 0) -> tuple[onnx.ModelProto, list[int]]:
    """A decoder-shaped chain: each block is attention (q, k, v projections, softmax, output projection) plus a
    residual, all reading a scale computed once at the start. Returns the model and the index of each block's
    first node."""
    rng = np.random.default_rng(seed)
    nodes, inits, starts = [], [], []
    nodes.append(helper.make_node("Mul", ["x", "two"], ["scale"], name="scale"))
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "two"))
    cur = "x"
    for b in range(blocks):
        starts.append(len(nodes))
        w = {k: f"b{b}.{k}" for k in ("q", "k", "v", "o")}
        for name in w.values():
            inits.append(
                numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.3).astype(np.float32), name)
            )
        p = f"b{b}."
        nodes += [
            helper.make_node("Mul", [cur, "scale"], [p + "n"], name=p + "norm"),
            helper.make_node("MatMul", [p + "n", w["q"]], [p + "qq"], name=p + "q"),
            helper.make_node("MatMul", [p + "n", w["k"]], [p + "kk"], name=p + "k"),
            helper.make_node("MatMul", [p + "n", w["v"]], [p + "vv"], name=p + "v"),
            helper.make_node("Transpose", [p + "kk"], [p + "kt"], perm=[0, 2, 1], name=p + "kt"),
            helper.make_node("MatMul", [p + "qq", p + "kt"], [p + "s"], name=p + "scores"),
            helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1, name=p + "softmax"),
            helper.make_node("MatMul", [p + "a", p + "vv"], [p + "ctx"], name=p + "ctx"),
            helper.make_node("MatMul", [p + "ctx", w["o"]], [p + "out"], name=p + "o"),
            helper.make_node("Add", [cur, p + "out"], [p + "h"], name=p + "residual"),
        ]
        cur = p + "h"
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="final"))
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model), starts


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))


def _run_parts(parts: list[onnx.ModelProto], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feed)
    for part in parts:
        env.update(_run(part, {i.name: env[i.name] for i in part.graph.input}))
    return env


def test_a_model_within_budget_is_one_part() -> None:
    model, _ = _decoder(2, 8)
    plan = plan_parts(model, weight_bytes(model))
    assert len(plan.parts) == 1
    assert (plan.parts[0].start, plan.parts[0].stop) == (0, len(model.graph.node))
    assert plan.parts[0].outputs == ("y",)


def test_cuts_fall_between_blocks_and_parts_compose() -> None:
    model, starts = _decoder(6, 16)
    block = 4 * 16 * 16 * 4
    plan = plan_parts(model, 2 * block + 64)
    assert len(plan.parts) == 3
    assert all(p.weight_bytes <= plan.max_bytes for p in plan.parts)
    assert {p.start for p in plan.parts[1:]} <= set(starts)
    x = np.random.default_rng(1).standard_normal((1, 3, 16)).astype(np.float32)
    whole = _run(model, {"x": x})["y"]
    np.testing.assert_allclose(_run_parts(extract_parts(model, plan), {"x": x})["y"], whole, rtol=1e-5, atol=1e-5)
    assert "3 parts" in plan.describe()


def test_float32_counted_as_float16_halves_the_parts() -> None:
    model, _ = _decoder(4, 16)
    budget = 2 * (4 * 16 * 16 * 4) + 64
    assert len(plan_parts(model, budget).parts) == 2
    assert len(plan_parts(model, budget, float32_bytes=2).parts) == 1


def test_parts_keep_external_data_references(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, _ = _decoder(4, 16)
    x = np.random.default_rng(2).standard_normal((1, 3, 16)).astype(np.float32)
    whole = _run(model, {"x": x})["y"]
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, location="model.onnx.data", size_threshold=64)
    data_size = (tmp_path / "model.onnx.data").stat().st_size
    light = onnx.load(tmp_path / "model.onnx", load_external_data=False)
    plan = plan_parts(light, 2 * 4 * 16 * 16 * 4 + 64)
    env = {"x": x}
    for k, part in enumerate(extract_parts(light, plan)):
        path = tmp_path / f"part{k}.onnx"
        onnx.save(part, path)
        assert path.stat().st_size < data_size / 4  # the weights stay in the one data file
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs = sess.run(None, {i.name: env[i.name] for i in sess.get_inputs()})
        env.update(zip([o.name for o in sess.get_outputs()], outs))
    np.testing.assert_allclose(env["y"], whole, rtol=1e-5, atol=1e-5)


def test_a_single_node_above_the_budget_is_reported() -> None:
    model, _ = _decoder(3, 16)
    plan = plan_parts(model, 100)
    assert plan.over_budget  # every block's weights exceed 100 bytes: no cut can help
    assert plan.parts[-1].stop == len(model.graph.node)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1GiB", True, None])
def test_bad_budget_names_the_value(bad: object) -> None:
    model, _ = _decoder(1, 4)
    with pytest.raises(ValueError, match=f"max_bytes={bad!r}.*positive number of bytes"):
        plan_parts(model, bad)  # type: ignore[arg-type]


def test_an_initializer_output_cannot_be_split() -> None:
    model, _ = _decoder(2, 4)
    model.graph.output.append(helper.make_tensor_value_info("b0.q", TensorProto.FLOAT, [4, 4]))
    with pytest.raises(ExportError, match=r"'b0\.q' is an initializer"):
        plan_parts(model, 10)


@settings(max_examples=40, deadline=None)
@given(
    blocks=st.integers(1, 7),
    hidden=st.sampled_from([4, 8]),
    per_part=st.integers(1, 4),
    slack=st.integers(8, 60),  # the shared scale constant (4 bytes) sits in the first part
)
def test_property_parts_partition_respect_the_budget_and_compose(
    blocks: int, hidden: int, per_part: int, slack: int
) -> None:
    model, starts = _decoder(blocks, hidden, seed=blocks)
    block = 4 * hidden * hidden * 4
    budget = per_part * block + slack
    plan = plan_parts(model, budget)
    n = len(model.graph.node)
    # the parts partition the nodes, in order
    assert plan.parts[0].start == 0 and plan.parts[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(plan.parts, plan.parts[1:]))
    # every part fits (a cut exists between any two blocks), and no part could be merged with the next
    assert all(p.weight_bytes <= budget for p in plan.parts)
    assert len(plan.parts) == -(-blocks // per_part)
    # cuts only between blocks: never inside an attention block
    assert {p.start for p in plan.parts[1:]} <= set(starts)
    x = np.random.default_rng(blocks).standard_normal((1, 3, hidden)).astype(np.float32)
    got = _run_parts(extract_parts(model, plan), {"x": x})["y"]
    np.testing.assert_allclose(got, _run(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def _tied(vocab: int = 64, hidden: int = 8, tail: bool = False) -> onnx.ModelProto:
    """Tied embeddings: the table is gathered at the start and, transposed, multiplied at the end; ``tail`` adds a
    bias after the output projection (a small weight behind a node above a small budget)."""
    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.full(1, 0.5, np.float32), "bias")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
        helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0], name="tied"),
        helper.make_node("MatMul", ["emb", "w"], ["h"], name="layer"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "table_t"], ["mm" if tail else "logits"], name="lm_head"),
    ]
    if tail:
        nodes.append(helper.make_node("Add", ["mm", "bias"], ["logits"], name="tail"))
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3, vocab])],
        initializer=[table, w, *([bias] if tail else [])],
    )
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_values_computed_from_weights_alone_never_cross_a_cut() -> None:
    """The Transpose of the tied table is a constant: the part that reads it gets its own copy (ONNX Runtime folds
    it there), so the transposed table is never handed between parts as an activation."""
    model, vocab, hidden = _tied(), 64, 8
    plan = plan_parts(model, vocab * hidden * 4 + 16)
    assert len(plan.parts) >= 2
    names = [[model.graph.node[i].name for i in p.nodes] for p in plan.parts]
    assert "tied" in names[-1] and all("tied" not in n for n in names[:-1]), names
    assert all("table_t" not in p.inputs and "table_t" not in p.outputs for p in plan.parts)
    assert max(plan.crossing_bytes) <= 3 * hidden * 4  # one hidden state, never the table
    ids = np.array([[1, 5, 9]], dtype=np.int64)
    got = _run_parts(extract_parts(model, plan), {"ids": ids})["logits"]
    np.testing.assert_allclose(got, _run(model, {"ids": ids})["logits"], rtol=1e-5, atol=1e-5)


def test_a_node_above_the_budget_keeps_the_small_nodes_after_it() -> None:
    """The table (2 KiB) exceeds a 1 KiB budget: the embedding and the output projection each need a part above
    it, and the small bias after the projection stays in the projection's part instead of a part of its own."""
    model = _tied(tail=True)
    plan = plan_parts(model, 1024)
    assert len(plan.over_budget) == 2, plan.parts
    last = [model.graph.node[i].name for i in plan.parts[-1].nodes]
    assert "lm_head" in last and "tail" in last, [p.nodes for p in plan.parts]
    assert plan.parts[-1].weight_bytes <= 64 * 8 * 4 + 1024 // 8  # the table and the bias


def test_a_tied_table_is_stored_twice_and_the_budget_sees_it() -> None:
    """QNN stores a tied table twice (as the Gather's table and, transposed, as the head's weight): the stored bytes
    count it twice, and a budget that one copy fits but two do not splits the model."""
    model, vocab, hidden = _tied(), 64, 8
    table = vocab * hidden * 4
    assert weight_bytes(model) == table + hidden * hidden * 4
    assert stored_weight_bytes(model) == 2 * table + hidden * hidden * 4
    assert stored_weight_bytes(model, float32_bytes=2) == table + hidden * hidden * 2
    plan = plan_parts(model, weight_bytes(model) + 64)
    assert plan.total_weight_bytes == stored_weight_bytes(model) and len(plan.parts) == 2, plan.describe()


_READERS = ("gather", "gather_again", "matmul", "matmul_again", "transposed", "transposed_again")


@given(readers=st.sets(st.sampled_from(_READERS), min_size=1))
def test_stored_bytes_count_a_weight_once_per_way_qnn_stores_it(readers: set[str]) -> None:
    """Property: a [16, 4] weight read by any mix of Gathers (as their table), MatMuls (directly) and MatMuls of its
    Transpose (each a folded tensor of its own) is stored once as a table if any Gather reads it, once as a weight
    if any MatMul reads it directly, and once per Transpose; other readers of the same kind share the copy."""
    w = numpy_helper.from_array(np.ones((16, 4), np.float32), "w")
    nodes, outputs = [], []
    for k, kind in enumerate(sorted(readers)):
        out = f"y{k}"
        if kind.startswith("gather"):
            nodes.append(helper.make_node("Gather", ["w", "ids"], [out]))
        elif kind.startswith("matmul"):
            nodes.append(helper.make_node("MatMul", ["x16", "w"], [out]))
        else:
            nodes.append(helper.make_node("Transpose", ["w"], [f"t{k}"], perm=[1, 0]))
            nodes.append(helper.make_node("MatMul", ["x4", f"t{k}"], [out]))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "readers",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("x16", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 4]),
        ],
        outputs,
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    copies = (
        any(r.startswith("gather") for r in readers)
        + any(r.startswith("matmul") for r in readers)
        + sum(r.startswith("transposed") for r in readers)
    )
    assert stored_weight_bytes(model) == copies * 16 * 4 * 4
    assert weight_bytes(model) == 16 * 4 * 4
