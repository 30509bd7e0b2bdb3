"""Probe cases for tools/opcheck/probe.py: one small ONNX model per (op variant, dtype).

Each :class:`Variant` names an ONNX op, the model opset, the inputs, and a ``when`` condition that tells
qnnx_opcheck when the variant's results apply to a node (the checker takes the first variant whose
condition matches). The variant list is the source of the generated HTP tables; hazards that no
single-op probe can show live in :data:`PATTERNS` (multi-node probes) and in the curated patterns of
tools/opcheck/tables.py.

QDQ cases are not written by hand: the float variant is quantized by onnxruntime's QNN quantization tooling
(``get_qnn_qdq_config`` + ``quantize``, calibrated on the probe's own inputs), so each case is the form that
tooling writes for that op: float graph input -> Q -> DQ -> op -> Q -> DQ, 8-bit weights (u8, or what the key
asks), int32 biases, the fixed Sigmoid/Tanh output ranges of 16-bit activations, per-channel axes.

This module is imported by the probe and by the live-table tests; it needs numpy and onnx, and onnxruntime for the
QDQ cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Dtype keys used in the tables. "qdq_uint8"/"qdq_uint16" mean: the op's float inputs come from
# DequantizeLinear and its output goes to QuantizeLinear (the QDQ form QNN HTP runs quantized), with uint8
# per-tensor weights (the QNN tooling's default; a16w8 is qdq_uint16). "qdq_<act>/w=<type>[/per_channel]" asks
# for other weights (ops with constant weights only); the table keys cells by the weights the tooling wrote.
PLAIN_DTYPES = ("float32", "float16", "int32", "int64", "uint8", "bool")
QDQ_DTYPES = ("qdq_uint8", "qdq_uint16")
QDQ_WEIGHT_TYPES = ("uint8", "int8", "uint16", "int16", "int4")
DEFAULT_WEIGHT_TYPE = "uint8"
# The opset QDQ cases are written at: 16-bit QuantizeLinear/DequantizeLinear are standard ONNX from opset 21.
QDQ_OPSET = 21
ELEM = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8,
    "uint16": TensorProto.UINT16,
    "int16": TensorProto.INT16,
    "bool": TensorProto.BOOL,
}
NP = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "int8": np.int8,
    "uint16": np.uint16,
    "int16": np.int16,
    "bool": np.bool_,
}


@dataclasses.dataclass(frozen=True)
class D:
    """A runtime (graph input) tensor of the probed dtype, or of ``dtype`` when given."""

    shape: tuple[int, ...]
    dtype: str | None = None
    domain: str = "any"  # value range: any | pos | unit | ge1 | int


@dataclasses.dataclass(frozen=True)
class C:
    """A constant initializer. ``value`` may be a callable of the probed dtype."""

    value: Any


@dataclasses.dataclass(frozen=True)
class CT:
    """A constant initializer of the probed dtype with this shape (e.g. a weight)."""

    shape: tuple[int, ...]
    domain: str = "any"


EMPTY = "EMPTY"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One probe variant: an op with fixed inputs/attributes, run for every dtype in ``dtypes``."""

    name: str
    op: str
    inputs: tuple[Any, ...]
    attrs: dict[str, Any] | Callable[[str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    n_out: int = 1
    opset: int = 21
    when: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtypes: tuple[str, ...] = PLAIN_DTYPES
    qdq: bool = False
    domain: str = ""

    def attrs_for(self, dtype: str) -> dict[str, Any]:
        return self.attrs(dtype) if callable(self.attrs) else dict(self.attrs)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


X = (2, 3, 4)
FLOATS = ("float32", "float16")
# The element types of ai.onnx.ml's ArrayFeatureExtractor that the tables hold (its schema adds double and string).
AFE_DTYPES = ("float32", "int32", "int64")
UNARY_FLOAT = {
    "Abs": "any",
    "Neg": "any",
    "Relu": "any",
    "Sigmoid": "any",
    "Tanh": "any",
    "Exp": "any",
    "Log": "pos",
    "Sqrt": "pos",
    "Reciprocal": "pos",
    "Floor": "grid",
    "Ceil": "grid",
    "Round": "grid",
    "Sign": "grid",
    "Sin": "any",
    "Cos": "any",
    "Tan": "unit",
    "Asin": "unit",
    "Acos": "unit",
    "Atan": "any",
    "Sinh": "any",
    "Cosh": "any",
    "Atanh": "unit",
    "Asinh": "any",
    "Acosh": "ge1",
    "Erf": "any",
    "Softplus": "any",
    "Softsign": "any",
    "HardSwish": "any",
    "HardSigmoid": "any",
    "Elu": "any",
    "Selu": "any",
    "Celu": "any",
    "LeakyRelu": "any",
    "ThresholdedRelu": "any",
    "Mish": "any",
    "IsNaN": "any",
    "IsInf": "any",
    "Identity": "any",
    "Not": "any",
    "BitwiseNot": "any",
    "Shrink": "any",
    "Softmax": "any",
    "LogSoftmax": "any",
    "Hardmax": "any",
    "Dropout": "any",
}
QDQ_UNARY = {
    "Abs",
    "Neg",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
    "Atan",
    "Erf",
    "Softplus",
    "HardSwish",
    "HardSigmoid",
    "Elu",
    "LeakyRelu",
    "Softmax",
    "LogSoftmax",
    "Identity",
}
BINARY = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Mean",
    "Sum",
    "Mod",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "And",
    "Or",
    "Xor",
]
QDQ_BINARY = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Pow",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
}
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
REDUCE += ["ReduceLogSumExp", "ReduceSumSquare"]
QDQ_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}
RANK6_OPS = ["Add", "Relu", "Transpose", "Reshape", "Concat", "Softmax", "ReduceSum", "Slice", "Gather"]


