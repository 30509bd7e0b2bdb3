"""Integer input bounds: within the bound an exported graph records for an integer input, no integer value the graph
computes leaves int32 (HTP computes integers in int32 and saturates); ids that only index need no bound."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from export_capture import capture, only
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# Integer expressions over two int64 inputs x, y ([8] each): each step combines the running value with x, y or a
# constant by an op PyTorch computes in int64 without overflow for these magnitudes.
_STEP = st.tuples(
    st.sampled_from(["add", "sub", "mul", "mod", "cumsum", "sum", "neg", "abs", "max", "clamp"]),
    st.sampled_from(["x", "y", "c"]),
    st.integers(-70000, 70000),
)


def _program(steps):
    def fn(x, y):
        v = x
        for op, other, c in steps:
            o = {"x": x, "y": y, "c": torch.full_like(x, c)}[other]
            if op == "add":
                v = v + o
            elif op == "sub":
                v = v - o
            elif op == "mul":
                v = v * o
            elif op == "mod":
                v = v % (abs(c) + 1)
            elif op == "cumsum":
                v = v.cumsum(0)
            elif op == "sum":
                v = v.sum().expand(8)
            elif op == "neg":
                v = -v
            elif op == "abs":
                v = v.abs()
            elif op == "max":
                v = torch.maximum(v, o)
            else:
                v = v.clamp(-abs(c), abs(c))
        return v

    return fn


def _intermediates(exported: qe.ExportedGraph, feed: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Every integer value of the exported model with the op that computes it, computed in int64 by ONNX Runtime's
    CPU EP."""
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    inferred = onnx.shape_inference.infer_shapes(model)
    ints = [
        vi
        for vi in inferred.graph.value_info
        if vi.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    ]
    model.graph.output.extend(ints)
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = [np.asarray(o) for o in session.run(None, feed)]
    return [(producer.get(n, "input"), v) for n, v in zip(names, values) if v.dtype.kind == "i"]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(_STEP, min_size=1, max_size=5),
    scale=st.sampled_from([1.0, 0.5, 1e-3]),
    fill=st.sampled_from(["high", "low", "random"]),
    seed=st.integers(0, 2**16),
)
def test_within_the_bounds_no_integer_value_leaves_int32(steps, scale, fill, seed):
    """Property: inputs within each input's recorded bound (any int32 value where none is recorded), at either end
    of it or anywhere inside, give integer values that all fit int32, and sums within 2**24 (HTP adds integers up in
    float32), computed exactly (int64) on ONNX Runtime's CPU EP."""
    fn = _program(steps)
    x0 = torch.arange(8, dtype=torch.int64)
    g = only(capture(fn, x0, x0 + 1)[0])
    refusal = None
    try:
        exported = qe.export(g.gm, g.example_inputs, analysis=g.analysis)
    except qe.errors.ExportError as exc:
        refusal = str(exc)
    if refusal is not None:
        # Refused: even at x = y = 0 the program leaves what HTP computes exactly (int64 in eager, step by step).
        assert "even with its integer inputs at 0" in refusal, refusal
        zero = torch.zeros(8, dtype=torch.int64)
        assert any(_beyond(op, v) for op, v in _steps_in_eager(steps, zero, zero)), steps
        return
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in exported.signature.inputs:
        bound = spec.max_abs if spec.max_abs is not None else _INT32_MAX
        limit = int(bound * scale)
        dtype = np.int32 if spec.onnx_dtype == "int32" else np.int64
        if fill == "random":
            values = rng.integers(-limit, limit, size=spec.shape, endpoint=True)
        else:
            values = np.full(spec.shape, limit if fill == "high" else -limit)
        feed[spec.name] = values.astype(dtype)
    for op, value in _intermediates(exported, feed):
        limit = 2**24 if op in ("ReduceSum", "CumSum") else _INT32_MAX
        assert value.min() >= -limit - (limit == _INT32_MAX) and value.max() <= limit, (op, steps, feed)


def _steps_in_eager(steps, x, y):
    """Each step's op and value of :func:`_program` in int64 eager PyTorch (exact for these magnitudes)."""
    return [(steps[k][0], _program(steps[: k + 1])(x, y)) for k in range(len(steps))]


def _beyond(op: str, value: torch.Tensor) -> bool:
    """Whether ``value`` leaves what HTP holds it in: float32's exact integers for a sum, int32 otherwise."""
    limit = 2**24 if op in ("cumsum", "sum") else _INT32_MAX
    return bool((value.abs() > limit).any())


def test_constants_that_overflow_for_every_input_are_refused():
    """``((x - 277) * 277 * 237).cumsum(0)`` sums past float32's exact integers (HTP's integer sums) even at x = 0:
    no input bound makes it exact on HTP, so the export refuses it (it had no bound at all: silently wrong)."""
    g = only(capture(lambda x: ((x - 277) * 277 * 237).cumsum(0), torch.arange(8))[0])
    with pytest.raises(qe.errors.ExportError, match="even with its integer inputs at 0"):
        qe.export(g.gm, g.example_inputs, analysis=g.analysis)


