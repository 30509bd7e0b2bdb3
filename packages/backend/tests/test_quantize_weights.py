"""Which weights get which quantization: module weight types, symmetric signed weights, per-channel MatMul/Gemm,
block-wise int4 MatMul/Gemm weights (onnxruntime's block quantizer on the CPU EP; HTP's side is in integration-tests)."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qnnx_backend import BackendOptions
from qnnx_backend._quantize import (
    QuantizeFailed,
    block_plan,
    block_weights,
    import_block_quantizer,
    tensor_value,
    untie_transposed_weights,
    weight_groups,
    weight_overrides,
)


def _spec(value: object):
    return BackendOptions.from_mapping({"quantize": value}).quantize


def _nodes():
    return [
        helper.make_node("Gather", ["embed", "ids"], ["h0"], name="gather"),
        helper.make_node("MatMul", ["h0", "q"], ["h1"], name="q_mm"),
        helper.make_node("Gemm", ["h1", "head", "bias"], ["out"], name="head_gemm", transB=1),
        helper.make_node("Mul", ["out", "scale"], ["y"], name="norm_mul"),
    ]


INITS = {"embed": (64, 16), "q": (16, 16), "head": (64, 16), "bias": (64,), "scale": (64,)}
ORIGINS = {
    "gather": "[0].model.embed_tokens (Embedding)",
    "q_mm": "[0].model.layers.0.self_attn.q_proj (Linear)",
    "head_gemm": "[0].lm_head (Linear)",
}


def test_llm_recipe_overrides_the_blocks_head_and_embeddings():
    """llm-a16w4: the block's MatMul int4 symmetric per output channel (axis 1), the head's Gemm int8 per output
    channel (axis 0 under transB), the embedding table uint8 with its Gather's output converted to the 16-bit
    activations for its reader; a norm's Mul and the bias are left to the scheme."""
    got = weight_overrides(_nodes(), INITS, _spec("llm-a16w4"), ORIGINS)
    assert got == {
        "q": {"quant_type": "int4", "symmetric": True, "axis": 1},
        "head": {"quant_type": "int8", "symmetric": True, "axis": 0},
        "embed": {"quant_type": "uint8"},
        "h0": {"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": {"q_mm"}}},
    }


def test_plain_uint8_weights_need_no_override():
    """a16w8 (uint8 per tensor) is what the tooling does alone: no override."""
    assert weight_overrides(_nodes(), INITS, _spec("a16w8"), ORIGINS) == {}


@given(weight=st.sampled_from(["uint8", "int8", "uint16", "int4"]), per_channel=st.booleans())
def test_signed_weights_are_symmetric_and_per_channel_only_when_asked(weight, per_channel):
    """Property: whatever the scheme's weight type, signed weights are symmetric; an axis is set only for signed
    MatMul/Gemm weights under per_channel; unsigned weights of the scheme's own type get no override. An int8
    embedding table is written uint8 (a looked-up table gains nothing from signed storage, and the op tables vouch
    for uint8 Gathers in QDQ form, not int8), its Gather's output converted to the activations' type."""
    spec = _spec({"weight_type": weight, "per_channel": per_channel})
    got = weight_overrides(_nodes(), INITS, spec, ORIGINS)
    signed = weight in ("int8", "int4")
    for name in ("q", "head"):
        if signed:
            assert got[name]["symmetric"] is True and got[name]["quant_type"] == weight
            assert ("axis" in got[name]) is per_channel
        else:
            assert name not in got
    assert ("embed" in got) is signed and "bias" not in got and "scale" not in got
    if weight == "int8":
        assert got["embed"] == {"quant_type": "uint8"}
        assert got["h0"] == {"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": {"q_mm"}}}
    else:
        assert "h0" not in got


def _block_spec(block: int, weight_type: str = "int4"):
    return _spec({"scheme": "a16w4", "weight_type": weight_type, "block_size": block})