def _attrs_mod(dtype: str) -> dict[str, Any]:
    return {"fmod": 1} if dtype.startswith("float") or "qdq" in dtype else {}


def _attrs_bitshift(dtype: str) -> dict[str, Any]:
    return {"direction": "LEFT"}


def _variants() -> list[Variant]:
    v: list[Variant] = []
    add = v.append
    # An opset-1 model (ONNX's own Not tests are written at opset 1).
    add(Variant("Not_opset1", "Not", (D(X),), opset=1, when={"opset": [1, 6]}, dtypes=("bool",)))
    for op, dom in UNARY_FLOAT.items():
        attrs: dict[str, Any] = {}
        inputs: tuple[Any, ...] = (D(X, domain=dom),)
        if op == "Dropout":
            attrs = {}
        add(Variant(op, op, inputs, attrs, qdq=op in QDQ_UNARY))
    add(Variant("Softmax_axis1", "Softmax", (D(X),), {"axis": 1}, when={"attr": {"axis": [1, -2]}}, qdq=True))
    add(Variant("Gelu", "Gelu", (D(X),), opset=20, qdq=True))
    add(
        Variant(
            "Gelu_tanh",
            "Gelu",
            (D(X),),
            {"approximate": "tanh"},
            opset=20,
            when={"attr": {"approximate": ["tanh"]}},
            qdq=True,
        )
    )
    add(Variant("Swish", "Swish", (D(X),), opset=24))
    add(Variant("Det", "Det", (D((2, 3, 3)),)))
    # Mod on the narrow integer types (ONNX's Mod tests run int8, int16 and uint16).
    narrow = ("int8", "int16", "uint16")
    nz = (D(X, domain="nz"), D(X, domain="nz"))
    add(Variant("Mod_narrow", "Mod", nz, _attrs_mod, when={"input_dtype": [0, list(narrow)]}, dtypes=narrow))
    for op in BINARY:
        attrs = _attrs_mod if op == "Mod" else (_attrs_bitshift if op == "BitShift" else {})
        add(Variant(op, op, (D(X, domain="nz"), D(X, domain="nz")), attrs, qdq=op in QDQ_BINARY))
    add(Variant("PRelu", "PRelu", (D(X), CT((4,))), qdq=True))
    add(Variant("Where", "Where", (D(X, "bool"), D(X), D(X)), when={}, qdq=True))
    add(Variant("Clip", "Clip", (D(X), C(lambda t: np.array(1, NP[t])), C(lambda t: np.array(3, NP[t]))), qdq=True))
    for op in REDUCE:
        add(Variant(op, op, (D(X, domain="pos"), C(_i64(1))), {"keepdims": 1}, opset=18, qdq=op in QDQ_REDUCE))
    add(Variant("ArgMax", "ArgMax", (D(X),), {"axis": 1}))
    add(Variant("ArgMin", "ArgMin", (D(X),), {"axis": 1}))
    add(Variant("TopK", "TopK", (D(X), C(_i64(2))), n_out=2))
    add(Variant("CumSum", "CumSum", (D(X), C(np.array(1, np.int64)))))
    # Shape and layout family.
    add(Variant("Transpose", "Transpose", (D(X),), {"perm": [0, 2, 1]}, qdq=True))
    add(Variant("Flatten", "Flatten", (D(X),), {"axis": 1}, qdq=True))
    add(Variant("Reshape", "Reshape", (D(X), C(_i64(6, 4))), qdq=True))
    add(Variant("Squeeze", "Squeeze", (D((2, 1, 4)), C(_i64(1))), qdq=True))
    add(Variant("Unsqueeze_rank0", "Unsqueeze", (D(()), C(_i64(0))), when={"rank": [0, 0]}))
    add(Variant("Unsqueeze_rank1", "Unsqueeze", (D((3,)), C(_i64(0))), when={"rank": [1, 1]}))
    add(Variant("Unsqueeze_out5d", "Unsqueeze", (D((2, 3, 4, 5)), C(_i64(2))), when={"output_rank": [5, 64]}))
    add(Variant("Unsqueeze", "Unsqueeze", (D(X), C(_i64(1))), qdq=True))
    add(Variant("Expand", "Expand", (D((1, 3, 4)), C(_i64(2, 3, 4))), qdq=True))
    add(Variant("Tile", "Tile", (D(X), C(_i64(1, 2, 1))), qdq=True))
    slice_in = (C(_i64(0)), C(_i64(4)), C(_i64(2)))
    add(Variant("Slice_step2", "Slice", (D(X), *slice_in, C(_i64(2))), when={"const_input_not_all": [4, 1]}, qdq=True))
    add(Variant("Slice", "Slice", (D(X), C(_i64(1)), C(_i64(3)), C(_i64(2)), C(_i64(1))), qdq=True))
    add(Variant("Split", "Split", (D(X), C(_i64(2, 2))), {"axis": 2}, n_out=2, qdq=True))
    add(Variant("Concat", "Concat", (D(X), D(X)), {"axis": 1}, qdq=True))
    add(
        Variant(
            "Gather_dynidx",
            "Gather",
            (D(X), D((2,), "int64", "idx")),
            {"axis": 1},
            when={"dynamic_inputs": [1]},
            qdq=True,
        )
    )
    add(
        Variant(
            "Gather_i32idx",
            "Gather",
            (D(X), C(np.array([0, 2], np.int32))),
            {"axis": 1},
            when={"input_dtype": [1, ["int32"]]},
        )
    )
    add(Variant("Gather", "Gather", (D(X), C(_i64(0, 2))), {"axis": 1}, qdq=True))
    add(Variant("GatherElements", "GatherElements", (D(X), C(np.zeros((2, 3, 2), np.int64))), {"axis": 2}))
    add(Variant("GatherND", "GatherND", (D(X), C(np.array([[0, 1], [1, 2]], np.int64)))))
    add(Variant("ScatterND", "ScatterND", (D(X), C(np.array([[0], [1]], np.int64)), D((2, 3, 4)))))
    add(
        Variant(
            "ScatterElements", "ScatterElements", (D(X), C(np.zeros((2, 3, 1), np.int64)), D((2, 3, 1))), {"axis": 2}
        )
    )
    add(
        Variant(
            "Pad_reflect",
            "Pad",
            (D(X), C(_i64(0, 0, 1, 0, 0, 1))),
            {"mode": "reflect"},
            when={"attr": {"mode": ["reflect"]}},
        )
    )
    add(
        Variant(
            "Pad_edge", "Pad", (D(X), C(_i64(0, 0, 1, 0, 0, 1))), {"mode": "edge"}, when={"attr": {"mode": ["edge"]}}
        )
    )
    add(Variant("Pad", "Pad", (D(X), C(_i64(0, 0, 1, 0, 0, 1))), qdq=True))
    img = (1, 4, 4, 4)
    sc = C(np.array([1, 1, 2, 2], np.float32))
    add(
        Variant(
            "Resize_nearest",
            "Resize",
            (D(img), EMPTY, sc),
            {"mode": "nearest"},
            when={"attr": {"mode": ["nearest"]}},
            qdq=True,
        )
    )
    add(Variant("Resize_cubic", "Resize", (D(img), EMPTY, sc), {"mode": "cubic"}, when={"attr": {"mode": ["cubic"]}}))
    add(Variant("Resize_linear", "Resize", (D(img), EMPTY, sc), {"mode": "linear"}, qdq=True))
    add(Variant("DepthToSpace", "DepthToSpace", (D(img),), {"blocksize": 2}, qdq=True))
    add(Variant("SpaceToDepth", "SpaceToDepth", (D(img),), {"blocksize": 2}, qdq=True))
    add(Variant("Shape", "Shape", (D(X),)))
    add(Variant("Size", "Size", (D(X),)))
    add(Variant("NonZero", "NonZero", (D(X),)))
    for to in ("float32", "float16", "int32", "int64", "bool", "uint8"):
        # Non-negative inputs: float -> unsigned casts of negative values are undefined in ONNX.
        add(
            Variant(
                f"Cast_to_{to}", "Cast", (D(X, domain="gridpos"),), {"to": ELEM[to]}, when={"attr": {"to": [ELEM[to]]}}
            )
        )
    add(Variant("CastLike", "CastLike", (D(X), C(np.array([1.0], np.float32)))))
    add(
        Variant(
            "OneHot", "OneHot", (D((3,), domain="idx"), C(np.array(4, np.int64)), C(np.array([0.0, 1.0], np.float32)))
        )
    )
    add(Variant("Range", "Range", (D((), domain="zero"), D((), domain="five"), D((), domain="one"))))
    add(
        Variant(
            "ConstantOfShape",
            "ConstantOfShape",
            (D((2,), "int64", "idx"),),
            lambda t: {"value": numpy_helper.from_array(np.array([1], NP[t]))},
        )
    )
    add(Variant("Trilu", "Trilu", (D(X),)))
    add(Variant("Einsum", "Einsum", (D((2, 3)), D((3, 4))), {"equation": "ij,jk->ik"}))
    # Linear algebra and NN.
    add(Variant("MatMul_constW", "MatMul", (D(X), CT((4, 5))), when={"const_inputs": [1]}, qdq=True))
    add(Variant("MatMul", "MatMul", (D(X), D((2, 4, 5))), qdq=True))
    add(Variant("Gemm", "Gemm", (D((2, 3)), CT((3, 4)), CT((4,))), qdq=True))
    add(Variant("Conv1d", "Conv", (D((1, 3, 8)), CT((4, 3, 3)), CT((4,))), when={"rank": [3, 3]}, qdq=True))
    add(Variant("Conv3d", "Conv", (D((1, 3, 4, 4, 4)), CT((4, 3, 3, 3, 3)), CT((4,))), when={"rank": [5, 5]}))
    add(Variant("Conv", "Conv", (D((1, 3, 8, 8)), CT((4, 3, 3, 3)), CT((4,))), qdq=True))
    add(Variant("ConvTranspose", "ConvTranspose", (D((1, 3, 4, 4)), CT((3, 4, 3, 3))), qdq=True))
    bn = tuple(CT((3,), domain="pos") for _ in range(4))
    add(Variant("BatchNormalization", "BatchNormalization", (D((1, 3, 4, 4)), *bn), qdq=True))
    add(Variant("InstanceNormalization", "InstanceNormalization", (D((1, 3, 4, 4)), CT((3,)), CT((3,))), qdq=True))
    add(Variant("LayerNormalization", "LayerNormalization", (D(X), CT((4,)), CT((4,))), {"axis": -1}, qdq=True))
    gn = (D((1, 4, 4, 4)), CT((4,)), CT((4,)))
    add(
        Variant(
            "GroupNormalization_18",
            "GroupNormalization",
            (D((1, 4, 4, 4)), CT((2,)), CT((2,))),
            {"num_groups": 2},
            opset=18,
            when={"opset": [18, 20]},
        )
    )
    add(
        Variant(
            "GroupNormalization_dynscale",
            "GroupNormalization",
            (D((1, 4, 4, 4)), D((4,)), D((4,))),
            {"num_groups": 2},
            when={"dynamic_inputs": [1]},
        )
    )
    add(Variant("GroupNormalization", "GroupNormalization", gn, {"num_groups": 2}, qdq=True))
    add(
        Variant(
            "GroupNormalization_x1", "GroupNormalization", (D((2, 32, 8, 8)), CT((32,)), CT((32,))), {"num_groups": 8}
        )
    )
    add(Variant("GroupNormalization_x2", "GroupNormalization", (D((1, 4, 16)), CT((4,)), CT((4,))), {"num_groups": 2}))
    add(
        Variant("GroupNormalization_x3", "GroupNormalization", (D((1, 4, 4, 4)), CT((4,)), CT((4,))), {"num_groups": 4})
    )
    add(
        Variant("GroupNormalization_x4", "GroupNormalization", (D((1, 4, 4, 4)), CT((4,)), CT((4,))), {"num_groups": 1})
    )
    add(Variant("RMSNormalization", "RMSNormalization", (D(X), CT((4,))), {"axis": -1}, opset=23, qdq=True))
    add(Variant("LpNormalization", "LpNormalization", (D(X),), {"axis": -1, "p": 2}, qdq=True))
    add(Variant("LRN", "LRN", (D((1, 3, 4, 4)),), {"size": 3}))
    pool = {"kernel_shape": [2, 2]}
    add(Variant("MaxPool3d", "MaxPool", (D((1, 2, 4, 4, 4)),), {"kernel_shape": [2, 2, 2]}, when={"rank": [5, 5]}))
    add(Variant("MaxPool", "MaxPool", (D((1, 3, 4, 4)),), pool, qdq=True))
    add(Variant("AveragePool", "AveragePool", (D((1, 3, 4, 4)),), pool, qdq=True))
    add(Variant("GlobalAveragePool", "GlobalAveragePool", (D((1, 3, 4, 4)),), qdq=True))
    add(Variant("GlobalMaxPool", "GlobalMaxPool", (D((1, 3, 4, 4)),), qdq=True))
    add(Variant("LpPool", "LpPool", (D((1, 3, 4, 4)),), {**pool, "p": 2}))
    rope_x, rope_ids = D((2, 4, 3, 8)), D((2, 3), "int64", "idx")
    rope = (rope_x, D((50, 4)), D((50, 4)), rope_ids)
    add(
        Variant(
            "RotaryEmbedding_interleaved",
            "RotaryEmbedding",
            rope,
            {"interleaved": 1},
            opset=23,
            when={"attr": {"interleaved": [1]}},
            dtypes=FLOATS,
        )
    )
    add(
        Variant(
            "RotaryEmbedding_3d",
            "RotaryEmbedding",
            (D((2, 3, 32)), *rope[1:]),
            {"num_heads": 4},
            opset=23,
            when={"rank": [3, 3]},
            dtypes=FLOATS,
        )
    )
    add(
        Variant(
            "RotaryEmbedding_partial",
            "RotaryEmbedding",
            (rope_x, D((50, 2)), D((50, 2)), rope_ids),
            {"rotary_embedding_dim": 4},
            opset=23,
            when={"attr": {"rotary_embedding_dim": [4]}},
            dtypes=FLOATS,
        )
    )
    add(Variant("RotaryEmbedding", "RotaryEmbedding", rope, opset=23, dtypes=FLOATS))
    # SwiGLU (opset 28) has no QNN builder either: onnxruntime expands it into Swish and Mul. The CPU EP has no
    # kernel to compare with, so the probe shows that the QNN EP takes it; ONNX's node tests (test_swiglu*, against
    # their expected outputs) show it right.
    add(Variant("SwiGLU", "SwiGLU", (D(X), D(X)), opset=28, dtypes=FLOATS))
    # Opset 16: the CPU EP has no RoiAlign-22 kernel to compare with (22 only adds bfloat16).
    roi = (D((2, 1, 10, 10)), D((3, 4), domain="pos"), D((3,), "int64", "idx"))
    roi_attrs = {"output_height": 5, "output_width": 5, "sampling_ratio": 2}
    add(
        Variant(
            "RoiAlign_max",
            "RoiAlign",
            roi,
            {**roi_attrs, "mode": "max"},
            opset=16,
            when={"attr": {"mode": ["max"]}},
            dtypes=FLOATS,
        )
    )
    add(Variant("RoiAlign", "RoiAlign", roi, roi_attrs, opset=16, dtypes=FLOATS))
    # NegativeLogLikelihoodLoss has no QNN builder: onnxruntime expands the ONNX function into its body
    # (Unsqueeze, GatherElements on the targets, Where for ignore_index, Gather of the weights, ReduceSum, Div) and
    # the QNN EP takes the body. Its targets are class indices in [0, C) or ignore_index by the op's definition, so
    # the body's GatherElements reads no negative index. The body's int64 Unsqueeze of the targets is 5-D at rank 5.
    nll = {"reduction": "mean", "ignore_index": 1}
    nll_in = (D((2, 3, 2, 2)), D((2, 2, 2), "int64", "idx"), D((3,), domain="pos"))
    nll_5d = (D((2, 3, 2, 2, 2)), D((2, 2, 2, 2), "int64", "idx"))
    add(Variant("NLLLoss_rank5", "NegativeLogLikelihoodLoss", nll_5d, when={"rank": [5, 64]}, opset=22, dtypes=FLOATS))
    for red in ("none", "sum"):
        add(
            Variant(
                f"NLLLoss_{red}",
                "NegativeLogLikelihoodLoss",
                nll_in,
                {**nll, "reduction": red},
                opset=22,
                when={"attr": {"reduction": [red]}},
                dtypes=FLOATS,
            )
        )
    add(Variant("NLLLoss", "NegativeLogLikelihoodLoss", nll_in, nll, opset=22, dtypes=FLOATS))
    add(Variant("GridSample", "GridSample", (D((1, 2, 4, 4)), D((1, 3, 3, 2), domain="unit"))))
    # ai.onnx.ml (opset 1 of that domain): the types its schema allows besides double and string. The shape classes
    # (rank, unit dims, runtime or negative indices) are measured by tools/opcheck/conformance.py.
    afe = (D((3, 4)), C(_i64(0, 3, 3)))
    add(Variant("ArrayFeatureExtractor", "ArrayFeatureExtractor", afe, domain="ai.onnx.ml", dtypes=AFE_DTYPES))
    qkv = tuple(D((1, 2, 4, 8)) for _ in range(3))
    add(Variant("Attention", "Attention", qkv, opset=23, qdq=True))
    lstm = (D((3, 2, 4)), CT((1, 16, 4)), CT((1, 16, 4)))
    add(Variant("LSTM", "LSTM", lstm, {"hidden_size": 4}))
    add(Variant("GRU", "GRU", (D((3, 2, 4)), CT((1, 12, 4)), CT((1, 12, 4))), {"hidden_size": 4}))
    # Q/DQ themselves: the dtype key is the quantized type.
    qtypes = ("uint8", "uint16", "int8", "int16")
    add(
        Variant(
            "QuantizeLinear", "QuantizeLinear", (D(X, "float32"), C(np.array(0.05, np.float32)), "ZP"), dtypes=qtypes
        )
    )
    add(Variant("DequantizeLinear", "DequantizeLinear", (D(X), C(np.array(0.05, np.float32)), "ZP"), dtypes=qtypes))
    # The com.microsoft forms onnxruntime's quantizer writes for 16-bit types below opset 21 (and keeps when it
    # upgrades the model to 21 itself).
    ms_q = (D(X, "float32"), C(np.array(0.05, np.float32)), "ZP")
    add(Variant("QuantizeLinear_ms", "QuantizeLinear", ms_q, dtypes=qtypes, domain="com.microsoft"))
    ms_dq = (D(X), C(np.array(0.05, np.float32)), "ZP")
    add(Variant("DequantizeLinear_ms", "DequantizeLinear", ms_dq, dtypes=qtypes, domain="com.microsoft"))
    # Rank limits: the same op at rank 6 (float32 only).
    r6 = (1, 2, 1, 2, 1, 3)
    for op in RANK6_OPS:
        name = f"{op}_rank6"
        w = {"rank": [6, 64]}
        if op == "Add":
            add(Variant(name, op, (D(r6), D(r6)), when=w, dtypes=FLOATS))
        elif op == "Transpose":
            add(Variant(name, op, (D(r6),), {"perm": [5, 4, 3, 2, 1, 0]}, when=w, dtypes=FLOATS))
        elif op == "Reshape":
            add(Variant(name, op, (D(r6), C(_i64(2, 3, 1, 1, 1, 1))), when=w, dtypes=FLOATS))
        elif op == "Concat":
            add(Variant(name, op, (D(r6), D(r6)), {"axis": 1}, when=w, dtypes=FLOATS))
        elif op == "ReduceSum":
            add(Variant(name, op, (D(r6), C(_i64(5))), opset=18, when=w, dtypes=FLOATS))
        elif op == "Slice":
            add(Variant(name, op, (D(r6), C(_i64(0)), C(_i64(2)), C(_i64(5))), when=w, dtypes=FLOATS))
        elif op == "Gather":
            add(Variant(name, op, (D(r6), C(_i64(0, 1))), {"axis": 5}, when=w, dtypes=FLOATS))
        else:
            add(Variant(name, op, (D(r6),), when=w, dtypes=FLOATS))
    return v


