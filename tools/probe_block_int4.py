"""Probe whether the installed onnxruntime-qnn's HTP takes block-wise int4 weights, each form in a child process
(an untried QNN feature may kill the process).

Forms, for a MatMul [4, 256] x [256, 128] with symmetric int4 weights in blocks of 32 or 64 (onnxruntime's
``MatMulNBitsQuantizer``), each with and without the ``enable_block_quant_weight_optimization`` provider option:

- ``matmulnbits``: the weight-only ``MatMulNBits`` op (float activations);
- ``dq_float``: block-wise ``DequantizeLinear`` of the weights before a float ``MatMul`` (float activations);
- ``dq_qdq``: the same inside a QDQ graph: the activations quantized to uint16 around the MatMul.

Prints one JSON line per case: whether a session without CPU fallback was created, and the SQNR (dB) of the
CPU EP's and QNN's outputs against the float32 product.

    python tools/probe_block_int4.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

K, N, M = 256, 128, 4


def _model(form: str, block: int) -> object:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    weights = (np.random.default_rng(0).standard_normal((K, N)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
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
    onnx.checker.check_model(model)
    return model, weights


def child(form: str, block: int, option: bool) -> None:
    import onnxruntime

    import qnnx_detection

    model, weights = _model(form, block)
    data = model.SerializeToString()  # type: ignore[attr-defined]
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    ref = x @ weights

    def sqnr(v: np.ndarray) -> float:
        return round(float(10 * np.log10((ref**2).sum() / ((v - ref) ** 2).sum())), 2)

    cpu = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result: dict[str, object] = {"form": form, "block": block, "option": option, "cpu_sqnr": sqnr(cpu)}
    options = {"enable_block_quant_weight_optimization": "1"} if option else {}
    try:
        session = qnnx_detection.create_session(data, "npu", soc_model=60, provider_options=options)
        result.update(session="created", qnn_sqnr=sqnr(session.run(None, {"x": x})[0]))
    except Exception as exc:
        result.update(session="refused", error=str(exc).splitlines()[0][:160])
    print(json.dumps(result))


def main() -> int:
    for form in ("matmulnbits", "dq_float", "dq_qdq"):
        for block in (32, 64):
            for option in (False, True):
                args = [sys.executable, __file__, "--child", form, str(block), str(int(option))]
                proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                died = {"form": form, "block": block, "option": option, "session": f"child died ({proc.returncode})"}
                print(lines[-1] if lines else json.dumps(died))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        sys.exit(0)
    sys.exit(main())