def test_routing_indices_are_bounded_by_their_axis():
    """Top-k expert indices are below the number of experts: counting tokens per expert with them needs no bound and
    refuses nothing (they were taken as any int32, which proved nothing)."""

    def route(logits: torch.Tensor) -> torch.Tensor:
        top = logits.topk(2, -1).indices
        return torch.zeros(8, dtype=torch.int64).index_add(0, top.flatten(), torch.ones_like(top.flatten())) * 1000

    g = only(capture(route, torch.randn(5, 8))[0])
    exported = qe.export(g.gm, g.example_inputs, analysis=g.analysis)
    assert all(s.max_abs is None for s in exported.signature.inputs)


def test_a_product_gets_the_bound_that_keeps_it_in_int32():
    g = only(capture(lambda x: x * 1000003 % 65521, torch.arange(8))[0])
    (spec,) = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs
    assert spec.max_abs == _INT32_MAX // 1000003


def test_a_sum_gets_the_bound_of_its_count():
    """A sum of 8 stays within float32's exact integers (HTP's integer sums are float32 ones)."""
    g = only(capture(lambda x: x.sum(), torch.arange(8))[0])
    (spec,) = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs
    assert spec.max_abs == 2**24 // 8


def test_ids_that_only_index_need_no_bound():
    table = torch.randn(100, 4)
    g = only(capture(lambda ids, mask: (table[ids] * 2, mask.cumsum(-1)), torch.arange(6), torch.ones(6).long())[0])
    specs = {s.arg_index: s for s in qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs}
    bounds = [s.max_abs for s in specs.values() if s.onnx_dtype == "int32"]
    assert sorted(b for b in bounds if b is not None) == [2**24 // 6]  # the mask's running sum, not the ids
    assert None in bounds


def test_the_bounds_survive_the_signatures_round_trip():
    g = only(capture(lambda x: x * 7, torch.arange(8))[0])
    signature = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature
    assert signature.inputs[0].max_abs == _INT32_MAX // 7
    assert qe.GraphSignature.from_dict(signature.to_dict()) == signature


def test_independent_inputs_get_their_own_bounds():
    """A product and a cast to float (float16 on HTP: 65504 at most) bound their own inputs, not each other's."""
    g = only(capture(lambda x, m: (x * 113, m.float() * 2), torch.arange(8), torch.ones(8).long())[0])
    bounds = {s.arg_index: s.max_abs for s in qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs}
    assert sorted(bounds.values()) == [65504, _INT32_MAX // 113]


def test_an_index_add_is_bounded_as_a_sum_of_its_updates():
    """HTP adds a ScatterND's updates up in float32: ten updates into any element stay within 2**24."""
    index = torch.tensor([0, 1, 0, 2, 1, 0, 2, 1, 0, 2])
    g = only(capture(lambda x: torch.zeros(3, dtype=torch.int64).index_add(0, index, x), torch.arange(10))[0])
    specs = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs
    assert [s.max_abs for s in specs if s.max_abs is not None] == [2**24 // 10]


def _scaled_by_filled(typed: bool) -> onnx.ModelProto:
    """``x * ConstantOfShape([4], 1000)`` on an int64 input, with or without the filled constant's type."""
    from onnx import TensorProto, helper, numpy_helper

    fill = helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([1000], np.int64)))
    graph = helper.make_graph(
        [fill, helper.make_node("Mul", ["x", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [4])],
        [numpy_helper.from_array(np.array([4], np.int64), "s")],
        value_info=[helper.make_tensor_value_info("c", TensorProto.INT64, [4])] if typed else [],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_filled_constant_bounds_an_int64_input_and_an_untyped_operand_proves_nothing():
    """An int64 input (computed as int32 on HTP) times a ConstantOfShape of 1000 gets 2**31 // 1000. Without the
    constant's type its range is unknown: the analysis then claims no bound at all rather than a wrong one."""
    import onnx_ir as ir

    from qnnx_export._int_ranges import integer_input_bounds

    assert integer_input_bounds(ir.serde.deserialize_model(_scaled_by_filled(True))) == {"x": _INT32_MAX // 1000}
    assert integer_input_bounds(ir.serde.deserialize_model(_scaled_by_filled(False))) == {}


@pytest.mark.parametrize(
    ("fn", "shape", "count"),
    [
        (lambda x: x.sum((1, 3)), (2, 3, 1, 5), 15),
        (lambda x: x.cumsum(2), (1, 2, 6, 1, 3), 6),
        (lambda x: x.sum(-1, keepdim=True), (3, 1, 7, 1), 1),
    ],
)
def test_reductions_at_rank_4_and_5_count_the_reduced_axes(fn, shape, count):
    """A sum over some axes of a rank-4 or rank-5 tensor (size-1 axes included) is bounded by the elements it adds."""
    g = only(capture(fn, torch.zeros(shape, dtype=torch.int64))[0])
    (spec,) = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs
    assert spec.max_abs == 2**24 // count
