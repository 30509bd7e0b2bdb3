"""Which nodes of a graph go to ONNX Runtime's CPU EP when it is split (qnnx-opcheck's tables, no session)."""

from __future__ import annotations

import onnx
import onnx.numpy_helper
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import qnnx_opcheck
from qnnx_backend._split import CpuPlan, context_cpu_types, misplaced, plan_cpu_nodes, with_island

# Float ops opcheck vouches for on HTP, and ops it refuses: Erf alone (the QNN EP declines it), Cosh (not in the
# table), Floor (fp16 rounding of its input changes the result by a whole step).
_VOUCHED = ("Relu", "Sigmoid", "Tanh", "Neg")
_REFUSED = ("Erf", "Cosh", "Floor")


def _chain(ops: list[str], shape: tuple[int, ...] = (2, 8)) -> onnx.ModelProto:
    """x -> ops[0] -> ops[1] -> ... -> y, every node named ``<op>_<position>``."""
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"v{i}"
        nodes.append(helper.make_node(op, [prev], [out], name=f"{op.lower()}_{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plan(model: onnx.ModelProto) -> CpuPlan:
    return plan_cpu_nodes(model, qnnx_opcheck.check_model(model, "htp", soc_model=60))


def test_a_fully_vouched_graph_has_an_empty_plan() -> None:
    """Every node supported: nothing goes to the CPU EP and the plan is falsy."""
    plan = _plan(_chain(["Relu", "Sigmoid", "Tanh"]))
    assert not plan and plan.op_types == () and plan.nodes == {}


def test_an_unsupported_node_is_pinned_with_opchecks_reason() -> None:
    """Erf outside the GELU pattern goes to the CPU EP, with opcheck's words; its neighbours stay on QNN."""
    plan = _plan(_chain(["Relu", "Erf", "Sigmoid"]))
    assert set(plan.nodes) == {"erf_1"} and plan.op_types == ("Erf",)
    assert "declines" in plan.nodes["erf_1"]
    assert (plan.on_qnn, plan.on_cpu) == (2, 1) and plan.keeps_majority()
    assert "2 of 3 ONNX nodes on QNN" in plan.describe()


def test_a_step_op_pins_the_float_computation_that_feeds_it() -> None:
    """Floor of a value computed on the way (Relu, Sigmoid) pins those producers too: fp16 rounding on QNN would
    move the floor by a whole step; the Tanh after the Floor stays on QNN."""
    plan = _plan(_chain(["Relu", "Sigmoid", "Floor", "Tanh"]))
    assert set(plan.nodes) == {"relu_0", "sigmoid_1", "floor_2"}
    assert "floor_2 (Floor)" in plan.nodes["relu_0"]
    assert plan.op_types == ("Floor", "Relu", "Sigmoid")
    assert (plan.on_qnn, plan.on_cpu) == (1, 3) and not plan.keeps_majority()


@given(after=st.lists(st.sampled_from(_VOUCHED), min_size=1, max_size=4), zero_at=st.integers(0, 3))
def test_everything_after_a_division_by_a_constant_zero_is_pinned(after: list[str], zero_at: int) -> None:
    """A Div by a constant holding a zero (a variance over one element) is refused, and every node computing on
    its infinities or NaN is pinned too: a QNN node would turn them into finite numbers. What runs before it stays
    on QNN."""
    import numpy as np

    divisor = np.ones(4, np.float32)
    divisor[zero_at] = 0.0
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="before"),
        helper.make_node("Div", ["r", "d"], ["v0"], name="div"),
    ]
    for i, op in enumerate(after):
        nodes.append(helper.make_node(op, [f"v{i}"], ["y" if i == len(after) - 1 else f"v{i + 1}"], name=f"after_{i}"))
    graph = helper.make_graph(
        nodes,
        "div_by_zero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(divisor, "d")],
    )
    plan = _plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert set(plan.nodes) == {"div", *(f"after_{i}" for i in range(len(after)))}
    assert "division by zero" in plan.nodes["after_0"]
    assert "before" not in plan.nodes


def test_a_step_op_on_a_graph_input_pins_only_itself() -> None:
    """Floor right on a graph input: the input is exact, nothing upstream to pin."""
    plan = _plan(_chain(["Floor", "Relu", "Sigmoid"]))
    assert set(plan.nodes) == {"floor_0"}


