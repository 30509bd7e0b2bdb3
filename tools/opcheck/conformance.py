"""Check qnnx-opcheck's HTP verdicts against the live QNN EP on attribute-complete cases.

The probe tables (tools/opcheck/probe.py) were measured with default attributes and constant inputs. This tool
builds the conditions users actually hit, op family by op family: every meaningful attribute value (Resize modes,
coordinate and nearest modes, fractional scales; AveragePool pads, ceil_mode, count_include_pad; ConvTranspose
pads and output_shape; negative indices; select_last_index), constant vs runtime inputs, the opsets the exporters
write (20, 23) and magnitudes near the fp16 range. For each case it asks opcheck for a verdict and runs the model
on QNN HTP (one child process per case, CPU fallback disabled, soc_model set), comparing with ONNX Runtime's CPU EP.

What it reports per case: ``right`` (ran on QNN within fp16 tolerance: 1e-2 of the output's scale, same NaN/inf
positions), ``wrong`` (ran and differs), ``refused`` (the EP declined or failed to build the graph) or ``crash``.
The one result that must never happen is a ``supported`` verdict on a ``wrong`` or ``crash`` case: qnnx would then
put a silently wrong (or fatal) node on the NPU. A ``supported`` verdict on a ``refused`` case costs one failed
session attempt before falling back; an ``unsupported`` verdict on a ``right`` case is coverage left on the table.

Usage (about 4 minutes on the 2-core bench):
    python tools/opcheck/conformance.py                 # all cases, summary on stdout
    python tools/opcheck/conformance.py --only Resize   # cases whose name contains a string (repeatable)
    python tools/opcheck/conformance.py --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-2
F = TensorProto.FLOAT
I64 = TensorProto.INT64


@dataclass
class Case:
    """One model and its feeds."""

    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    fp16_range: bool = False  # values leave fp16's range: a difference is inherent to HTP, documented, not guarded


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 20,
    ml_opset: int | None = None,
) -> Case:
    """A shape-inferred model whose runtime inputs are ``inputs`` (their values are the feeds); ``ml_opset`` also
    imports the ai.onnx.ml domain."""
    elem = {
        np.dtype(np.float32): F,
        np.dtype(np.int64): I64,
        np.dtype(np.int32): TensorProto.INT32,
        np.dtype(np.bool_): TensorProto.BOOL,
    }
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(k, elem[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml_opset)] if ml_opset else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {o.name: o for o in inferred.graph.output}
    del model.graph.output[:]
    model.graph.output.extend(typed[o] for o in outputs)
    model.graph.value_info.extend(inferred.graph.value_info)
    return Case(name, model, dict(inputs))


def _x(shape: tuple[int, ...], scale: float = 1.0, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "align_corners", "asymmetric", "pytorch_half_pixel")
# How the output size relates to the input, each class measured on two input sizes: whole up (x2 on 4 pixels, x3 on
# 5), whole down (/2 on 4, /3 on 6), a scale whose output size is not input x scale (1.7 on 4, 2.3 on 5) and a
# fractional ratio given exactly as sizes (4 -> 6, 5 -> 7). A class is vouched for only if every example is right.
RESIZE_RATIOS = {
    "up": (("scales", 4, 2.0), ("scales", 5, 3.0)),
    "down": (("scales", 4, 0.5), ("scales", 6, 1 / 3)),
    "inexact": (("scales", 4, 1.7), ("scales", 5, 2.3)),
    "frac": (("sizes", 4, 6), ("sizes", 5, 7)),
}


def _declared(case: Case, shape: tuple[int, ...]) -> Case:
    """``case`` with its output ``y`` declared float32 of ``shape`` (a Resize by runtime sizes or scales: shape
    inference cannot compute it, an exporter that traced the sizes writes it)."""
    del case.model.graph.output[:]
    case.model.graph.output.append(helper.make_tensor_value_info("y", F, shape))
    kept = [vi for vi in case.model.graph.value_info if vi.name != "y"]
    del case.model.graph.value_info[:]
    case.model.graph.value_info.extend(kept)
    return case


def _resize_runtime_cases(modes: dict[str, tuple[str | None, ...]]) -> Iterator[Case]:
    """Resize by runtime sizes, and by runtime scales under align_corners, with the output shape declared (the QNN
    EP resizes to that shape): rank 4, the first example of each ratio (up, down, frac; under align_corners also
    scales that are not out / in), classes of their own (``.../runtime_sizes``, ``.../runtime_scales``)."""
    for rank, (mode, nmodes), ctm, ratio in itertools.product(
        (4,), modes.items(), COORDINATE_MODES, ("up", "down", "frac")
    ):
        kind, size, value = RESIZE_RATIOS[ratio][0]
        out = int(value) if kind == "sizes" else int(size * value + 1e-9)
        spatial = rank - 2
        shape, out_shape = (1, 2) + (size,) * spatial, (1, 2) + (out,) * spatial
        for nmode in nmodes:
            attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
            if nmode:
                attrs["nearest_mode"] = nmode
            node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
            feeds = {"x": _x(shape), "sizes": np.array(out_shape, np.int64)}
            name = f"Resize/r{rank}/{mode}{'/' + nmode if nmode else ''}/{ctm}/{ratio}/runtime_sizes"
            yield _declared(_model(name, [node], feeds, ["y"], opset=20), out_shape)
            if ctm != "align_corners" or mode == "cubic":
                continue
            for label, factor in (("scales", out / size), ("inexact_scales", (out + 0.3) / size)):
                node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
                scales = np.array([1.0, 1.0] + [factor] * spatial, np.float32)
                name = f"Resize/r{rank}/{mode}{'/' + nmode if nmode else ''}/{ctm}/{ratio}/runtime_{label}"
                yield _declared(_model(name, [node], {"x": _x(shape), "scales": scales}, ["y"], opset=20), out_shape)


def _resize_cases() -> Iterator[Case]:
    modes: dict[str, tuple[str | None, ...]] = {"nearest": NEAREST_MODES, "linear": (None,), "cubic": (None,)}
    for rank, (mode, nmodes), ctm, ratio in itertools.product(
        (3, 4, 5), modes.items(), COORDINATE_MODES, RESIZE_RATIOS
    ):
        if rank != 4 and mode == "cubic":
            continue
        for nmode in nmodes:
            spatial = rank - 2
            attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
            if nmode:
                attrs["nearest_mode"] = nmode
            for example, (kind, size, value) in enumerate(RESIZE_RATIOS[ratio]):
                shape = (1, 2) + (size,) * spatial
                if kind == "scales":
                    scales = np.array([1.0, 1.0] + [value] * spatial, np.float32)
                    ins, inits = ["x", "", "scales"], {"scales": scales}
                else:
                    ins, inits = ["x", "", "", "sizes"], {"sizes": np.array([1, 2] + [value] * spatial, np.int64)}
                name = f"Resize/r{rank}/{mode}{'/' + nmode if nmode else ''}/{ctm}/{ratio}#{example}"
                node = helper.make_node("Resize", ins, ["y"], **attrs)
                yield _model(name, [node], {"x": _x(shape)}, ["y"], inits, opset=20)
    yield from _resize_runtime_cases(modes)
    for mode in ("nearest", "linear"):
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)
        feeds = {"x": _x((1, 2, 4, 4)), "scales": np.array([1, 1, 2, 2], np.float32)}
        yield _model(f"Resize/r4/{mode}/runtime_scales", [node], feeds, ["y"])
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, antialias=1)
        inits = {"scales": np.array([1, 1, 0.5, 0.5], np.float32)}
        yield _model(f"Resize/r4/{mode}/antialias/down", [node], {"x": _x((1, 2, 8, 8))}, ["y"], inits)


def _pool_cases() -> Iterator[Case]:
    for rank, ceil, cip, pad, kernel, stride in itertools.product((3, 4, 5), (0, 1), (0, 1), (0, 1), (2, 3), (1, 2)):
        spatial = rank - 2
        if pad >= kernel:
            continue
        attrs = {
            "kernel_shape": [kernel] * spatial,
            "strides": [stride] * spatial,
            "pads": [pad] * (2 * spatial),
            "ceil_mode": ceil,
            "count_include_pad": cip,
        }
        name = f"AveragePool/r{rank}/k{kernel}s{stride}p{pad}/ceil{ceil}/cip{cip}"
        node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
        yield _model(name, [node], {"x": _x((1, 2) + (7,) * spatial)}, ["y"])
    for rank, ceil in itertools.product((4,), (0, 1)):
        node = helper.make_node(
            "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=ceil
        )
        yield _model(f"MaxPool/r{rank}/k3s2p1/ceil{ceil}", [node], {"x": _x((1, 2, 7, 7))}, ["y"])


def _conv_transpose_cases() -> Iterator[Case]:
    w = _x((2, 3, 3, 3), seed=1)
    variants: dict[str, dict[str, Any]] = {
        "plain": {},
        "pads1": {"pads": [1, 1, 1, 1]},
        "stride2": {"strides": [2, 2]},
        "stride2_pads1_outpad1": {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
        "stride2_output_shape": {"strides": [2, 2], "output_shape": [10, 10]},
        "dilation2": {"dilations": [2, 2]},
    }
    for label, attrs in variants.items():
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], **attrs)
        yield _model(f"ConvTranspose/{label}", [node], {"x": _x((1, 2, 5, 5))}, ["y"], {"w": w})


def _index_cases() -> Iterator[Case]:
    x = _x((3, 4))
    for sign, const in itertools.product(("pos", "neg"), (True, False)):
        idx = np.array([[0, 2, 1, 3], [2, 0, 3, 1]], np.int64)
        if sign == "neg":
            idx = idx - 4
        where = "const" if const else "runtime"
        inits, feeds = ({"i": idx}, {"x": x}) if const else ({}, {"x": x, "i": idx})
        node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
        yield _model(f"GatherElements/{sign}/{where}", [node], feeds, ["y"], inits)
        upd = _x((2, 4), seed=2)
        node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)
        yield _model(f"ScatterElements/{sign}/{where}", [node], feeds, ["y"], {**inits, "u": upd})
        gidx = np.array([0, 2], np.int64) - (3 if sign == "neg" else 0)
        inits_g, feeds_g = ({"i": gidx}, {"x": x}) if const else ({}, {"x": x, "i": gidx})
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
        yield _model(f"Gather/{sign}/{where}", [node], feeds_g, ["y"], inits_g)


def _magnitude_cases() -> Iterator[Case]:
    for op, scale in itertools.product(("Softmax", "LogSoftmax"), (1.0, 100.0, 3e4, 1e5)):
        node = helper.make_node(op, ["x"], ["y"], axis=-1)
        case = _model(f"{op}/scale{scale:g}", [node], {"x": _x((2, 16), scale)}, ["y"])
        case.fp16_range = scale > 65504
        yield case
    for op in ("ReduceSum", "ReduceMean"):
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
        yield _model(f"{op}/scale3e4", [node], {"x": _x((2, 64), 3e4)}, ["y"], {"axes": np.array([-1], np.int64)})
    for op in ("Exp", "Mul"):
        ins = ["x"] if op == "Exp" else ["x", "x"]
        node = helper.make_node(op, ins, ["y"])
        case = _model(f"{op}/overflow_fp16", [node], {"x": _x((2, 8), 20.0 if op == "Exp" else 400.0)}, ["y"])
        case.fp16_range = True
        yield case


def _misc_cases() -> Iterator[Case]:
    x = _x((2, 3, 4, 4))
    nan = x.copy()
    nan[0, 0, 0, :2] = np.nan
    yield _model("IsNaN", [helper.make_node("IsNaN", ["x"], ["y"])], {"x": nan}, ["y"])
    yield _model("IsInf", [helper.make_node("IsInf", ["x"], ["y"])], {"x": x * 1e5}, ["y"])
    yield _model("SpaceToDepth", [helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], {"x": x}, ["y"])
    yield _model(
        "DepthToSpace/DCR",
        [helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)],
        {"x": _x((1, 8, 2, 2))},
        ["y"],
    )
    yield _model(
        "DepthToSpace/CRD",
        [helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")],
        {"x": _x((1, 8, 2, 2))},
        ["y"],
    )
    grid = (np.random.default_rng(3).uniform(-1, 1, (2, 3, 3, 2))).astype(np.float32)
    for mode, align in itertools.product(("bilinear", "nearest"), (0, 1)):
        node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, align_corners=align)
        yield _model(f"GridSample/{mode}/align{align}", [node], {"x": x, "g": grid}, ["y"])
    for op, last in itertools.product(("ArgMax", "ArgMin"), (0, 1)):
        ties = np.array([[1, 3, 3, 0], [2, 2, 1, 0]], np.float32)
        node = helper.make_node(op, ["x"], ["y"], axis=1, select_last_index=last)
        yield _model(f"{op}/select_last_index{last}", [node], {"x": ties}, ["y"])
    w = np.ones(8, np.float32)
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1)
    yield _model("RMSNormalization/opset23/scale400", [node], {"x": _x((2, 8), 400.0)}, ["y"], {"w": w}, opset=23)
    q, k, v = _x((1, 2, 4, 8), seed=4), _x((1, 2, 4, 8), seed=5), _x((1, 2, 4, 8), seed=6)
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    yield _model("Attention/opset23", [node], {"q": q, "k": k, "v": v}, ["y"], opset=23)


def _runtime_input_cases() -> Iterator[Case]:
    x = _x((4, 6))
    specs: list[tuple[str, str, list[str], dict[str, np.ndarray], dict[str, Any]]] = [
        (
            "Slice",
            "Slice",
            ["x", "s", "e", "a"],
            {"s": np.array([1], np.int64), "e": np.array([3], np.int64), "a": np.array([1], np.int64)},
            {},
        ),
        ("Tile", "Tile", ["x", "r"], {"r": np.array([2, 1], np.int64)}, {}),
        ("TopK", "TopK", ["x", "k"], {"k": np.array([2], np.int64)}, {}),
        ("Split", "Split", ["x", "s"], {"s": np.array([2, 4], np.int64)}, {"axis": 1}),
        ("ReduceSum", "ReduceSum", ["x", "a"], {"a": np.array([1], np.int64)}, {"keepdims": 1}),
        ("Expand", "Expand", ["v", "shape"], {"shape": np.array([4, 6], np.int64)}, {}),
    ]
    for label, op, ins, consts, attrs in specs:
        outs = ["y", "z"] if op in ("TopK", "Split") else ["y"]
        base = {"x": x} if ins[0] == "x" else {"v": _x((1, 6))}
        node = helper.make_node(op, ins, outs, **attrs)
        yield _model(f"{label}/const_inputs", [node], base, outs, consts)
        yield _model(f"{label}/runtime_inputs", [node], {**base, **consts}, outs)


# Shapes per rank for the shape-class cases: unit dims first, last and inside, odd sizes, batch > 1.
RANK_SHAPES = {
    1: ((16,), (1,), (7,)),
    2: ((1, 16), (16, 64), (7, 3), (5, 1)),
    3: ((1, 16, 64), (16, 4, 16), (4, 16, 16), (2, 3, 16), (1, 64, 16)),
    4: ((1, 16, 4, 16), (2, 16, 4, 16), (1, 16, 1, 16), (1, 1, 16, 16), (2, 3, 4, 5)),
    5: ((1, 2, 3, 4, 16), (2, 1, 3, 1, 5), (2, 3, 4, 5, 6)),
}
# RMSNormalization at rank 3-4 with every dim before the normalized axis <= 8 (qnnx_opcheck._conditions): unit dims
# first, inside and last, leading dims of 8, odd sizes, normalized axes of 1 to 100. Wrong shapes all had a leading
# dim of 15 or more ([2, 16, 16], [16, 1, 16], [15, 1, 16], [1, 16, 1, 16]); [2, 15, 16] and [1, 64, 16] were right.
RMS_SHORT_LEADING = (
    (1, 1, 16), (1, 8, 16), (8, 1, 16), (8, 8, 16), (8, 8, 64), (2, 3, 5), (2, 3, 1), (5, 7, 3), (7, 8, 100),
    (3, 5, 32), (8, 2, 7), (4, 4, 8), (6, 1, 16), (1, 7, 2), (8, 3, 3), (2, 8, 32), (4, 2, 100), (8, 8, 1),
    (1, 1, 1, 16), (2, 3, 4, 5), (1, 8, 8, 16), (8, 8, 8, 8), (8, 1, 8, 64), (1, 4, 1, 16), (3, 1, 2, 100),
    (6, 5, 8, 7), (2, 6, 1, 64), (7, 7, 4, 32), (5, 2, 7, 3), (2, 2, 4, 32), (1, 1, 8, 16), (4, 7, 8, 32),
)  # fmt: skip
# One-input ops measured at every rank (the op tables' probes used one default shape).
RANK_UNARY = {"Softplus": 1.0, "Neg": 1.0, "Log": None, "Sqrt": None, "Exp": 1.0, "Reciprocal": None, "Abs": 1.0}


def _shape_class_cases() -> Iterator[Case]:
    """The classes of rank, unit dims and axis size behind the ops whose outcome depends on them: RMSNormalization
    over the last axis, one-input elementwise ops, Softmax/LogSoftmax over a unit axis, Div by a constant zero."""
    for rank, shapes in RANK_SHAPES.items():
        for i, shape in enumerate(shapes):
            w = (1 + 0.5 * np.random.default_rng(i).standard_normal(shape[-1])).astype(np.float32)
            node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-6)
            yield _model(f"RMSNormalization/r{rank}#{i}", [node], {"x": _x(shape, 3.0, seed=i)}, ["y"], {"w": w}, 23)
            for op, scale in RANK_UNARY.items():
                x = _x(shape, 1.0, seed=i) if scale else np.abs(_x(shape, 1.0, seed=i)) + 0.5
                yield _model(f"{op}/r{rank}#{i}", [helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"])
            for op in ("Softmax", "LogSoftmax"):
                for axis in {-1, 0, rank - 1, rank // 2}:
                    kind = "unit_axis" if shape[axis] == 1 else "axis"
                    node = helper.make_node(op, ["x"], ["y"], axis=axis)
                    yield _model(f"{op}/r{rank}/{kind}/axis{axis}#{i}", [node], {"x": _x(shape, 2.0, seed=i)}, ["y"])
    for i, shape in enumerate(RMS_SHORT_LEADING):
        w = (1 + 0.5 * np.random.default_rng(i).standard_normal(shape[-1])).astype(np.float32)
        node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-6)
        name = f"RMSNormalization/leading<=8/{'x'.join(map(str, shape))}"
        yield _model(name, [node], {"x": _x(shape, 3.0, seed=i)}, ["y"], {"w": w}, 23)
    for op in ("Softmax", "LogSoftmax"):
        for shape, axis in (((4, 1), 1), ((4, 1, 5), 1), ((2, 1, 3, 5), 1), ((2, 3, 1), -1), ((1, 4), 0)):
            node = helper.make_node(op, ["x"], ["y"], axis=axis)
            yield _model(f"{op}/unit_axis/{'x'.join(map(str, shape))}", [node], {"x": _x(shape, 2.0)}, ["y"])
    x = _x((4, 5))
    for label, divisor in (
        ("const_zero", np.zeros((1, 5), np.float32)),
        ("const_zero/partly", np.array([[1.0, 0.0, 2.0, -1.0, 3.0]], np.float32)),
        ("const", np.array([[1.0, 0.5, 2.0, -1.0, 3.0]], np.float32)),
    ):
        yield _model(f"Div/{label}", [helper.make_node("Div", ["x", "d"], ["y"])], {"x": x}, ["y"], {"d": divisor})
    node = helper.make_node("Div", ["x", "d"], ["y"])
    yield _model("Div/runtime", [node], {"x": x, "d": np.abs(_x((4, 5), seed=2)) + 0.5}, ["y"])
    # torch.var over one element (correction 1): the mean of squared deviations divided by N - 1 = 0.
    inits = {"axes": np.array([1], np.int64), "zero": np.array(0.0, np.float32)}
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["v"], keepdims=1),
        helper.make_node("Div", ["v", "zero"], ["y"]),
    ]
    yield _model("Div/const_zero/var_of_one", nodes, {"x": _x((4, 1, 5))}, ["y"], inits)


# ai.onnx.ml's ArrayFeatureExtractor (it picks indices along the last axis): each rank with and without unit dims
# before the last axis, one index, several (unordered, repeated, more than the axis holds), negative ones (counted
# from the end, which onnxruntime's CPU kernel refuses), a last axis of one element, scalar and 2-D indices (ranks
# 2-4); constant and runtime indices; float32 everywhere, int32 and int64 on the first shape of each rank.
AFE_SHAPES = {
    1: ((5,),),
    2: ((3, 5), (1, 5)),
    3: ((2, 3, 5), (2, 1, 5)),
    4: ((2, 2, 3, 5), (1, 2, 1, 5)),
    5: ((1, 2, 2, 3, 5), (2, 1, 2, 1, 5)),
}
AFE_INDICES = {"one": (3,), "several": (4, 0, 2, 2, 1, 4, 3), "negative": (-1, 0, -5, 2)}


def _afe_case(name: str, x: np.ndarray, idx: tuple[int, ...] | np.ndarray, runtime: bool) -> Case:
    y = np.asarray(idx, np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "y"], ["z"], domain="ai.onnx.ml")
    feeds, inits = ({"x": x, "y": y}, {}) if runtime else ({"x": x}, {"y": y})
    return _model(name, [node], feeds, ["z"], inits, opset=20, ml_opset=1)


def _array_feature_extractor_cases() -> Iterator[Case]:
    for (rank, shapes), where in itertools.product(AFE_SHAPES.items(), ("const", "runtime")):
        for i, shape in enumerate(shapes):
            for label, idx in AFE_INDICES.items():
                x = _x(shape, 2.0, seed=i)
                yield _afe_case(f"ArrayFeatureExtractor/r{rank}/{where}/{label}#{i}", x, idx, where == "runtime")
            if i == 0:
                for dtype in (np.int32, np.int64):
                    x = np.random.default_rng(rank).integers(-100, 100, shape).astype(dtype)
                    name = f"ArrayFeatureExtractor/r{rank}/{where}/several/{np.dtype(dtype).name}"
                    yield _afe_case(name, x, AFE_INDICES["several"], where == "runtime")
        for index_shape in ((), (2, 2)) if rank in (2, 3, 4) else ():
            idx = np.array((3, 0, 4, 4)[: int(np.prod(index_shape))], np.int64).reshape(index_shape)
            name = f"ArrayFeatureExtractor/r{rank}/{where}/indices_r{len(index_shape)}"
            yield _afe_case(name, _x(shapes[0], 2.0), idx, where == "runtime")
        for shape in ((3, 1), (2, 3, 1)) if rank == 2 else ():
            for idx in ((0,), (0, 0, 0)):
                name = f"ArrayFeatureExtractor/unit_last/{where}/{'x'.join(map(str, shape))}/{len(idx)}"
                yield _afe_case(name, _x(shape, 2.0), idx, where == "runtime")


def all_cases() -> list[Case]:
    """Every case, in a stable order."""
    out: list[Case] = []
    for gen in (
        _resize_cases,
        _pool_cases,
        _conv_transpose_cases,
        _index_cases,
        _magnitude_cases,
        _misc_cases,
        _shape_class_cases,
        _array_feature_extractor_cases,
    ):
        out.extend(gen())
    out.extend(_runtime_input_cases())
    return out


# --------------------------------------------------------------------------------------------- running


def _child(path: str, out_path: str, soc_model: str) -> None:
    """Run one case (saved by the parent) on QNN HTP and the CPU EP; write the outcome as JSON."""
    sys.path.insert(0, str(HERE))
    import onnxruntime as ort
    import onnxruntime_qnn as oq
    import probe

    blob = np.load(path + ".npz")
    feeds = {k: blob[k] for k in blob.files}
    data = Path(path).read_bytes()
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    try:
        ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # no reference: the case says nothing
        Path(out_path).write_text(json.dumps({"outcome": "no_reference", "error": str(exc)[-200:]}))
        return
    log = tempfile.mktemp(prefix="qnnx-conf-", suffix=".log")
    saved = probe._quiet_fds(log)
    try:
        try:
            session = probe._session(ort, oq, data, soc_model, fallback=False, severity=3)
            got = session.run(None, feeds)
        except Exception as exc:  # any refusal of the EP is an outcome
            result = {"outcome": "refused", "error": str(exc).strip().splitlines()[0][-200:] if str(exc) else ""}
        else:
            err = probe._compare(got, ref)
            result = {"outcome": "right" if err <= TOLERANCE else "wrong", "err": err}
    finally:
        probe._restore_fds(saved)
        os.unlink(log)
    Path(out_path).write_text(json.dumps(result))


def run_case(case: Case, soc_model: str, timeout: float) -> dict[str, Any]:
    """Run ``case`` in a child process; a signal or a hang is the outcome ``crash``."""
    folder = tempfile.mkdtemp(prefix="qnnx-conf-")
    path = os.path.join(folder, "model.onnx")
    out = os.path.join(folder, "out.json")
    Path(path).write_bytes(case.model.SerializeToString())
    np.savez(path + ".npz", **case.feeds)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path, out, "--soc-model", soc_model]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        if proc.returncode < 0:
            result: dict[str, Any] = {"outcome": "crash", "rc": proc.returncode}
        elif not os.path.exists(out):
            result = {"outcome": "probe_error", "error": proc.stderr.decode(errors="replace")[-300:]}
        else:
            result = json.loads(Path(out).read_text())
    except subprocess.TimeoutExpired:
        result = {"outcome": "crash", "rc": "timeout"}
    for name in (path, path + ".npz", out):
        if os.path.exists(name):
            os.unlink(name)
    os.rmdir(folder)
    return result


def verdict(case: Case, onnxruntime_qnn: str | None, soc_model: int) -> tuple[bool, str]:
    """opcheck's HTP verdict on the case: (supported, first reason)."""
    import qnnx_opcheck

    try:
        report = qnnx_opcheck.check_model(case.model, "htp", onnxruntime_qnn=onnxruntime_qnn, soc_model=soc_model)
    except qnnx_opcheck.errors.QnnxOpcheckError as exc:
        return False, f"opcheck error: {exc}"
    reason = next((f"{v.op_type}: {v.kind}" for v in report.unsupported), "")
    return report.supported, reason