VARIANTS: list[Variant] = _variants()


def _random(shape: tuple[int, ...], dtype: str, domain: str, rng: np.random.Generator) -> np.ndarray:
    if domain == "idx":
        return rng.integers(0, 2, size=shape).astype(NP[dtype] if dtype != "bool" else np.int64)
    if domain in ("zero", "five", "one"):
        return np.array({"zero": 0, "five": 5, "one": 1}[domain]).astype(NP[dtype])
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in ("int32", "int64", "uint8", "int8", "uint16", "int16"):
        # Distinct values 1..n: no ties (TopK/ArgMax indices stay well defined), no zero divisors.
        n = int(np.prod(shape)) if shape else 1
        return (rng.permutation(n) % 100 + 1).reshape(shape).astype(NP[dtype])
    if domain in ("grid", "gridpos"):
        # k + 0.25 or k + 0.75: exact in float16 and never on a rounding/truncation boundary, so
        # Floor/Round/Cast give the same answer in fp16 (HTP) and fp32 (CPU).
        k = rng.integers(0 if domain == "gridpos" else -4, 4, size=shape)
        return (k + rng.choice([0.25, 0.75], size=shape)).astype(NP[dtype])
    lo, hi = {"pos": (0.5, 2.0), "unit": (-0.9, 0.9), "ge1": (1.1, 3.0), "nz": (0.5, 2.0)}.get(domain, (-2.0, 2.0))
    return rng.uniform(lo, hi, size=shape).astype(NP[dtype])


