"""The graph helpers the QNN-safety passes share: new named values, and the float input of a node of one op type."""

from __future__ import annotations

import onnx_ir as ir
from hypothesis import given
from hypothesis import strategies as st

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph

_HINTS = st.lists(st.sampled_from(["abs", "max", "scale", "out", "x.y", ""]), unique=True, max_size=5)
_SHAPES = st.none() | st.lists(st.integers(0, 8), max_size=4).map(tuple)
_DTYPES = st.sampled_from([ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.INT64, ir.DataType.BOOL, None])


@given(hints=_HINTS, shapes=st.data(), dtype=_DTYPES, taken=st.sets(st.sampled_from(["p_abs", "p_max", "p_out"])))
def test_new_values_gives_one_fresh_value_per_hint_in_order(
    hints: list[str], shapes: st.DataObject, dtype: ir.DataType | None, taken: set[str]
) -> None:
    """new_values makes one value per hint, in the hints' order, each of the dtype and its hint's shape, with a name
    that collides neither with a name already taken nor with another new value's."""
    wanted = {hint: shapes.draw(_SHAPES) for hint in hints}
    values = _graph.new_values(UniqueNames(taken, prefix="p_"), dtype, wanted)
    assert list(values) == hints
    names = [v.name for v in values.values()]
    assert len(set(names)) == len(names)
    assert not set(names) & taken
    for hint, value in values.items():
        assert (value.dtype if dtype is not None else value.type) == dtype
        shape = wanted[hint]
        assert (value.shape is None) if shape is None else tuple(value.shape) == shape


def test_new_values_names_follow_the_hints() -> None:
    """A hint names its value: ``abs`` becomes ``p_abs``, and a taken name gets a number."""
    values = _graph.new_values(UniqueNames({"p_max"}, prefix="p_"), ir.DataType.FLOAT, {"abs": (2,), "max": (1,)})
    assert [v.name for v in values.values()] == ["p_abs", "p_max_1"]


@given(
    op=st.sampled_from(["Exp", "Mish", "Relu"]),
    dtype=st.sampled_from([ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.INT32]),
    domain=st.sampled_from(["", "ai.onnx", "com.microsoft"]),
    inputs=st.integers(0, 2),
)
def test_float_op_input_is_the_float_input_of_that_op(op: str, dtype: ir.DataType, domain: str, inputs: int) -> None:
    """float_op_input gives the first input of a default-domain node of the asked op type when that input is
    float32 or float16, and None for another op type or domain, another dtype, or no input."""
    xs = [ir.Value(name=f"x{i}", type=ir.TensorType(dtype), shape=ir.Shape([2])) for i in range(inputs)]
    node = ir.Node(domain, op, xs)
    found = _graph.float_op_input(node, "Exp")
    takes = op == "Exp" and domain in ("", "ai.onnx") and inputs > 0
    takes = takes and dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16)
    assert found is (xs[0] if takes else None)
