"""A two-input Add model as ONNX bytes, encoded by hand so this package needs no ``onnx`` dependency."""

from __future__ import annotations

import functools

# ONNX protobuf field numbers (onnx/onnx.proto3): ModelProto.ir_version=1, .graph=7, .opset_import=8;
# GraphProto.node=1, .name=2, .input=11, .output=12; NodeProto.input=1, .output=2, .name=3, .op_type=4;
# ValueInfoProto.name=1, .type=2; TypeProto.tensor_type=1; Tensor.elem_type=1, .shape=2; TensorShapeProto.dim=1;
# Dimension.dim_value=1; OperatorSetIdProto.domain=1, .version=2. FLOAT = 1.
_IR_VERSION = 8  # accepted by every onnxruntime the plugin EP supports (>= 1.24)
_OPSET = 13


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _str_field(number: int, text: str) -> bytes:
    return _bytes_field(number, text.encode())


def _float_value_info(name: str, shape: tuple[int, ...]) -> bytes:
    dims = b"".join(_bytes_field(1, _int_field(1, d)) for d in shape)
    tensor = _int_field(1, 1) + _bytes_field(2, dims)
    return _str_field(1, name) + _bytes_field(2, _bytes_field(1, tensor))


@functools.cache
def tiny_add_model() -> bytes:
    """Return ONNX bytes for ``z = x + y`` with float32 inputs of shape ``[1, 4]``: the probe's test graph."""
    node = _str_field(1, "x") + _str_field(1, "y") + _str_field(2, "z") + _str_field(3, "add") + _str_field(4, "Add")
    graph = (
        _bytes_field(1, node)
        + _str_field(2, "qnnx_probe")
        + _bytes_field(11, _float_value_info("x", (1, 4)))
        + _bytes_field(11, _float_value_info("y", (1, 4)))
        + _bytes_field(12, _float_value_info("z", (1, 4)))
    )
    opset = _str_field(1, "") + _int_field(2, _OPSET)
    return _int_field(1, _IR_VERSION) + _bytes_field(7, graph) + _bytes_field(8, opset)


#: Rows and columns of the weight matrix of :func:`tiny_matmul_model`.
MATMUL_SIZE = 16


def matmul_weight(row: int, column: int) -> float:
    """The weight of :func:`tiny_matmul_model` at ``[row, column]``: small values, exact in float16."""
    return ((row * 7 + column * 3) % 11 - 5) / 8


def tiny_matmul_model(batch: int) -> bytes:
    """Return ONNX bytes for ``y = x @ w``, ``x`` float32 ``[batch, 16]``, ``w`` a constant ``[16, 16]`` initializer
    (the same for every batch): graphs over one set of weights, as a decoder's buckets are."""
    import struct

    n = MATMUL_SIZE
    values = [matmul_weight(r, c) for r in range(n) for c in range(n)]
    # TensorProto: dims=1 (int64), data_type=2, name=8, raw_data=9 (little-endian); GraphProto.initializer=5.
    weight = (
        _int_field(1, n)
        + _int_field(1, n)
        + _int_field(2, 1)
        + _str_field(8, "w")
        + _bytes_field(9, struct.pack(f"<{n * n}f", *values))
    )
    node = _str_field(1, "x") + _str_field(1, "w") + _str_field(2, "y") + _str_field(3, "mm") + _str_field(4, "MatMul")
    graph = (
        _bytes_field(1, node)
        + _str_field(2, f"qnnx_probe_matmul_{batch}")
        + _bytes_field(5, weight)
        + _bytes_field(11, _float_value_info("x", (batch, n)))
        + _bytes_field(12, _float_value_info("y", (batch, n)))
    )
    opset = _str_field(1, "") + _int_field(2, _OPSET)
    return _int_field(1, _IR_VERSION) + _bytes_field(7, graph) + _bytes_field(8, opset)