@dataclasses.dataclass
class Built:
    """A built probe model, the feeds to run it with and (QDQ cases) the class of its quantized weights."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    weights: str | None = None


def build(variant: Variant, dtype: str, seed: int = 0) -> Built | None:
    """Build the single-op model for ``variant`` at ``dtype``; None when it is not valid ONNX.

    A QDQ key (``qdq_uint8``, ``qdq_uint16/w=int8/per_channel``...) quantizes the float32 model with onnxruntime's
    QNN tooling (see :func:`quantize_variant`).
    """
    if dtype.startswith("qdq_"):
        return quantize_variant(variant, dtype, seed)
    rng = np.random.default_rng(seed)
    if variant.op in ("QuantizeLinear", "DequantizeLinear"):
        return _build_qdq_node(variant, dtype, rng)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    graph_inputs: list[onnx.ValueInfoProto] = []
    feeds: dict[str, np.ndarray] = {}
    names: list[str] = []
    for i, spec in enumerate(variant.inputs):
        name = f"in{i}"
        if spec == EMPTY:
            names.append("")
            continue
        if isinstance(spec, D):
            dt = spec.dtype or dtype
            graph_inputs.append(helper.make_tensor_value_info(name, ELEM[dt], spec.shape))
            feeds[name] = _random(spec.shape, dt, spec.domain, rng)
        elif isinstance(spec, CT):
            inits.append(numpy_helper.from_array(_random(spec.shape, dtype, spec.domain, rng), name))
        elif isinstance(spec, C):
            val = spec.value(dtype) if callable(spec.value) else spec.value
            inits.append(numpy_helper.from_array(np.asarray(val), name))
        else:
            raise ValueError(spec)
        names.append(name)
    outs = [f"out{j}" for j in range(variant.n_out)]
    nodes.append(
        helper.make_node(variant.op, names, outs, name="probe", domain=variant.domain, **variant.attrs_for(dtype))
    )
    graph = helper.make_graph(
        nodes, "probe", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs], inits
    )
    return _finish(graph, variant.opset, feeds, variant.domain)


def has_weights(variant: Variant) -> bool:
    """Whether the variant has a constant float input (a weight) whose quantized type is worth probing."""
    return any(isinstance(spec, CT) for spec in variant.inputs)


def qdq_keys(variant: Variant) -> list[str]:
    """The QDQ dtype keys probed for ``variant``: both activation types with the default uint8 weights, and for
    ops with weights every other weight type, per tensor and per channel."""
    keys = list(QDQ_DTYPES)
    if has_weights(variant):
        for act in QDQ_DTYPES:
            for weight in QDQ_WEIGHT_TYPES:
                for per_channel in (False, True):
                    if (weight, per_channel) != (DEFAULT_WEIGHT_TYPE, False):
                        keys.append(f"{act}/w={weight}" + ("/per_channel" if per_channel else ""))
    return keys


def parse_qdq_key(key: str) -> tuple[str, str, bool]:
    """``"qdq_uint16/w=int8/per_channel"`` -> ``("uint16", "int8", True)``; ``"qdq_uint8"`` -> uint8 weights."""
    act, _, rest = key.partition("/")
    weight, per_channel = DEFAULT_WEIGHT_TYPE, False
    if rest:
        parts = rest.split("/")
        weight = parts[0].removeprefix("w=")
        per_channel = "per_channel" in parts[1:]
    return act.removeprefix("qdq_"), weight, per_channel


def weight_class(model: onnx.ModelProto, node_name: str = "probe") -> str | None:
    """The quantized weights a node of a QDQ model reads: the element type of each constant DequantizeLinear
    input other than an int32 bias, with ``/per_channel`` when its scale has more than one element (sorted,
    comma-joined); None when the node has no quantized constant input. qnnx_opcheck computes the same class."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    classes = set()
    for name in node.input:
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        elem = onnx.helper.tensor_dtype_to_np_dtype(inits[dq.input[0]].data_type).name
        if elem == "int32":
            continue
        scale = inits.get(dq.input[1])
        channels = int(np.prod(scale.dims)) if scale is not None else 1
        classes.add(elem + ("/per_channel" if channels > 1 else ""))
    return ",".join(sorted(classes)) or None