@given(
    k=st.integers(1, 300),
    n=st.integers(1, 64),
    block=st.sampled_from([16, 32, 64, 128]),
    trans_b=st.booleans(),
    op=st.sampled_from(["MatMul", "Gemm"]),
)
def test_a_weight_takes_blocks_exactly_when_the_block_divides_its_input_count(k, n, block, trans_b, op):
    """Property: an int4 MatMul/Gemm weight is written in blocks exactly when the block divides its input count K
    (the second dim under transB); otherwise it keeps the per-channel form, with K and the block in the reason."""
    trans = {"transB": 1} if op == "Gemm" and trans_b else {}
    node = helper.make_node(op, ["x", "w"], ["y"], name="mm", **trans)
    dims = (n, k) if trans else (k, n)
    plan = block_plan([node], {"w": dims}, _block_spec(block), {})
    assert plan == {"mm": "" if k % block == 0 else f"K={k} is no multiple of {block}"}


def test_blocks_apply_to_int4_weights_only_and_not_to_shared_or_computed_ones():
    """Only int4 weights take blocks (the recipe's int8 head and uint16 table do not); a weight two nodes read, a
    rank-3 weight and a Gemm with a scaled product keep their form, each with its reason."""
    spec = _spec({"scheme": "llm-a16w4"})
    got = block_plan(_nodes(), {**INITS, "q": (64, 64)}, spec, ORIGINS)
    assert got == {"q_mm": ""}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="a"),
        helper.make_node("MatMul", ["x", "w"], ["b"], name="b"),
        helper.make_node("MatMul", ["x", "w3"], ["c"], name="c"),
        helper.make_node("Gemm", ["x", "g"], ["d"], name="d", alpha=0.5),
    ]
    got = block_plan(nodes, {"w": (64, 8), "w3": (1, 64, 8), "g": (64, 8)}, _block_spec(32), {})
    assert got == {
        "a": "a weight shared by several nodes",
        "b": "a weight shared by several nodes",
        "c": "a rank-3 weight",
        "d": "a Gemm with transA, alpha, beta or a computed bias",
    }
    assert block_plan(nodes, {"w": (64, 8)}, _spec("a16w4"), {}) == {}


