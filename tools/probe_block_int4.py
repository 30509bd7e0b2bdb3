"""Probe whether the installed onnxruntime-qnn's HTP takes block-wise int4 weights, each form in a child process
(an untried QNN feature may kill the process).

Forms, for a MatMul [4, 256] x [256, 128] with symmetric int4 weights in blocks of 32 or 64 (onnxruntime's
``MatMulNBitsQuantizer``), each with and without the ``enable_block_quant_weight_optimization`` provider option:

- ``matmulnbits``: the weight-only ``MatMulNBits`` op (float activations);
- ``dq_float``: block-wise ``DequantizeLinear`` of the weights before a float ``MatMul`` (float activations);
- ``dq_qdq``: the same inside a QDQ graph: the activations quantized to uint16 around the MatMul;
- ``ort_qdq``: the form qnnx builds: ``MatMulNBitsQuantizer``'s block-wise weights, then onnxruntime's QNN QDQ
  tooling (``get_qnn_qdq_config`` + ``quantize``, uint16 activations calibrated on the input) around them, for
  blocks of 16, 32, 64 and 128 and for K = 256 and K = 200 (which no block size divides: the last block is short).

Prints one JSON line per case: whether a session without CPU fallback was created, and the SQNR (dB) of the
CPU EP's and QNN's outputs against the float32 product.

    python tools/probe_block_int4.py [form ...]
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

K, N, M = 256, 128, 4


def _model(form: str, block: int, k: int = K) -> object:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    weights = (np.random.default_rng(0).standard_normal((k, N)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
        [numpy_helper.from_array(weights, "W")],
    )
    fmt = QuantFormat.QOperator if form == "matmulnbits" else QuantFormat.QDQ
    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, quant_format=fmt)
    quantizer = MatMulNBitsQuantizer(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), algo_config=config
    )
    quantizer.process()
    model = quantizer.model.model
    if form == "dq_qdq":  # uint16 Q/DQ on the MatMul's input and output
        g = model.graph
        matmul = next(n for n in g.node if n.op_type == "MatMul")
        for name, scale in (("x", 4.5 / 32000), ("y", 3.0 / 32000)):
            g.initializer.extend(
                [
                    numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                    numpy_helper.from_array(np.array(32768, np.uint16), f"{name}_z"),
                ]
            )
        matmul.input[0], matmul.output[0] = "x_dq", "y_f"
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"]),
            *g.node,
            helper.make_node("QuantizeLinear", ["y_f", "y_s", "y_z"], ["y_q"]),
            helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"]),
        ]
        del g.node[:]
        g.node.extend(nodes)
    if form == "ort_qdq":
        model = _ort_qdq(model, k)
    onnx.checker.check_model(model)
    return model, weights


def _ort_qdq(model: object, k: int) -> object:
    """onnxruntime's QNN QDQ tooling around a model whose MatMul weights are already block-wise."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader:
        def __init__(self) -> None:
            self.feeds = iter(
                [{"x": np.random.default_rng(2 + i).standard_normal((M, k)).astype(np.float32)} for i in range(4)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder, "blocks.onnx"), Path(folder, "qdq.onnx")
        onnx.save_model(model, str(source))  # type: ignore[arg-type]
        config = get_qnn_qdq_config(str(source), Reader(), activation_type=QuantType.QUInt16)
        quantize(str(source), out, config)
        return onnx.load(str(out))


def child(form: str, block: int, option: bool, k: int = K) -> None:
    import onnxruntime

    import qnnx_detection

    model, weights = _model(form, block, k)
    data = model.SerializeToString()  # type: ignore[attr-defined]
    x = np.random.default_rng(1).standard_normal((M, k)).astype(np.float32)
    ref = x @ weights

    def sqnr(v: np.ndarray) -> float:
        return round(float(10 * np.log10((ref**2).sum() / ((v - ref) ** 2).sum())), 2)

    cpu = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result: dict[str, object] = {"form": form, "block": block, "k": k, "option": option, "cpu_sqnr": sqnr(cpu)}
    result["ops"] = sorted(
        {
            f"{n.op_type}{'(block)' if any(a.name == 'block_size' for a in n.attribute) else ''}"
            for n in model.graph.node
        }
    )  # type: ignore[attr-defined]
    options = {"enable_block_quant_weight_optimization": "1"} if option else {}
    try:
        session = qnnx_detection.create_session(data, "npu", soc_model=60, provider_options=options)
        result.update(session="created", qnn_sqnr=sqnr(session.run(None, {"x": x})[0]))
    except Exception as exc:
        result.update(session="refused", error=str(exc).splitlines()[0][:160])
    print(json.dumps(result))


def _cases() -> list[tuple[str, int, bool, int]]:
    cases = [(f, b, o, K) for f in ("matmulnbits", "dq_float", "dq_qdq") for b in (32, 64) for o in (False, True)]
    return cases + [("ort_qdq", b, False, k) for k in (K, 200) for b in (16, 32, 64, 128)]


def main() -> int:
    only = sys.argv[1:]  # optional: the forms to probe
    for form, block, option, k in _cases():
        if only and form not in only:
            continue
        args = [sys.executable, __file__, "--child", form, str(block), str(int(option)), str(k)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        died = {"form": form, "block": block, "k": k, "option": option, "session": f"child died ({proc.returncode})"}
        print(lines[-1] if lines else json.dumps(died))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5]))
        sys.exit(0)
    sys.exit(main())