def quantize_variant(variant: Variant, key: str, seed: int = 0) -> Built | None:
    """The float32 model of ``variant`` quantized by onnxruntime's QNN tooling as ``key`` asks; None when the
    float model is not valid, the tooling fails, or it does not wrap the op in DequantizeLinear/QuantizeLinear."""
    if variant.op in ("QuantizeLinear", "DequantizeLinear"):
        return None
    float_variant = dataclasses.replace(variant, opset=max(variant.opset, QDQ_OPSET))
    built = build(float_variant, "float32", seed)
    if built is None:
        return None
    result = _quantized(float_variant, built, key, seed, prefix=False)
    if result is None and variant.op in _REMOVABLE_ACTIVATIONS:
        # The tooling quantizes a Relu/Clip only after a quantized op: probe it behind Mul(x, 1).
        result = _quantized(float_variant, built, key, seed, prefix=True)
    return result


def _signed_weight_overrides(
    model: onnx.ModelProto, weight: str, per_channel: bool, qtype: Any
) -> dict[str, list[dict[str, Any]]]:
    """The overrides qnnx-backend gives signed weights (int8, int4): symmetric, and with per_channel a MatMul/Gemm
    weight one scale per output channel (onnxruntime's per_channel alone leaves those per tensor)."""
    if weight not in ("int8", "int4"):
        return {}
    inits = {i.name: i for i in model.graph.initializer}
    overrides: dict[str, list[dict[str, Any]]] = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in inits:
            continue
        override: dict[str, Any] = {"quant_type": qtype, "symmetric": True}
        if per_channel and len(inits[node.input[1]].dims) == 2:
            override["axis"] = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
        overrides[node.input[1]] = [override]
    return overrides


