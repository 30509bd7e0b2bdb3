"""Every rewrite pass, run in the exporter's order over ONNX's own node test models (about 1,900 single-op graphs of
every operator, attribute and optional input), keeps what each model computes on ONNX Runtime's CPU EP, and raises
nothing but its own refusal (``PostconditionError``, which makes the export fail and the graph run in PyTorch).

The passes are written for qnnx-export's graphs; these models hold what other exporters write too: nodes without
inputs, empty optional inputs, sequences, every dtype. A pass that reads such a node wrongly either crashes the
export (the graph then runs in PyTorch for no reason) or, worse, changes a result."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from export_qnn_helpers import cpu_session
from onnx import helper, version_converter

from qnnx_export._passes import DEFAULT_PASSES, run_passes

SHARDS = 8
_INT32 = np.iinfo(np.int32)


def _cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own numpy overflow warnings
        return sorted(collect_testcases(None), key=lambda c: c.name)


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, list) or isinstance(got, list):  # sequence outputs
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind in "fc":  # the same non-finite values; elsewhere within 1e-5 of the output's largest value
        got, want = got.astype(np.complex128), want.astype(np.complex128)
        finite = np.isfinite(want)
        if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(
            got[~finite], want[~finite], equal_nan=True
        ):
            return False
        scale = float(np.abs(want[finite]).max(initial=0.0))
        return float(np.abs(got[finite] - want[finite]).max(initial=0.0)) <= 1e-5 * scale
    if want.dtype.kind in "iub":  # int64 results may come back int32 (int64_to_int32): compare the values
        return bool(np.array_equal(got.astype(np.int64), want.astype(np.int64)))
    return bool(np.array_equal(got, want))


def _feeds_for(model: onnx.ModelProto, feeds: dict[str, Any]) -> dict[str, Any] | None:
    """``feeds`` in the input dtypes of the rewritten ``model`` (int64 inputs become int32); None when a value does
    not fit, where the backend's signature raises before any run."""
    out: dict[str, Any] = {}
    for inp in model.graph.input:
        value = feeds[inp.name]
        if inp.type.HasField("tensor_type") and isinstance(value, np.ndarray):
            dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
            narrowed = dtype == np.int32 and value.dtype == np.int64 and value.size
            if narrowed and (value.min() < _INT32.min or value.max() > _INT32.max):
                return None
            value = value.astype(dtype)
        out[inp.name] = value
    return out


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_passes_keep_what_onnxs_node_test_models_compute(shard: int) -> None:
    """Each node test model that ONNX Runtime's CPU EP runs (converted to opset 21 where older, as qnnx-export writes
    opset 20-21) gives the same outputs after every pass: floats within 1e-5 of the output's largest value (a
    rewrite may round differently in float32; HTP computes in float16), the same NaN and infinity positions, and
    integers and bools exactly."""
    checked = 0
    differ: list[str] = []
    for case in _cases()[shard::SHARDS]:
        model = case.model
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        initialized = {i.name for i in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in initialized]
        inputs = case.data_sets[0][0]
        if len(names) != len(inputs):
            continue
        feeds = dict(zip(names, inputs, strict=True))
        try:
            if opset < 20:
                model = version_converter.convert_version(model, 21)
            want = cpu_session(model.SerializeToString()).run(None, feeds)
        except Exception:  # a model the converter or the CPU EP does not take says nothing here
            continue
        rewritten = ir.serde.deserialize_model(model)
        try:
            run_passes(rewritten, DEFAULT_PASSES)
        except ir.passes.PostconditionError:
            continue  # a pass refusing the graph: the export fails and the graph runs in PyTorch
        proto = ir.to_proto(rewritten)
        fed = _feeds_for(proto, feeds)
        if fed is None:
            continue
        got = cpu_session(proto.SerializeToString()).run(None, fed)
        checked += 1
        if not (len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))):
            differ.append(case.name)
    assert checked >= 150, checked  # about 185 of the ~235 models of a shard run on the CPU EP
    assert not differ, differ
