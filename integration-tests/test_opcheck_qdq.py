"""qnnx-opcheck on QDQ models written by onnxruntime's QNN quantization tooling agrees with the QNN EP.

Each model is quantized with ``get_qnn_qdq_config`` + ``quantize`` (uint8 and uint16 activations, uint8 and
per-channel int8 weights, standard and com.microsoft Q/DQ), checked by ``qnnx_opcheck.check_model``, and loaded on
QNN HTP (the simulator) in a child process with CPU fallback allowed and graph-I/O quantization kept on QNN; ORT's
own assignment record says where each node went. The one outcome that must never happen: a node opcheck calls
supported lands on the CPU EP, or the session fails.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck
from qnnx_testkit.strategies import qdq_settings, seeds

pytest.importorskip("onnxruntime_qnn")

_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
import onnxruntime_qnn as oq

ort.set_default_logger_severity(3)
ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
dev = next(d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name())
so = ort.SessionOptions()
so.log_severity_level = 3
so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
# Graph-I/O Q/DQ would otherwise be handed to the CPU EP by design, whatever QNN can take.
opts = {"backend_path": oq.get_qnn_htp_path(), "soc_model": "60", "offload_graph_io_quantization": "0"}
so.add_provider_for_devices([dev], opts)
try:
    session = ort.InferenceSession(sys.argv[1], sess_options=so)
    feeds = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}
    session.run(None, feeds)
except Exception as exc:
    print(json.dumps({"error": str(exc)[-500:]}))
    sys.exit(0)
placement = {n.name: g.ep_name for g in session.get_provider_graph_assignment_info() for n in g.get_nodes()}
print(json.dumps({"placement": placement}))
"""

_QTYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}


def _model(
    nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x_shape: list[int], opset: int
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def _mlp(opset: int = 21) -> onnx.ModelProto:
    """MatMul -> Add -> Gelu -> LayerNormalization -> Reshape -> Gemm: a transformer block's MLP in miniature."""
    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(32).astype(np.float32) * 0.1,
        "g": rng.uniform(0.5, 1.5, 32).astype(np.float32),
        "beta": rng.standard_normal(32).astype(np.float32) * 0.1,
        "shape": np.array([4, 32], np.int64),
        "w2": rng.standard_normal((32, 8)).astype(np.float32) * 0.3,
        "b2": rng.standard_normal(8).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="matmul"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add"),
        helper.make_node("Gelu", ["h1"], ["h2"], name="gelu"),
        helper.make_node("LayerNormalization", ["h2", "g", "beta"], ["h3"], axis=-1, name="layernorm"),
        helper.make_node("Reshape", ["h3", "shape"], ["h4"], name="reshape"),
        helper.make_node("Gemm", ["h4", "w2", "b2"], ["y"], name="gemm"),
    ]
    return _model(nodes, inits, [2, 2, 16], opset)