def _linear_model(op: str, k: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((n, k) if op == "Gemm" else (k, n)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(n) * 0.1).astype(np.float32)
    inputs = ["x", "w", "b"] if op == "Gemm" else ["x", "w"]
    attrs = {"transB": 1} if op == "Gemm" else {}
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="linear", **attrs)],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@settings(deadline=None, max_examples=12)
@given(op=st.sampled_from(["MatMul", "Gemm"]), blocks=st.integers(1, 4), n=st.integers(1, 24), seed=st.integers(0, 9))
def test_block_weights_are_onnxruntimes_symmetric_int4_blocks_and_compute_the_same_product(
    tmp_path_factory, op, blocks, n, seed
):
    """Property: a MatMul or Gemm (transB, bias) written in blocks of 16 is a block-wise int4 DequantizeLinear
    (symmetric: no zero point) before a MatMul that keeps the node's name; on the CPU EP it computes the float
    product within int4 rounding (each weight off by at most half its block's scale)."""
    folder = tmp_path_factory.mktemp("blocks")
    k = 16 * blocks
    model = _linear_model(op, k, n, seed)
    onnx.save_model(model, str(folder / "float.onnx"))
    plan = block_weights(folder / "float.onnx", folder / "blocks.onnx", _block_spec(16), {}, [], False)
    assert plan == {"linear": ""}
    blocked = onnx.load(str(folder / "blocks.onnx"))
    (dq,) = [node for node in blocked.graph.node if node.op_type == "DequantizeLinear"]
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 16} and len(dq.input) == 2
    assert any(node.op_type == "MatMul" and node.name == "linear" for node in blocked.graph.node)
    x = np.random.default_rng(seed).standard_normal((4, k)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = onnxruntime.InferenceSession(blocked.SerializeToString(), providers=["CPUExecutionProvider"])
    w = numpy_helper.to_array(model.graph.initializer[0])
    w = w.T if op == "Gemm" else w
    scale = np.abs(w).reshape(blocks, 16, n).max(axis=1) / 7  # the widest a symmetric int4 block's step can be
    bound = np.abs(x).reshape(4, blocks, 16).sum(axis=2) @ (scale / 2) + 1e-5
    error = np.abs(got.run(None, {"x": x})[0] - want.run(None, {"x": x})[0])
    assert (error <= bound).all(), (error.max(), bound.min())


def test_weight_groups_name_the_block_size_and_why_a_weight_kept_its_form(tmp_path):
    """The report's weight text says "int4 blocks of 16" for a block-wise weight, and for a weight that kept its
    per-channel form where blocks were asked for, the reason."""
    model = _linear_model("MatMul", 32, 8, 0)
    onnx.save_model(model, str(tmp_path / "float.onnx"))
    block_weights(tmp_path / "float.onnx", tmp_path / "blocks.onnx", _block_spec(16), {}, [], False)
    origins = {"linear": "[0].fc (Linear)"}
    assert weight_groups(onnx.load(str(tmp_path / "blocks.onnx")), origins) == ("int4 blocks of 16: 1 MatMul in fc",)
    assert weight_groups(onnx.load(str(tmp_path / "blocks.onnx")), origins, {"linear": "why"}) == (
        "int4 blocks of 16 (why): 1 MatMul in fc",
    )


def _tied_model(vocab: int, hidden: int, op: str, also_read: bool, seed: int):
    """A tied-embedding decoder's ends: ``Gather(table, ids)``, then the head ``MatMul(h, Transpose(table))`` (or a
    Gemm), and when ``also_read`` an Add that reads the transposed table too."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h"], name="gather"),
        helper.make_node("Transpose", ["table"], ["t"], name="t", perm=[1, 0]),
    ]
    nodes.append(helper.make_node(op, ["h", "t"], ["logits"], name="head"))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, vocab])]
    if also_read:
        nodes.append(helper.make_node("Add", ["t", "t"], ["twice"], name="other"))
        outputs.append(helper.make_tensor_value_info("twice", TensorProto.FLOAT, [hidden, vocab]))
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        outputs,
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run_cpu(model, ids):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids})


def test_a_tied_head_gets_a_weight_of_its_own_and_the_recipes_int8():
    """A head that reads the embedding table through a Transpose (tied embeddings) gets the transposed table as an
    initializer of its own, the Transpose goes, the Gather keeps the table; the LLM recipe then gives the head int8
    per output channel and the table uint8 (its Gather's output converted to 16 bits for the head), where before the
    head had no weight override at all."""
    model = _tied_model(vocab=32, hidden=8, op="MatMul", also_read=False, seed=0)
    nodes, origins = model.graph.node, {"gather": "[0].model.embed_tokens (Embedding)", "head": "[0].lm_head (Linear)"}
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    table = {
        "table": {"quant_type": "uint8"},
        "h": {"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": {"head"}}},
    }
    assert weight_overrides(nodes, inits, _spec("llm-a16w4"), origins) == table
    ids = np.array([0, 5, 31])
    want = _run_cpu(model, ids)
    assert untie_transposed_weights(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Gather", "MatMul"]
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    assert inits == {"table": (32, 8), "t": (8, 32)}
    assert weight_overrides(model.graph.node, inits, _spec("llm-a16w4"), origins) == {
        **table,
        "t": {"quant_type": "int8", "symmetric": True, "axis": 1},
    }
    np.testing.assert_array_equal(_run_cpu(model, ids)[0], want[0])


def test_untying_leaves_the_heads_that_are_not_wanted():
    """A head the predicate declines (the compile's: a module without a weight type of its own) keeps reading the
    table through its Transpose."""
    model = _tied_model(vocab=32, hidden=8, op="MatMul", also_read=False, seed=0)
    assert untie_transposed_weights(model, lambda node: False) == 0
    assert [n.op_type for n in model.graph.node] == ["Gather", "Transpose", "MatMul"]


@settings(deadline=None, max_examples=20)
@given(
    vocab=st.integers(1, 40),
    hidden=st.integers(1, 16),
    op=st.sampled_from(["MatMul", "Gemm"]),
    also_read=st.booleans(),
    seed=st.integers(0, 9),
)
def test_untying_keeps_every_output_and_leaves_no_transposed_weight(vocab, hidden, op, also_read, seed):
    """Property: after untying, every MatMul/Gemm weight is an initializer, the model's outputs on the CPU EP are
    exactly the same, and a Transpose that another op still reads stays for that op."""
    model = _tied_model(vocab, hidden, op, also_read, seed)
    ids = np.random.default_rng(seed).integers(0, vocab, 3)
    want = _run_cpu(model, ids)
    untie_transposed_weights(model)
    inits = {i.name for i in model.graph.initializer}
    assert all(n.input[1] in inits for n in model.graph.node if n.op_type in ("MatMul", "Gemm"))
    assert any(n.name == "t" for n in model.graph.node) == also_read
    for got, expected in zip(_run_cpu(model, ids), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def _external(model, folder, name: str = "float.onnx"):
    """``model`` saved with every initializer in ``<name>.data`` and read back without its values."""
    onnx.save_model(model, str(folder / name), save_as_external_data=True, location=f"{name}.data", size_threshold=0)
    return onnx.load(str(folder / name), load_external_data=False)


def _externals(model) -> set[str]:
    return {i.name for i in model.graph.initializer if onnx.external_data_helper.uses_external_data(i)}


@settings(deadline=None, max_examples=10)
@given(vocab=st.integers(1, 40), hidden=st.integers(1, 16), also_read=st.booleans(), seed=st.integers(0, 9))
def test_untying_an_external_data_model_reads_the_table_from_its_file_and_leaves_it_there(
    tmp_path_factory, vocab, hidden, also_read, seed
):
    """Property: the quantizer's models keep their weights in a file beside them; untying such a model writes the
    head's transposed table from the file's values (the same outputs on the CPU EP once saved) while the table
    itself stays a reference to the file, not loaded into the model."""
    folder = tmp_path_factory.mktemp("external")
    model = _tied_model(vocab, hidden, "MatMul", also_read, seed)
    ids = np.random.default_rng(seed).integers(0, vocab, 3)
    want = _run_cpu(model, ids)
    lean = _external(model, folder)
    assert untie_transposed_weights(lean, base_dir=folder) == 1
    assert _externals(lean) == {"table"}
    onnx.save_model(lean, str(folder / "untied.onnx"), save_as_external_data=True, location="untied.onnx.data")
    for got, expected in zip(_run_cpu(onnx.load(str(folder / "untied.onnx")), ids), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_an_external_tensor_is_read_without_changing_the_model(tmp_path):
    """tensor_value reads an external initializer's values from its folder into a copy; the model still refers to
    the file, and without a folder the read fails naming the tensor."""
    model = _tied_model(vocab=8, hidden=4, op="MatMul", also_read=False, seed=0)
    want = numpy_helper.to_array(model.graph.initializer[0])
    lean = _external(model, tmp_path)
    table = lean.graph.initializer[0]
    np.testing.assert_array_equal(tensor_value(table, tmp_path), want)
    assert _externals(lean) == {"table"}
    with pytest.raises(QuantizeFailed, match="'table' is external data"):
        tensor_value(table)


def test_block_weights_reads_only_the_chosen_weights_of_an_external_data_model(tmp_path):
    """From an external-data model, block_weights writes the chosen MatMul's weight in blocks and leaves the other
    MatMul's weight (kept in float) a reference to the source's file; the written model computes the float product
    within int4 rounding on the CPU EP (each weight off by at most half its block's scale)."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((32, 16)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 8)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="a"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="b"),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    _external(model, tmp_path, "source.onnx")
    plan = block_weights(tmp_path / "source.onnx", tmp_path / "blocks.onnx", _block_spec(16), {}, ["a"], True)
    assert plan == {"a": "kept in float", "b": ""}
    lean = onnx.load(str(tmp_path / "blocks.onnx"), load_external_data=False)
    w1_ref = next(i for i in lean.graph.initializer if i.name == "w1")
    assert {e.key: e.value for e in w1_ref.external_data}["location"] == "source.onnx.data"
    x = rng.standard_normal((4, 32)).astype(np.float32)
    blocked = onnxruntime.InferenceSession(str(tmp_path / "blocks.onnx"), providers=["CPUExecutionProvider"])
    h = x @ w1
    bound = np.abs(h).sum(axis=1, keepdims=True) @ (np.abs(w2).max(axis=0, keepdims=True) / 7 / 2) + 1e-5
    assert (np.abs(blocked.run(None, {"x": x})[0] - h @ w2) <= bound).all()


def test_importing_onnxruntimes_block_quantizer_leaves_the_process_logging_alone():
    """onnxruntime's matmul_nbits_quantizer runs logging.basicConfig(level=INFO) on import; the backend's import of
    it leaves the root logger's handlers and level as they were."""
    import sys

    sys.modules.pop("onnxruntime.quantization.matmul_nbits_quantizer", None)
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    assert import_block_quantizer().MatMulNBitsQuantizer is not None
    assert (list(root.handlers), root.level) == before


@given(table=st.sampled_from(["uint8", "int8", "uint16", "int4"]), activation=st.sampled_from(["uint8", "uint16"]))
def test_a_narrower_table_gets_its_outputs_type_and_a_conversion_for_its_readers(table, activation):
    """Property: a Gather table typed by a module entry gets that type (int8 is written uint8: see
    test_signed_weights_are_symmetric_and_per_channel_only_when_asked; without an override the tooling gives it the
    activation type); when it differs from the activation type, the Gather's output takes the table's type with a
    conversion to the activation type for exactly the nodes reading it, and otherwise the output gets no override."""
    spec = _spec({"scheme": "llm-a16w4", "activation_type": activation, "module_weight_types": {"embed_tokens": table}})
    got = weight_overrides(_nodes(), INITS, spec, ORIGINS)
    written = "uint8" if table == "int8" else table
    assert got.get("embed", {"quant_type": activation})["quant_type"] == written
    if written != activation:
        assert got["h0"] == {"quant_type": written, "convert": {"quant_type": activation, "recv_nodes": {"q_mm"}}}
    else:
        assert "h0" not in got


def test_an_8_bit_embedding_is_written_in_8_bits_and_converted_before_its_readers(tmp_path):
    """With the embedding at uint8 under 16-bit activations, onnxruntime's QDQ tooling writes the table as uint8 and
    puts a 16-bit Quantize/Dequantize pair (QNN's Convert) between the Gather and the node that reads it: no 16-bit
    node reads the 8-bit tensor. Before, asking for 8 bits left the table at 16."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from qnnx_backend._quantize import quantize_calibrated

    rng = np.random.default_rng(0)
    table = (rng.standard_normal((64, 16)) * 0.05).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embed", "ids"], ["h0"], name="gather"),
        helper.make_node("MatMul", ["h0", "q"], ["h1"], name="q_mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("h1", TensorProto.FLOAT, [1, 5, 64])],
        [numpy_helper.from_array(table, "embed"), numpy_helper.from_array(np.eye(16, 64, dtype=np.float32), "q")],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "f.onnx"))
    spec = _spec({"scheme": "llm-a16w4", "module_weight_types": {"embed_tokens": "uint8"}})
    names = {"uint8": QuantType.QUInt8, "uint16": QuantType.QUInt16, "int4": QuantType.QInt4}
    overrides = {}
    for name, o in weight_overrides(nodes, {"embed": (64, 16), "q": (16, 64)}, spec, ORIGINS).items():
        o = {**o, "quant_type": names[o["quant_type"]]}
        if "convert" in o:
            o["convert"] = {**o["convert"], "quant_type": names[o["convert"]["quant_type"]]}
        overrides[name] = [o]
    feeds = iter([{"ids": rng.integers(0, 64, (1, 5))} for _ in range(3)])
    reader = type("Reader", (), {"get_next": lambda self: next(feeds, None)})()
    config = get_qnn_qdq_config(
        str(tmp_path / "f.onnx"),
        reader,
        activation_type=QuantType.QUInt16,
        weight_type=QuantType.QUInt8,
        init_overrides=overrides,
    )
    quantize_calibrated(tmp_path / "f.onnx", tmp_path / "q.onnx", config, tmp_path / "ranges.json")
    q = onnx.load(str(tmp_path / "q.onnx"))
    inits = {i.name: i for i in q.graph.initializer}
    producers = {o: n for n in q.graph.node for o in n.output}
    assert inits["embed_quantized"].data_type == TensorProto.UINT8
    matmul = next(n for n in q.graph.node if n.op_type == "MatMul")
    dq = producers[matmul.input[0]]
    assert dq.op_type == "DequantizeLinear" and inits[dq.input[2]].data_type == TensorProto.UINT16
    assert producers[dq.input[0]].op_type == "QuantizeLinear" and "convert" in dq.input[0]
