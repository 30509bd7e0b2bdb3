"""Property tests: check_model on generated valid graphs."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc
from qnnx_testkit.strategies import shapes

TABLE, _ = oc.load_table("htp", "2.7.0", 60)
UNARY = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Abs",
    "Neg",
    "Exp",
    "Floor",
    "Ceil",
    "Sin",
    "Cos",
    "Erf",
    "Softsign",
    "Celu",
    "Asin",
]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
DTYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
}
NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}


def _plain_cell(op: str, dtype: str) -> str | None:
    entry = TABLE.entry("", op)
    if entry is None:
        return None
    base = next(v for v in entry["variants"] if not v["when"])
    cell = base["dtypes"].get(dtype)
    return cell["status"] if cell else None


def _valid(op: str, dtype: str) -> bool:
    """The op accepts the dtype in ONNX (unary float-only ops reject ints)."""
    schema = onnx.defs.get_schema(op, 21)
    allowed = schema.type_constraints[0].allowed_type_strs
    return f"tensor({'float' if dtype == 'float32' else 'float16' if dtype == 'float16' else dtype})" in allowed


# Ops the table takes on float32 but whose fp16 results a hazard rule refuses (discontinuous or imprecise in
# fp16, Pow with a runtime exponent): the generated graphs feed them runtime float inputs.
FP16_RULED = {
    op
    for pid in ("fp16_discontinuous", "fp16_imprecise", "pow_fractional_exponent")
    for op in TABLE.patterns[pid]["ops"]
}
SUPPORTED_F32 = [op for op in UNARY + BINARY if _plain_cell(op, "float32") == "supported" and op not in FP16_RULED]


@st.composite
def graphs(draw: st.DrawFn, ops: list[str] | None = None, dtype: str | None = None) -> onnx.ModelProto:
    """A random valid DAG of elementwise nodes over one static-shape input."""
    dt = dtype or draw(st.sampled_from(list(DTYPES)))
    pool = [op for op in (ops or UNARY + BINARY) if _valid(op, dt)]
    shape = draw(shapes(min_rank=1, max_rank=4))
    n = draw(st.integers(1, 12))
    values, nodes, inits = ["x"], [], []
    for i in range(n):
        op = draw(st.sampled_from(pool))
        a = draw(st.sampled_from(values))
        ins = [a]
        if op in BINARY:
            if draw(st.booleans()):
                ins.append(draw(st.sampled_from(values)))
            else:
                name = f"c{i}"
                inits.append(numpy_helper.from_array(np.ones(shape[-1:], NP[dt]), name))
                ins.append(name)
        out = f"v{i}"
        nodes.append(helper.make_node(op, ins, [out], name=f"node{i}"))
        values.append(out)
    g = helper.make_graph(
        nodes,
        "gen",
        [helper.make_tensor_value_info("x", DTYPES[dt], shape)],
        [helper.make_tensor_value_info(values[-1], DTYPES[dt], shape)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(m)
    return m


@given(graphs())
def test_never_raises_on_valid_graphs(m: onnx.ModelProto) -> None:
    """check_model returns one verdict per node for any generated valid graph, for both backends."""
    for backend in ("htp", "gpu"):
        rep = oc.check_model(m, backend, onnxruntime_qnn="2.7.0")
        assert len(rep.verdicts) == len(m.graph.node)
        assert all(v.status in ("supported", "unsupported", "hazard") for v in rep.verdicts)
        rep.to_dict()
        rep.summary()


@given(graphs(ops=SUPPORTED_F32, dtype="float32"))
def test_supported_only_graph_is_supported(m: onnx.ModelProto) -> None:
    """A graph built only from ops the table supports for float32 is reported supported."""
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0")
    assert rep.supported, rep.summary()


@given(
    graphs(ops=SUPPORTED_F32, dtype="float32"),
    st.sampled_from(["Erf", "Softsign", "Celu", "com.microsoft::FusedGelu", "custom.domain::MyOp"]),
    st.data(),
)
def test_added_unsupported_node_is_reported_by_name(m: onnx.ModelProto, bad: str, data: st.DataObject) -> None:
    """Inserting an unsupported node anywhere in a supported graph makes it reported, by name."""
    domain, _, op = bad.rpartition("::")
    values = ["x"] + [n.output[0] for n in m.graph.node]
    src = data.draw(st.sampled_from(values))
    extra = helper.make_node(op, [src], ["bad_out"], name="the_bad_node", domain=domain)
    pos = values.index(src)  # right after the producer keeps the graph topologically sorted
    m.graph.node.insert(pos, extra)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]  # elementwise ops keep it
    m.graph.output.append(helper.make_tensor_value_info("bad_out", m.graph.input[0].type.tensor_type.elem_type, shape))
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, 1))
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0")
    assert not rep.supported
    assert [v.node_name for v in rep.unsupported] == ["the_bad_node"]
    assert "the_bad_node" in rep.summary()


@given(
    chain=st.lists(st.sampled_from(["Relu", "Softmax", "Tan", "Exp", "Neg", "Floor", "Sigmoid"]), max_size=3),
    rows=st.integers(1, 16),
    width=st.integers(2, 64),
    k=st.integers(1, 2),
)
def test_topk_placement_follows_where_its_input_is_computed(chain: list[str], rows: int, width: int, k: int) -> None:
    """A float TopK is vouched for exactly when the node computing its input is (that input then carries fp16
    rounding wherever TopK runs); of the graph input, or of a node opcheck refuses, it is refused."""
    nodes, src = [], "x"
    for i, op in enumerate(chain):
        attrs = {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, [src], [f"v{i}"], name=f"n{i}", **attrs))
        src = f"v{i}"
    nodes.append(helper.make_node("TopK", [src, "k"], ["vals", "idx"], name="topk"))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [
            helper.make_tensor_value_info("vals", TensorProto.FLOAT, [rows, k]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [rows, k]),
        ],
        [numpy_helper.from_array(np.array([k], dtype=np.int64), "k")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    verdicts = {v.node_name: v for v in oc.check_model(m, onnxruntime_qnn="2.7.0").verdicts}
    producer = verdicts.get(f"n{len(chain) - 1}") if chain else None
    expected = producer is not None and (producer.status == "supported" or producer.kind == "caveat")
    assert (verdicts["topk"].status == "supported") is expected, (chain, verdicts["topk"].reason)
