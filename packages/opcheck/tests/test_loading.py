"""Reading models: bad inputs get clear errors, weights are never loaded, functions are inlined."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from opcheck_graphs import const, inp, model, node

import qnnx_opcheck as oc
from qnnx_opcheck import errors


def _big_weight_model() -> onnx.ModelProto:
    """MatMul with a 64x64 constant weight (large enough to be stored externally)."""
    w = const("w", np.random.default_rng(0).standard_normal((64, 64)))
    return model([node("MatMul", ["x", "w"], ["y"])], [inp("x", [2, 64])], ["y"], [w])


def test_missing_file() -> None:
    """A path that does not exist raises ModelLoadError naming the path."""
    with pytest.raises(errors.ModelLoadError, match=r"nope\.onnx.*no such file"):
        oc.check_model("/tmp/definitely/nope.onnx")


def test_empty_file(tmp_path: Path) -> None:
    """An empty file raises ModelLoadError saying it is empty."""
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(errors.ModelLoadError, match="empty"):
        oc.check_model(p)


def test_empty_bytes() -> None:
    """Empty bytes raise ModelLoadError."""
    with pytest.raises(errors.ModelLoadError, match="empty"):
        oc.check_model(b"")


def test_garbage_file(tmp_path: Path) -> None:
    """A file that is not a protobuf raises ModelLoadError (a ValueError) naming the cause."""
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\xff\xfe this is not onnx \x00\x01" * 10)
    with pytest.raises(errors.ModelLoadError, match=r"junk\.onnx") as info:
        oc.check_model(p)
    assert isinstance(info.value, ValueError)


def test_protobuf_that_is_not_a_model(tmp_path: Path) -> None:
    """A valid protobuf without graph/opset is rejected as not an ONNX model."""
    p = tmp_path / "tensor.onnx"
    p.write_bytes(const("t", [1.0, 2.0]).SerializeToString())
    with pytest.raises(errors.ModelLoadError, match=r"not an ONNX model|not an ONNX protobuf|not valid"):
        oc.check_model(p)


def test_invalid_graph_is_rejected() -> None:
    """A graph that fails the ONNX checker (node input never produced) raises ModelLoadError."""
    m = model([node("Relu", ["x"], ["y"])], [inp("x", [2])], ["y"])
    m.graph.node[0].input[0] = "ghost"
    with pytest.raises(errors.ModelLoadError, match="not valid ONNX"):
        oc.check_model(m)


def test_directory_is_rejected(tmp_path: Path) -> None:
    """A directory path raises ModelLoadError."""
    with pytest.raises(errors.ModelLoadError, match="directory"):
        oc.check_model(tmp_path)


def test_wrong_type_is_rejected() -> None:
    """An object that is not a model, bytes or a path raises ModelLoadError naming the accepted types."""
    with pytest.raises(errors.ModelLoadError, match="ModelProto"):
        oc.check_model(12345)  # type: ignore[arg-type]


def test_external_data_is_not_loaded(tmp_path: Path) -> None:
    """A model whose external data file is missing is still checked; a note says the file is missing."""
    m = _big_weight_model()
    path = tmp_path / "m.onnx"
    onnx.save_model(
        m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=0
    )
    assert (tmp_path / "m.data").exists()
    ok = oc.check_model(path, onnxruntime_qnn="2.7.0")
    assert ok.supported
    assert not any("missing" in n for n in ok.notes)
    (tmp_path / "m.data").unlink()
    rep = oc.check_model(path, onnxruntime_qnn="2.7.0")
    assert rep.supported
    assert any("m.data" in n and "missing" in n for n in rep.notes)


def test_local_functions_are_inlined() -> None:
    """Nodes inside a model-local function are checked as the ops they contain."""
    fn = helper.make_function(
        "local",
        "Act",
        ["a"],
        ["b"],
        [helper.make_node("Erf", ["a"], ["b"], name="inner_erf")],
        [helper.make_opsetid("", 21)],
    )
    g = helper.make_graph(
        [helper.make_node("Act", ["x"], ["y"], domain="local", name="call")],
        "g",
        [inp("x", [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)], functions=[fn], ir_version=10
    )
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0")
    assert [v.op_type for v in rep.verdicts] == ["Erf"]
    assert not rep.supported


def test_large_graph_is_checked(tmp_path: Path) -> None:
    """A 10,000-node chain with external weights is checked without error (speed is a benchmark, not a test)."""
    nodes, inits = [], []
    prev = "x"
    for i in range(5000):
        inits.append(const(f"b{i}", np.full((16,), i, np.float32)))
        nodes.append(node("Add", [prev, f"b{i}"], [f"a{i}"], name=f"add{i}"))
        nodes.append(node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    g = helper.make_graph(
        nodes, "big", [inp("x", [4, 16])], [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [4, 16])], inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path = tmp_path / "big.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="big.data", size_threshold=0)
    rep = oc.check_model(path, onnxruntime_qnn="2.7.0")
    assert len(rep.verdicts) == 10_000
    assert rep.supported