def _cnn(opset: int = 21) -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Conv -> Sigmoid -> Mul -> GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(1)
    inits = {
        "k1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "c1": rng.standard_normal(8).astype(np.float32) * 0.1,
        "k2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
        "w": rng.standard_normal((8, 4)).astype(np.float32) * 0.3,
        "b": rng.standard_normal(4).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "k1", "c1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
        helper.make_node("Conv", ["p", "k2"], ["c"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["c", "s"], ["m"], name="silu"),
        helper.make_node("GlobalAveragePool", ["m"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w", "b"], ["l"], name="fc"),
        helper.make_node("Softmax", ["l"], ["y"], name="softmax"),
    ]
    return _model(nodes, inits, [1, 3, 8, 8], opset)


def _quantize(model: onnx.ModelProto, folder: Path, activation: str, weight: str, per_channel: bool) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(2)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    src, out = folder / "float.onnx", folder / "qdq.onnx"
    onnx.save(model, src)
    logging.getLogger().setLevel(logging.ERROR)  # the tooling warns about pre-processing on every call
    config = get_qnn_qdq_config(
        str(src),
        Reader(),
        activation_type=getattr(QuantType, _QTYPES[activation]),
        weight_type=getattr(QuantType, _QTYPES[weight]),
        per_channel=per_channel,
    )
    quantize(str(src), str(out), config)
    return out


# Verdict kinds that say the session itself fails (or the process dies), CPU fallback or not.
_FATAL = ("session_error", "finalize_error", "crash", "error")


def _on_qnn(path: Path) -> dict[str, str] | str:
    """ORT's placement of every node ({name: EP}), or the error of a session that failed with CPU fallback."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        return f"the QNN child died (rc {proc.returncode}): {proc.stderr[-1500:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result.get("error") or result["placement"]


def _assert_agrees(path: Path) -> qnnx_opcheck.OpCheckReport:
    """No node opcheck calls supported goes to the CPU EP, and the session fails only when opcheck says a node
    makes it fail; returns the report."""
    report = qnnx_opcheck.check_model(str(path), "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    placement = _on_qnn(path)
    if isinstance(placement, str):
        fatal = [v for v in report.verdicts if v.kind in _FATAL]
        assert fatal, f"the session failed with CPU fallback allowed, and opcheck did not say so: {placement}"
        return report
    # The layout transformer renames the nodes it rewrites to NHWC ("conv1" -> "conv1_token_1").
    elsewhere = {re.sub(r"_token_\d+$", "", n) for n, ep in placement.items() if ep != "QNNExecutionProvider"}
    wrong = [
        f"{v.op_type} '{v.node_name}' ({v.dtype})"
        for v in report.verdicts
        if v.status == "supported" and v.node_name in elsewhere
    ]
    assert not wrong, f"supported by opcheck, placed elsewhere: {wrong}; placement {placement}"
    if any(
        v.status == "supported" and v.op_type not in ("QuantizeLinear", "DequantizeLinear") for v in report.verdicts
    ):
        assert "QNNExecutionProvider" in placement.values(), placement
    return report


CONFIGS = [
    ("mlp", _mlp, 21, "uint8", "uint8", False),
    ("mlp", _mlp, 21, "uint16", "uint8", False),
    ("mlp", _mlp, 21, "uint8", "int8", True),
    ("mlp", _mlp, 21, "uint16", "int8", True),
    ("mlp", _mlp, 20, "uint16", "uint8", False),  # com.microsoft Q/DQ
    ("cnn", _cnn, 21, "uint8", "uint8", False),
    ("cnn", _cnn, 21, "uint16", "uint8", False),
    ("cnn", _cnn, 21, "uint16", "int8", True),
    ("cnn", _cnn, 20, "uint16", "uint8", False),  # com.microsoft Q/DQ
]


@pytest.mark.parametrize(
    ("name", "build", "opset", "activation", "weight", "per_channel"),
    CONFIGS,
    ids=[f"{c[0]}-opset{c[2]}-a{c[3]}-w{c[4]}{'-pc' if c[5] else ''}" for c in CONFIGS],
)
def test_opcheck_agrees_with_qnn_on_quantized_models(
    tmp_path: Path,
    name: str,
    build: Callable[[int], onnx.ModelProto],
    opset: int,
    activation: str,
    weight: str,
    per_channel: bool,
) -> None:
    """A model quantized by onnxruntime's QNN tooling: every node opcheck supports runs on QNN HTP."""
    path = _quantize(build(opset), tmp_path, activation, weight, per_channel)
    report = _assert_agrees(path)
    qdq = [v for v in report.verdicts if v.op_type in ("QuantizeLinear", "DequantizeLinear")]
    # Q/DQ are refused only with the op they wrap (its node unit goes to the CPU EP as a whole).
    assert qdq and all(v.status == "supported" or "node unit" in (v.reason or "") for v in qdq), [
        (v.node_name, v.reason) for v in qdq
    ]
    ops = [v for v in report.verdicts if v.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert all(v.dtype is not None and v.dtype.startswith("qdq_") for v in ops), [(v.node_name, v.dtype) for v in ops]
    if opset < 21:
        model = onnx.load(str(path))
        assert any(n.domain == "com.microsoft" for n in model.graph.node), "expected com.microsoft Q/DQ"


def test_int8_layernorm_weights_are_refused(tmp_path: Path) -> None:
    """LayerNormalization with an int8 scale (what per_channel int8 writes) is unsupported, as QNN refuses it."""
    path = _quantize(_mlp(), tmp_path, "uint16", "int8", True)
    report = _assert_agrees(path)
    ln = next(v for v in report.verdicts if v.op_type == "LayerNormalization")
    assert ln.status == "unsupported" and "int8" in (ln.dtype or "") + (ln.reason or ""), ln
    placement = _on_qnn(path)
    assert isinstance(placement, dict) and placement["layernorm"] == "CPUExecutionProvider", placement


_CHAIN_OPS = ("Relu", "Sigmoid", "Tanh", "Softmax", "Gelu", "Transpose", "AddConst", "MulConst", "MatMul", "LayerNorm")


def _chain(ops: list[str], seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes = []
    cur = "x"
    for i, op in enumerate(ops):
        out = f"t{i}"
        if op == "Transpose":
            nodes.append(helper.make_node("Transpose", [cur], [out], perm=[0, 2, 1], name=f"n{i}"))
        elif op in ("AddConst", "MulConst"):
            inits[f"c{i}"] = rng.uniform(0.5, 1.5, 8).astype(np.float32)
            nodes.append(helper.make_node(op[:3], [cur, f"c{i}"], [out], name=f"n{i}"))
        elif op == "MatMul":
            inits[f"w{i}"] = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
            nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [out], name=f"n{i}"))
        elif op == "LayerNorm":
            inits[f"g{i}"] = rng.uniform(0.5, 1.5, 8).astype(np.float32)
            inits[f"b{i}"] = rng.standard_normal(8).astype(np.float32) * 0.1
            nodes.append(helper.make_node("LayerNormalization", [cur, f"g{i}", f"b{i}"], [out], axis=-1, name=f"n{i}"))
        else:
            nodes.append(helper.make_node(op, [cur], [out], name=f"n{i}"))
        cur = out
    return _model(nodes, inits, [2, 8, 8], 21)


# How a random chain is quantized: activation type, weight type, per-channel weights, the weights' seed.
_QUANTIZED = {**qdq_settings(), "seed": seeds(3)}


@given(ops=st.lists(st.sampled_from(_CHAIN_OPS), min_size=2, max_size=4), **_QUANTIZED)
def test_opcheck_agrees_with_qnn_on_random_quantized_chains(
    tmp_path_factory: pytest.TempPathFactory, ops: list[str], activation: str, weight: str, per_channel: bool, seed: int
) -> None:
    """Random short op chains, quantized by onnxruntime's QNN tooling: every node opcheck supports runs on QNN."""
    _assert_agrees(_quantize(_chain(ops, seed), tmp_path_factory.mktemp("chain"), activation, weight, per_channel))


_IMAGE_OPS = ("Conv", "MaxPool", "AveragePool", "Resize", "Split", "ReduceMean", "BatchNorm", "InstanceNorm", "Clip")


def _image_chain(ops: list[str], seed: int) -> onnx.ModelProto:
    """A chain of image ops on x[1, 4, 8, 8] that keeps the shape (so any order is valid)."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes = []
    cur = "x"
    for i, op in enumerate(ops):
        out = f"t{i}"
        if op == "Conv":
            inits[f"k{i}"] = rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
            inits[f"c{i}"] = rng.standard_normal(4).astype(np.float32) * 0.1
            nodes.append(helper.make_node("Conv", [cur, f"k{i}", f"c{i}"], [out], pads=[1, 1, 1, 1], name=f"n{i}"))
        elif op in ("MaxPool", "AveragePool"):
            nodes.append(helper.make_node(op, [cur], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name=f"n{i}"))
        elif op == "Resize":  # 2x nearest up, then a 2x2 max pool back down
            inits[f"r{i}"] = np.array([1, 1, 2, 2], np.float32)
            nodes.append(helper.make_node("Resize", [cur, "", f"r{i}"], [f"u{i}"], mode="nearest", name=f"n{i}"))
            nodes.append(
                helper.make_node("MaxPool", [f"u{i}"], [out], kernel_shape=[2, 2], strides=[2, 2], name=f"p{i}")
            )
        elif op == "Split":
            inits[f"s{i}"] = np.array([2, 2], np.int64)
            nodes.append(helper.make_node("Split", [cur, f"s{i}"], [f"a{i}", f"b{i}"], axis=1, name=f"n{i}"))
            nodes.append(helper.make_node("Concat", [f"b{i}", f"a{i}"], [out], axis=1, name=f"c{i}"))
        elif op == "ReduceMean":
            inits[f"ax{i}"] = np.array([1], np.int64)
            nodes.append(helper.make_node("ReduceMean", [cur, f"ax{i}"], [f"m{i}"], keepdims=1, name=f"n{i}"))
            nodes.append(helper.make_node("Sub", [cur, f"m{i}"], [out], name=f"d{i}"))
        elif op in ("BatchNorm", "InstanceNorm"):
            names = ("g", "b", "m", "v") if op == "BatchNorm" else ("g", "b")
            for name in names:
                inits[f"{name}{i}"] = rng.uniform(0.5, 1.5, 4).astype(np.float32)
            onnx_op = "BatchNormalization" if op == "BatchNorm" else "InstanceNormalization"
            nodes.append(helper.make_node(onnx_op, [cur, *(f"{n}{i}" for n in names)], [out], name=f"n{i}"))
        else:  # Clip
            inits[f"lo{i}"], inits[f"hi{i}"] = np.array(-1, np.float32), np.array(1, np.float32)
            nodes.append(helper.make_node("Clip", [cur, f"lo{i}", f"hi{i}"], [out], name=f"n{i}"))
        cur = out
    return _model(nodes, inits, [1, 4, 8, 8], 21)


@given(ops=st.lists(st.sampled_from(_IMAGE_OPS), min_size=2, max_size=4), **_QUANTIZED)
def test_opcheck_agrees_with_qnn_on_random_quantized_image_chains(
    tmp_path_factory: pytest.TempPathFactory, ops: list[str], activation: str, weight: str, per_channel: bool, seed: int
) -> None:
    """Random conv/pool/norm chains, quantized with any 8/16-bit weights: opcheck's verdicts agree with QNN."""
    folder = tmp_path_factory.mktemp("image")
    _assert_agrees(_quantize(_image_chain(ops, seed), folder, activation, weight, per_channel))