# Activations onnxruntime's quantizer leaves in float unless a quantized op feeds them.
_REMOVABLE_ACTIVATIONS = frozenset({"Relu", "Clip"})


def _with_prefix(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its first graph input passed through Mul(x, 1.0) before the probe op."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    x = m.graph.input[0].name
    for node in m.graph.node:
        node.input[:] = [f"{x}_pre" if i == x else i for i in node.input]
    m.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "pre_one"))
    m.graph.node.insert(0, helper.make_node("Mul", [x, "pre_one"], [f"{x}_pre"], name="pre"))
    return m


def _quantized(variant: Variant, built: Built, key: str, seed: int, *, prefix: bool) -> Built | None:
    import logging
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    act, weight, per_channel = parse_qdq_key(key)
    # Calibration on a few draws of the same input domains (the first is the probe's own feeds).
    samples = [built.feeds] + [b.feeds for k in (1, 2, 3) if (b := build(variant, "float32", seed + k))]
    qtype = {
        "uint8": QuantType.QUInt8,
        "int8": QuantType.QInt8,
        "uint16": QuantType.QUInt16,
        "int16": QuantType.QInt16,
        "int4": QuantType.QInt4,
    }

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the tooling warns about pre-processing on every call
    try:
        with tempfile.TemporaryDirectory(prefix="opcheck-qdq-") as tmp:
            src, out = f"{tmp}/float.onnx", f"{tmp}/qdq.onnx"
            source = _with_prefix(built.model) if prefix else built.model
            onnx.save(source, src)
            config = get_qnn_qdq_config(
                src,
                _Reader(),
                activation_type=qtype[act],
                weight_type=qtype[weight],
                per_channel=per_channel,
                init_overrides=_signed_weight_overrides(source, weight, per_channel, qtype[weight]) or None,
                # A lone Relu/Clip is otherwise dropped into the output range, as after a Conv.
                keep_removable_activations=True,
            )
            # Data-movement ops (Transpose, Reshape, MaxPool...) are quantized only next to quantized neighbours;
            # the probe op has none, and in real QDQ graphs it does.
            config.extra_options["ForceQuantizeNoInputCheck"] = True
            quantize(src, out, config)
            model = onnx.load(out)
    except Exception:
        return None
    finally:
        root.setLevel(level)
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers = {i: n for n in model.graph.node for i in n.input}
    op = next((n for n in model.graph.node if n.name == "probe"), None)
    if op is None:
        return None
    first = producers.get(op.input[0]) if op.input else None
    last = consumers.get(op.output[0])
    float_in = first is not None and first.op_type == "DequantizeLinear"
    if not float_in and variant.op == "Where":  # the condition is bool; the data inputs carry the type
        first = producers.get(op.input[1])
        float_in = first is not None and first.op_type == "DequantizeLinear"
    float_out = built.model.graph.output[0].type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
    if not float_in or (float_out and (last is None or last.op_type != "QuantizeLinear")):
        return None
    return Built(model, built.feeds, weights=weight_class(model))


