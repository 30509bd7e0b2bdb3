"""QDQ graphs: com.microsoft Q/DQ read like ONNX ones, the activation type is found through them, and quantized
weights decide the verdict of the ops that read them (measured on the simulator; see docs/operators.md)."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given
from onnx import TensorProto
from opcheck_graphs import const, inp, model, node

import qnnx_opcheck as oc
from qnnx_testkit.strategies import qdq_settings

_NP = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16}


def _check(m: onnx.ModelProto) -> dict[str, oc.NodeVerdict]:
    rep = oc.check_model(m, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return {v.node_name: v for v in rep.verdicts}


def _qdq_layernorm(
    activation: str = "uint16", weight: str = "uint8", per_channel: bool = False, domain: str = ""
) -> onnx.ModelProto:
    """x -> Q -> DQ -> LayerNormalization(DQ(gamma), DQ(int32 beta)) -> Q -> DQ, as onnxruntime's QNN tooling
    writes it."""
    act = _NP[activation]
    gamma_scale = np.full(8, 0.01, np.float32) if per_channel else np.array(0.01, np.float32)
    gamma_zero = np.zeros(gamma_scale.shape, _NP[weight])
    inits = [
        const("xs", 0.02),
        const("xz", 0, act),
        const("gq", np.arange(8) + 1, _NP[weight]),
        const("gs", gamma_scale),
        const("gz", gamma_zero, _NP[weight]),
        const("bq", np.arange(8), np.int32),
        const("bs", [2e-4]),
        const("bz", 0, np.int32),
        const("ys", 0.05),
        const("yz", 0, act),
    ]
    axis = {"axis": 0} if per_channel else {}
    nodes = [
        node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_q", domain=domain),
        node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="x_dq", domain=domain),
        node("DequantizeLinear", ["gq", "gs", "gz"], ["g"], name="g_dq", domain=domain, **axis),
        node("DequantizeLinear", ["bq", "bs", "bz"], ["b"], name="b_dq", domain=domain),
        node("LayerNormalization", ["xd", "g", "b"], ["ln"], name="ln", axis=-1),
        node("QuantizeLinear", ["ln", "ys", "yz"], ["lq"], name="ln_q", domain=domain),
        node("DequantizeLinear", ["lq", "ys", "yz"], ["y"], name="y_dq", domain=domain),
    ]
    extra = [("com.microsoft", 1)] if domain else []
    out = onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])
    if domain:  # ONNX cannot check or infer com.microsoft ops: build the proto directly
        graph = onnx.helper.make_graph(nodes, "g", [inp("x", [2, 4, 8])], [out], inits)
        opsets = [onnx.helper.make_opsetid("", 21), *(onnx.helper.make_opsetid(d, v) for d, v in extra)]
        return onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return model(nodes, [inp("x", [2, 4, 8])], [out], inits)


def test_layernorm_with_uint8_weights_is_supported() -> None:
    """a16w8 LayerNormalization (uint8 gamma, int32 beta) runs on QNN HTP."""
    v = _check(_qdq_layernorm("uint16", "uint8"))
    assert v["ln"].status == "supported" and v["ln"].dtype == "qdq_uint16"


def test_layernorm_with_int8_weights_is_unsupported() -> None:
    """int8 gamma (what per_channel=True with int8 weights writes) is refused by QNN HTP: unsupported."""
    for activation in ("uint8", "uint16"):
        v = _check(_qdq_layernorm(activation, "int8"))
        assert v["ln"].status == "unsupported", v["ln"]
        assert v["ln"].dtype == f"qdq_{activation}/w=int8"
        assert "int8" in (v["ln"].reason or "") and v["ln"].evidence


def test_unmeasured_weights_are_a_hazard() -> None:
    """Weights of a kind the probe never wrote (per-channel gamma) are not vouched for."""
    v = _check(_qdq_layernorm("uint16", "uint8", per_channel=True))
    assert v["ln"].status == "hazard" and "not measured" in (v["ln"].reason or "")


def test_com_microsoft_qdq_is_read_like_onnx_qdq() -> None:
    """com.microsoft Q/DQ are supported, and the op between them gets its QDQ verdict (not 'dtype unknown')."""
    v = _check(_qdq_layernorm("uint16", "uint8", domain="com.microsoft"))
    assert all(v[n].status == "supported" for n in ("x_q", "x_dq", "g_dq", "b_dq", "ln_q", "y_dq")), v
    assert v["ln"].dtype == "qdq_uint16" and v["ln"].status == "supported"
    assert v["x_q"].domain == "com.microsoft"


def test_qdq_form_not_probed_is_a_hazard() -> None:
    """An op the table never probed between DQ and Q (Mish) is a hazard, not supported on its float verdict."""
    inits = [const("s", 0.02), const("z", 0, np.uint8)]
    m = model(
        [
            node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            node("DequantizeLinear", ["q", "s", "z"], ["d"]),
            node("Mish", ["d"], ["m"]),
            node("QuantizeLinear", ["m", "s", "z"], ["y"], name="out_q"),
        ],
        [inp("x", [2, 3])],
        ["y"],
        inits,
    )
    v = _check(m)["mish"]
    assert v.status != "supported" and v.dtype == "qdq_uint8"


@given(**qdq_settings())
def test_contrib_domain_never_changes_a_verdict(activation: str, weight: str, per_channel: bool) -> None:
    """The same QDQ graph with com.microsoft Q/DQ gets the same verdict for every node as with ONNX Q/DQ."""
    std = _check(_qdq_layernorm(activation, weight, per_channel))
    ms = _check(_qdq_layernorm(activation, weight, per_channel, domain="com.microsoft"))
    assert {k: (v.status, v.dtype) for k, v in std.items()} == {k: (v.status, v.dtype) for k, v in ms.items()}