def classify(supported: bool, outcome: str) -> str:
    """The agreement class of one case."""
    if outcome in ("no_reference", "probe_error"):
        return "not_measured"
    if supported:
        return {"right": "agree", "refused": "supported_but_refused"}.get(outcome, f"supported_but_{outcome}")
    return "unsupported_but_right" if outcome == "right" else "agree"


def _keys(case: Case) -> list[str]:
    """The condition classes a case measures (none when its values leave fp16's range: that difference is what HTP
    is, not a condition of the op)."""
    from qnnx_opcheck._check import condition_keys

    if case.fp16_range:
        return []
    try:
        return sorted(set(condition_keys(case.model).values()))
    except Exception:  # a model opcheck cannot read has no condition class
        return []


def _rekey(soc_model: str) -> int:
    from importlib import metadata

    out = HERE / "data" / f"conformance-htp-{metadata.version('onnxruntime-qnn')}-soc{soc_model}.json"
    record = json.loads(out.read_text())
    cases = {c.name: c for c in all_cases()}
    for row in record["cases"]:
        case = cases.get(row["case"])
        if case is not None:
            row["keys"] = _keys(case)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"rewrote the condition classes of {out.relative_to(HERE.parent.parent)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only cases whose name contains this string; repeatable (with --record, the other recorded cases "
        "are kept)",
    )
    parser.add_argument("--soc-model", default="60")
    parser.add_argument("--onnxruntime-qnn", default=None, help="table release to check (default: installed)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--json", type=Path, default=None, help="write every case's result here")
    parser.add_argument(
        "--record",
        action="store_true",
        help="also write tools/opcheck/data/conformance-htp-<onnxruntime-qnn>-soc<N>.json, the measured "
        "conditions tools/opcheck/tables.py builds the tables' measured_conditions from",
    )
    parser.add_argument(
        "--rekey",
        action="store_true",
        help="recompute the condition classes of the recorded cases (after a change of qnnx-opcheck's classes) "
        "without running them, and rewrite the record",
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.soc_model)
        return 0
    if args.rekey:
        return _rekey(args.soc_model)
    cases = [c for c in all_cases() if not args.only or any(part in c.name for part in args.only)]
    rows = []
    counts: dict[str, int] = {}
    for n, case in enumerate(cases, 1):
        t0 = time.monotonic()
        supported, reason = verdict(case, args.onnxruntime_qnn, int(args.soc_model))
        result = run_case(case, args.soc_model, args.timeout)
        klass = classify(supported, result["outcome"])
        if case.fp16_range and klass == "supported_but_wrong":
            klass = "fp16_range"
        counts[klass] = counts.get(klass, 0) + 1
        keys = _keys(case)
        row = {"case": case.name, "keys": keys, "supported": supported, "reason": reason, "class": klass, **result}
        rows.append(row)
        err = f" err={result['err']:.3g}" if isinstance(result.get("err"), float) else ""
        print(
            f"[{n}/{len(cases)}] {case.name}: opcheck {'supported' if supported else 'unsupported'}, "
            f"QNN {result['outcome']}{err} -> {klass} ({time.monotonic() - t0:.1f} s)",
            flush=True,
        )
    print("summary:", json.dumps(dict(sorted(counts.items()))))
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "cases": rows}, indent=1) + "\n")
    if args.record:
        from importlib import metadata

        version = metadata.version("onnxruntime-qnn")
        out = HERE / "data" / f"conformance-htp-{version}-soc{args.soc_model}.json"
        meta = {
            "onnxruntime_qnn": version,
            "onnxruntime": metadata.version("onnxruntime"),
            "soc_model": int(args.soc_model),
            "date": time.strftime("%Y-%m-%d"),
            "tolerance": TOLERANCE,
        }
        slim = [{k: r[k] for k in ("case", "keys", "outcome", "err") if k in r} for r in rows]
        if args.only and out.exists():
            # A partial run replaces the cases it ran and keeps the others of the record.
            ran = {r["case"] for r in slim}
            kept = [r for r in json.loads(out.read_text())["cases"] if r["case"] not in ran]
            slim = kept + slim
        out.write_text(json.dumps({"provenance": meta, "cases": slim}, indent=1) + "\n")
        print(f"wrote {out.relative_to(HERE.parent.parent)}")
    bad = [r for r in rows if r["class"] in ("supported_but_wrong", "supported_but_crash")]
    for r in bad:
        print(f"SUPPORTED BUT {r['outcome'].upper()}: {r['case']} ({r.get('err', r.get('rc'))})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