def _build_qdq_node(variant: Variant, dtype: str, rng: np.random.Generator) -> Built | None:
    """Relu -> QuantizeLinear -> DequantizeLinear -> Sigmoid: a Q/DQ pair inside a float graph.

    A lone Q or DQ between graph input and output is declined by the QNN EP (graph-I/O quantization is
    meant to be offloaded), which says nothing about Q/DQ inside real QDQ models; this form does. Both Q and DQ
    are in the variant's domain (ONNX or com.microsoft).
    """
    zp = np.array(0 if dtype.startswith("int") else 8, NP[dtype])
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(zp, "z")]
    feeds = {"x": rng.uniform(-2, 4, size=X).astype(np.float32)}
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, X)
    dom = variant.domain
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], name="probe_q", domain=dom),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="probe_dq", domain=dom),
        helper.make_node("Sigmoid", ["d"], ["out0"], name="sigmoid"),
    ]
    if dom:
        # ONNX has no schema for com.microsoft ops (no strict inference or full check): type the output directly.
        out = helper.make_tensor_value_info("out0", TensorProto.FLOAT, X)
        graph = helper.make_graph(nodes, "probe", [inp], [out], inits)
        opsets = [helper.make_opsetid("", variant.opset), helper.make_opsetid(dom, 1)]
        return Built(helper.make_model(graph, opset_imports=opsets, ir_version=10), feeds)
    graph = helper.make_graph(nodes, "probe", [inp], [helper.make_empty_tensor_value_info("out0")], inits)
    return _finish(graph, variant.opset, feeds)


def _finish(graph: onnx.GraphProto, opset: int, feeds: dict[str, np.ndarray], domain: str = "") -> Built | None:
    opsets = [helper.make_opsetid("", opset)]
    if domain == "ai.onnx.ml":
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception:  # the op does not accept this dtype / the opset lacks the op
        return None
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    del model.graph.output[:]
    for out in graph.output:
        vi = known.get(out.name)
        if vi is None or not vi.type.tensor_type.elem_type:
            # Function ops (GroupNormalization) have no shape inference: they keep input 0's type and shape.
            first = graph.node[-1].input[0]
            src = {x.name: x for x in graph.input}.get(first)
            if src is None or len(graph.output) != 1:
                return None
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(src)
            vi.name = out.name
        model.graph.output.append(vi)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return None
    return Built(model, feeds)


