"""Which weights get which quantization: module weight types, symmetric signed weights, per-channel MatMul/Gemm."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from qnnx_backend import BackendOptions
from qnnx_backend._quantize import weight_overrides


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
    channel (axis 0 under transB), the embedding table uint16; a norm's Mul and the bias are left to the scheme."""
    got = weight_overrides(_nodes(), INITS, _spec("llm-a16w4"), ORIGINS)
    assert got == {
        "q": {"quant_type": "int4", "symmetric": True, "axis": 1},
        "head": {"quant_type": "int8", "symmetric": True, "axis": 0},
        "embed": {"quant_type": "uint16"},
    }


def test_plain_uint8_weights_need_no_override():
    """a16w8 (uint8 per tensor) is what the tooling does alone: no override."""
    assert weight_overrides(_nodes(), INITS, _spec("a16w8"), ORIGINS) == {}


@given(weight=st.sampled_from(["uint8", "int8", "uint16", "int4"]), per_channel=st.booleans())
def test_signed_weights_are_symmetric_and_per_channel_only_when_asked(weight, per_channel):
    """Property: whatever the scheme's weight type, signed weights are symmetric; an axis is set only for signed
    MatMul/Gemm weights under per_channel; unsigned weights of the scheme's own type get no override."""
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
