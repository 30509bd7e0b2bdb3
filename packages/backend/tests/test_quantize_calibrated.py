"""The quantizer's two steps (calibration, then quantization from its ranges) write the model onnxruntime's one-call
``quantize`` writes, with the QNN tooling's configurations (the CPU EP computes the calibration)."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from qnnx_backend._quantize import quantize_calibrated


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _mlp(seed: int, hidden: int) -> onnx.ModelProto:
    """An embedding, a Linear, a Sigmoid and a Linear: weights, a table and activations to calibrate."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((32, 16)) * 0.2).astype(np.float32), "table"),
        numpy_helper.from_array((rng.standard_normal((16, hidden)) * 0.3).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((hidden, 8)) * 0.3).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h0"], name="gather"),
        helper.make_node("MatMul", ["h0", "w1"], ["h1"], name="fc1"),
        helper.make_node("Sigmoid", ["h1"], ["h2"], name="act"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _contents(path) -> tuple[list[tuple[str, str, bytes]], list[tuple[str, list[str]]]]:
    model = onnx.load(str(path))
    inits = sorted((i.name, str(i.dims), numpy_helper.to_array(i).tobytes()) for i in model.graph.initializer)
    return inits, [(n.op_type, list(n.input)) for n in model.graph.node]


@settings(deadline=None, max_examples=8)
@given(
    seed=st.integers(0, 99),
    hidden=st.integers(1, 24),
    samples=st.integers(1, 4),
    activation=st.sampled_from([QuantType.QUInt8, QuantType.QUInt16]),
    per_channel=st.booleans(),
)
def test_two_steps_write_the_same_model_as_one_call(tmp_path_factory, seed, hidden, samples, activation, per_channel):
    """Property: for any weights, calibration samples, activation type and per-channel setting, calibrating first
    and quantizing from the saved ranges writes the same initializers (bit for bit) and nodes as onnxruntime's
    quantize() in one call."""
    folder = tmp_path_factory.mktemp("calibrated")
    onnx.save_model(_mlp(seed, hidden), str(folder / "float.onnx"))
    rng = np.random.default_rng(seed)
    feeds = [{"ids": rng.integers(0, 32, (1, 6))} for _ in range(samples)]

    def config():
        return get_qnn_qdq_config(
            str(folder / "float.onnx"),
            _Reader(feeds),
            activation_type=activation,
            weight_type=QuantType.QUInt8,
            per_channel=per_channel,
        )

    quantize(str(folder / "float.onnx"), str(folder / "one.onnx"), config())
    quantize_calibrated(folder / "float.onnx", folder / "two.onnx", config(), folder / "ranges.json")
    assert _contents(folder / "two.onnx") == _contents(folder / "one.onnx")