# Multi-node patterns: hazards that no single-op probe shows. Each builder returns (model, feeds).
def _pattern_gelu_erf(use_mul: bool) -> Built:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    inits = [
        numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(0.70710677, np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    first = (
        helper.make_node("Mul", ["x", "inv_sqrt2"], ["d"])
        if use_mul
        else helper.make_node("Div", ["x", "sqrt2"], ["d"])
    )
    nodes = [
        first,
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["out0"]),
    ]
    g = helper.make_graph(nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [2, 8])], inits)
    rng = np.random.default_rng(0)
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": rng.standard_normal((2, 8)).astype(np.float32)},
    )


def _pattern_add_const_ln(op: str) -> Built:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 64])
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 16, 64)).astype(np.float32), "pos"),
        numpy_helper.from_array(np.ones(64, np.float32), "g"),
        numpy_helper.from_array(np.zeros(64, np.float32), "b"),
    ]
    nodes = [
        helper.make_node(op, ["x", "pos"], ["a"], name="add_const"),
        helper.make_node("LayerNormalization", ["a", "g", "b"], ["out0"], axis=-1, name="ln"),
    ]
    g = helper.make_graph(
        nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [4, 16, 64])], inits
    )
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": rng.standard_normal((4, 16, 64)).astype(np.float32)},
    )


def _pattern_rmsnorm() -> Built:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 32])
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 32).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["w", "n"], ["out0"], name="mul_weight"),
    ]
    g = helper.make_graph(
        nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [2, 8, 32])], inits
    )
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": rng.standard_normal((2, 8, 32)).astype(np.float32)},
    )


def _pattern_rmsnorm_rev() -> Built:
    built = _pattern_rmsnorm()
    last = built.model.graph.node[-1]
    last.input[0], last.input[1] = last.input[1], last.input[0]
    return built


def _pattern_dynamic_dim() -> Built:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["out0"])],
        "p",
        [x],
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, ["batch", 8])],
    )
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": np.ones((2, 8), np.float32)},
    )


def _pattern_dropout_mid() -> Built:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Dropout", ["a"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["out0"]),
    ]
    g = helper.make_graph(nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [2, 8])])
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": np.ones((2, 8), np.float32)},
    )


def _pattern_const_fold_i64() -> Built:
    """Unsqueeze/ConstantOfShape/Range on constants only: ORT folds them before QNN sees them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    inits = [
        numpy_helper.from_array(np.array([2, 3], np.int64), "shp"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array(0, np.int64), "r0"),
        numpy_helper.from_array(np.array(3, np.int64), "r1"),
        numpy_helper.from_array(np.array(1, np.int64), "r2"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["shp", "ax"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Range", ["r0", "r1", "r2"], ["rg"]),
        helper.make_node("Cast", ["rg"], ["rgf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Add", ["a", "rgf"], ["out0"]),
    ]
    g = helper.make_graph(nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [2, 3])], inits)
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": np.ones((2, 3), np.float32)},
    )


def _pattern_qdq_conv_int32_bias() -> Built:
    """The QDQ form ORT's quantizer writes for Conv: uint8 activations/weights, int32 bias, float graph I/O."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    xs, ws = 0.02, 0.01
    w = rng.integers(100, 156, size=(4, 3, 3, 3)).astype(np.uint8)
    inits = [
        numpy_helper.from_array(np.array(xs, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(w, "wq"),
        numpy_helper.from_array(np.array(ws, np.float32), "ws"),
        numpy_helper.from_array(np.array(128, np.uint8), "wz"),
        numpy_helper.from_array(rng.integers(-500, 500, size=(4,)).astype(np.int32), "bq"),
        numpy_helper.from_array(np.array(xs * ws, np.float32), "bs"),
        numpy_helper.from_array(np.array(0, np.int32), "bz"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], name="bias_dq"),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["out0"]),
    ]
    g = helper.make_graph(
        nodes, "p", [x], [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [1, 4, 8, 8])], inits
    )
    return Built(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        {"x": rng.uniform(-2, 2, (1, 3, 8, 8)).astype(np.float32)},
    )


def _pattern_qdq_contrib() -> Built:
    """Gemm at opset 20 quantized a16w8 by onnxruntime's QNN tooling, which then writes com.microsoft Q/DQ."""
    gemm = next(v for v in VARIANTS if v.name == "Gemm")
    variant = dataclasses.replace(gemm, opset=20)
    built = build(variant, "float32")
    quantized = _quantized(variant, built, "qdq_uint16", 0, prefix=False) if built is not None else None
    if quantized is None or not any(n.domain == "com.microsoft" for n in quantized.model.graph.node):
        raise RuntimeError("onnxruntime's quantizer no longer writes com.microsoft Q/DQ at opset 20")
    return quantized


PATTERNS: dict[str, Callable[[], Built]] = {
    "qdq_conv_int32_bias": _pattern_qdq_conv_int32_bias,
    "qdq_contrib_domain": _pattern_qdq_contrib,
    "gelu_erf_div": lambda: _pattern_gelu_erf(False),
    "gelu_erf_mul": lambda: _pattern_gelu_erf(True),
    "add_const1_layernorm": lambda: _pattern_add_const_ln("Add"),
    "mul_const1_layernorm": lambda: _pattern_add_const_ln("Mul"),
    "rmsnorm_mul_weight": _pattern_rmsnorm,
    "rmsnorm_mul_weight_rev": _pattern_rmsnorm_rev,
    "dynamic_dim": _pattern_dynamic_dim,
    "dropout_mid": _pattern_dropout_mid,
    "const_fold_int64": _pattern_const_fold_i64,
}