def test_a_cast_to_integer_is_a_step_op_and_a_cast_to_float_is_not() -> None:
    """Cast float -> int32 pins its float producer; the walk stops at integer values (exact)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu_0"),
        helper.make_node("Cast", ["a"], ["i"], name="cast_1", to=TensorProto.INT32),
        helper.make_node("Cast", ["i"], ["f"], name="cast_2", to=TensorProto.FLOAT),
        helper.make_node("Sigmoid", ["f"], ["y"], name="sigmoid_3"),
    ]
    graph = helper.make_graph(
        nodes,
        "casts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    plan = _plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "relu_0" in plan.nodes and "cast_1" in plan.nodes
    assert "sigmoid_3" not in plan.nodes


@given(st.lists(st.sampled_from(_VOUCHED + _REFUSED), min_size=1, max_size=8))
def test_every_refused_node_and_every_node_of_a_pinned_type_is_counted_on_the_cpu(ops: list[str]) -> None:
    """Property over random chains: each node opcheck refuses is in the plan; the plan's op types are exactly the
    types of its nodes; nodes of pinned types count on the CPU, the others on QNN; a Floor pins all that precedes
    it in the chain (every value before it is float, computed from the graph input)."""
    model = _chain(ops)
    report = qnnx_opcheck.check_model(model, "htp", soc_model=60)
    plan = plan_cpu_nodes(model, report)
    names = [n.name for n in model.graph.node]
    refused = {v.node_name for v in report.verdicts if v.status == "unsupported"}
    assert refused <= set(plan.nodes)
    assert set(plan.op_types) == {ops[names.index(n)] for n in plan.nodes}
    if plan:  # an empty plan: the graph is wholly on QNN, nothing to count
        assert plan.on_cpu == sum(op in plan.op_types for op in ops)
        assert plan.on_qnn + plan.on_cpu == len(ops)
    if "Floor" in ops:
        last = len(ops) - 1 - ops[::-1].index("Floor")
        assert set(names[: last + 1]) <= set(plan.nodes)
    assert bool(plan) == bool(refused)


def test_context_models_pin_their_plain_nodes() -> None:
    """A compiled context keeps its plain (CPU) nodes off QNN; a plain model is not a context (None)."""
    ctx = helper.make_node("EPContext", ["x"], ["a"], name="ctx_0", domain="com.microsoft")
    floor = helper.make_node("Floor", ["a"], ["y"], name="floor_1")
    graph = helper.make_graph(
        [ctx, floor],
        "ctx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    assert context_cpu_types(helper.make_model(graph)) == ("Floor",)
    assert context_cpu_types(_chain(["Relu"])) is None


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ({"QNNExecutionProvider": ("a",), "CPUExecutionProvider": ("b",)}, None),
        ({"QNNExecutionProvider": ("a", "b")}, "QNN took node(s) meant for the CPU EP: b"),
        ({"QNNExecutionProvider": ("a",)}, "fused node(s) b into others"),
    ],
    ids=["on-cpu", "on-qnn", "fused-away"],
)
def test_misplaced_names_nodes_that_left_the_cpu(placement: dict[str, tuple[str, ...]], expected: str | None) -> None:
    """A node meant for the CPU EP that QNN took, or that ORT fused away before placement, is reported."""
    got = misplaced(placement, ["b"], "QNNExecutionProvider")
    assert got == expected if expected is None else expected in (got or "")


def test_a_removed_no_op_is_not_misplaced() -> None:
    """An Identity ORT removed before placement moved no computation: it does not fail the session."""
    assert misplaced({"QNNExecutionProvider": ("a",)}, ["b"], "QNNExecutionProvider", no_ops=["b"]) is None
    assert misplaced({"QNNExecutionProvider": ("a", "b")}, ["b"], "QNNExecutionProvider", no_ops=["b"]) is not None


def test_the_q_dq_nodes_of_a_pinned_qdq_unit_follow_its_op_without_pinning_their_types() -> None:
    """DQ -> Relu -> Q with the Relu pinned: the DequantizeLinear feeding it and the QuantizeLinear of its output
    are unit members (the EP's op_affinity moves the whole unit with the op), so only Relu's type is pinned; a
    DequantizeLinear pinned for its own reason, feeding a node meant for QNN, pins its type."""
    from qnnx_backend._split import _unit_members

    scale, zero = "s", "z"
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", scale, zero], ["x"], name="dq0"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", scale, zero], ["rq"], name="q0"),
        helper.make_node("DequantizeLinear", ["rq", scale, zero], ["d"], name="dq1"),
        helper.make_node("Sigmoid", ["d"], ["y"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("xq", TensorProto.UINT8, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor(scale, TensorProto.FLOAT, [], [0.1]), helper.make_tensor(zero, TensorProto.UINT8, [], [0])],
    )
    names = [n.name for n in nodes]
    pinned = dict.fromkeys(["dq0", "relu", "q0", "dq1"], "why")
    assert _unit_members(graph, names, pinned) == {"dq0", "q0"}


def _relu_branches_then_topk(floor_branch: bool) -> onnx.ModelProto:
    """x -> Relu -> TopK, beside x -> Relu -> Floor when ``floor_branch``: the Floor pins its Relu, so every Relu
    (the op type is what onnxruntime-qnn pins) runs on the CPU EP."""
    import numpy as np

    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_topk"),
        helper.make_node("TopK", ["r", "k"], ["vals", "idx"], name="topk"),
    ]
    outputs = [
        helper.make_tensor_value_info("vals", TensorProto.FLOAT, [2, 2]),
        helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 2]),
    ]
    if floor_branch:
        nodes += [
            helper.make_node("Relu", ["x"], ["s"], name="relu_floor"),
            helper.make_node("Floor", ["s"], ["f"], name="floor"),
        ]
        outputs.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 8]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        outputs,
        [onnx.numpy_helper.from_array(np.array([2], dtype=np.int64), "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("floor_branch", [False, True])
def test_a_topk_follows_its_producer_to_the_cpu(floor_branch: bool) -> None:
    """opcheck vouches for TopK of a value a QNN node computes (fp16-rounded wherever TopK runs). When the plan moves
    that producer to the CPU EP (here: another Relu feeds a Floor, and Relu is pinned as a type), the value is exact
    float32, so TopK is pinned too rather than rounding it on QNN."""
    plan = _plan(_relu_branches_then_topk(floor_branch))
    if not floor_branch:
        assert not plan, plan.nodes
        return
    assert {"relu_floor", "floor", "topk"} <= set(plan.nodes)
    assert "relu_topk (Relu)" in plan.nodes["topk"]
    assert "TopK" in plan.op_types and "Relu" in plan.op_types


@given(
    ops=st.lists(st.sampled_from(_VOUCHED + _REFUSED), min_size=1, max_size=8),
    data=st.data(),
)
def test_a_finalize_island_moves_every_node_of_its_types_and_names_its_run(ops: list[str], data: st.DataObject) -> None:
    """Adding a narrowed run's op types to a plan moves every node of those types to the CPU (the counts still add
    up to the placed nodes), keeps the plan's own pins, and gives the run's nodes of those types the finalize
    reason, naming the run and the op types that moved whole."""
    model = _chain(ops)
    plan = _plan(model)
    start = data.draw(st.integers(0, len(ops) - 1))
    stop = data.draw(st.integers(start + 1, len(ops)))
    run = [n for n in model.graph.node[start:stop]]
    pinned = sorted({n.op_type for n in run})
    narrowed = qnnx_opcheck.NarrowReport(
        error="the QNN HTP backend failed to finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC)",
        nodes=tuple(n.name for n in run),
        op_types=tuple(pinned),
        trials=7,
    )
    island = with_island(plan, model, narrowed, pinned)
    total = plan.on_qnn + plan.on_cpu if plan else len(ops)
    assert island.on_qnn + island.on_cpu == total
    assert island.on_cpu == sum(n.op_type in island.op_types for n in model.graph.node)
    assert set(island.op_types) == set(plan.op_types) | set(pinned)
    assert {k: v for k, v in island.nodes.items() if k in plan.nodes} == dict(plan.nodes)
    new = set(island.nodes) - set(plan.nodes)
    assert new == {n.name for n in run if n.op_type not in plan.op_types and n.name not in plan.nodes}
    for name in new:
        why = island.nodes[name]
        assert why.startswith("QNN graph finalize failed: ") and "by 7 trials" in why, why
        assert f"narrowed to {len(run)} node(s)" in why and "runs on the CPU EP" in why, why
