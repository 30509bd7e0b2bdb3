"""opcheck against ONNX's node tests: the node conditions measured there, the sweep tool's comparison and classes,
and a handful of cases on the live simulator (the full sweep is `python tools/opcheck/node_tests.py --record`)."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper

import qnnx_opcheck as oc

TOOLS = Path(__file__).resolve().parents[3] / "tools" / "opcheck"


@functools.cache
def _tool(name: str) -> ModuleType:
    """A module of tools/opcheck, loaded from its file (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"opcheck_tool_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _one(op: str, inputs: list[tuple[str, int, list[int]]], inits=(), opset: int = 20, out: int = 1, **attrs):
    node = helper.make_node(op, [n for n, _, _ in inputs] + [i.name for i in inits], ["y0"])
    for k, v in attrs.items():
        node.attribute.append(helper.make_attribute(k, v))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y0", out, None)],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _verdict(model) -> oc.NodeVerdict:
    return oc.check_model(model, "htp", onnxruntime_qnn="2.7.0", soc_model=60).verdicts[0]


F = TensorProto.FLOAT


def test_reduce_with_runtime_axes_is_refused() -> None:
    """ReduceSum whose axes are a graph input is refused (the QNN EP takes constant axes only); constant axes pass."""
    runtime = _one("ReduceSum", [("x", F, [2, 3]), ("a", TensorProto.INT64, [1])])
    assert _verdict(runtime).status == "unsupported" and "axes" in (_verdict(runtime).reason or "")
    axes = numpy_helper.from_array(np.array([1], np.int64), "a")
    assert _verdict(_one("ReduceSum", [("x", F, [2, 3])], inits=[axes])).status == "supported"


@pytest.mark.parametrize(
    ("op", "attrs", "kind"),
    [
        ("ArgMax", {"select_last_index": 1}, "rejected"),
        ("SpaceToDepth", {"blocksize": 2, "mode": "CRD"}, "wrong_result"),
    ],
)
def test_attribute_conditions_refuse(op: str, attrs: dict, kind: str) -> None:
    """Attribute values measured refused or wrong on QNN HTP are refused with that kind, naming the op."""
    out = TensorProto.INT64 if op == "ArgMax" else F
    model = _one(op, [("x", F, [1, 4, 4, 4])], opset=25 if op == "SpaceToDepth" else 20, out=out, **attrs)
    v = _verdict(model)
    assert (v.status, v.kind) == ("unsupported", kind) and (v.reason or "").startswith(op)


def test_convtranspose_with_output_padding_is_wrong() -> None:
    """ConvTranspose with output_padding is refused as wrong: with strides that differ between axes (the node tests),
    and with equal strides too (kernel 4 at stride 2 without pads came back 0.16 of the scale off); without
    output_padding it passes."""
    w = numpy_helper.from_array(np.ones((1, 2, 3, 3), np.float32), "w")
    uneven = _one("ConvTranspose", [("x", F, [1, 1, 3, 3])], inits=[w], strides=[3, 2], output_padding=[1, 1])
    assert _verdict(uneven).kind == "wrong_result"
    even = _one("ConvTranspose", [("x", F, [1, 1, 3, 3])], inits=[w], strides=[2, 2], output_padding=[1, 1])
    assert _verdict(even).kind == "wrong_result"
    plain = _one("ConvTranspose", [("x", F, [1, 1, 3, 3])], inits=[w], strides=[2, 2])
    assert _verdict(plain).status == "supported"


def test_type_outside_tables_is_refused() -> None:
    """A Cast from a float8 input is refused as an unlisted dtype, not accepted for want of a known dtype."""
    model = _one(
        "Cast", [("x", TensorProto.FLOAT8E5M2, [2, 3])], out=TensorProto.FLOAT16, to=TensorProto.FLOAT16, opset=21
    )
    v = _verdict(model)
    assert v.kind == "unlisted_dtype" and "float8e5m2" in (v.reason or "")


def test_folded_minus_inf_reaching_an_output_is_refused() -> None:
    """A -inf built by a node ORT folds (Where of constants) and added into a graph output is refused: HTP would
    hold -65504 there."""
    nodes = [
        helper.make_node("Where", ["c", "ninf", "zero"], ["mask"]),
        helper.make_node("Add", ["x", "mask"], ["y0"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([True, False]), "c"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y0", F, None)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    add = oc.check_model(model, "htp", onnxruntime_qnn="2.7.0", soc_model=60).verdicts[1]
    assert add.op_type == "Add" and add.kind == "wrong_result"


floats = hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=5), elements=st.floats(-1e4, 1e4, width=32))


@given(floats)
def test_tolerance_accepts_fp16_rounding(x: np.ndarray) -> None:
    """An output equal to the expected one rounded to fp16 is within tolerance."""
    batch = _tool("batch")
    assert batch.within_tolerance(x.astype(np.float16).astype(np.float32), x)[0]


@given(floats.filter(lambda a: a.size > 0), st.floats(0.05, 10))
def test_tolerance_rejects_a_shift_beyond_the_scale(x: np.ndarray, k: float) -> None:
    """An output off by more than 1e-2 of the scale plus the floor is not within tolerance; NaN positions must
    match."""
    batch = _tool("batch")
    shift = k * (float(np.abs(x).max()) + 1.0)
    assert not batch.within_tolerance(x + np.float32(shift), x)[0]
    y = x.copy()
    y.flat[0] = np.nan
    assert not batch.within_tolerance(x, y)[0] and batch.within_tolerance(y, y)[0]


def test_classes() -> None:
    """A supported case is agreement only when it ran right; an unsupported case only when it did not; wrong cases
    explained by fp16 inputs or non-finite inputs get their own classes."""
    nt = _tool("node_tests")
    assert nt.classify(True, "right") == "agree"
    assert nt.classify(True, "wrong") == "supported_but_wrong"
    assert nt.classify(True, "crash") == "supported_but_crash"
    assert nt.classify(False, "right") == "unsupported_but_right"
    assert nt.classify(False, "refused") == "agree"
    assert nt.classify(True, "wrong", {"fp16_inputs": True}) == "fp16_inherent"
    assert nt.classify(True, "wrong", {"nonfinite_inputs": True}) == "nonfinite_input"
    assert nt.classify(False, "wrong", {"fp16_inputs": True}) == "agree"


def test_record_has_no_wrong_acceptance() -> None:
    """The recorded full sweep has no case opcheck supports and QNN computes wrongly or crashes on."""
    record = json.loads(next(TOOLS.glob("data/node-tests-htp-*-soc60.json")).read_text())
    assert record["summary"]["cases"] == len(record["cases"]) > 1000
    assert not [r["case"] for r in record["cases"] if r["class"] in ("supported_but_wrong", "supported_but_crash")]


def test_live_handful(tmp_path: Path) -> None:
    """A handful of node tests on the simulator: each opcheck verdict agrees with what QNN HTP does."""
    pytest.importorskip("onnxruntime_qnn")
    out = tmp_path / "rows.json"
    names = ["test_abs", "test_reduce_sum_do_not_keepdims_random", "test_argmax_default_axis_example_select_last_index"]
    cmd = [sys.executable, str(TOOLS / "node_tests.py"), "--json", str(out)]
    for name in names:
        cmd += ["--only", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["cases"]}
    assert rows["test_abs"]["outcome"] == "right" and rows["test_abs"]["supported"]
    assert all(r["class"] == "agree" for r in rows.values()), rows
